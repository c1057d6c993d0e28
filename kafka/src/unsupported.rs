//! Answers to requests the listener does not serve: an API that ApiVersions does not
//! announce, or a version of a served API outside the announced range. Each is answered
//! with `UNSUPPORTED_VERSION` (35) where the response has an error code — at the top, or
//! for every entity the request names (topic partition, group, ACL, resource …) — so the
//! client is told why and the connection stays open, as the issue asks ("never a dropped
//! connection").
//!
//! What is still closed: an API key the codec does not know, a version outside the
//! codec's range (such as Produce 0–2, which Kafka 4 removed, KIP-896), and the few APIs
//! only brokers and controllers send each other whose responses name entities by topic
//! id (WriteTxnMarkers, the share-group state APIs, ShareGroupDescribe,
//! DescribeShareGroupOffsets). Kafka closes the connection for these too: its
//! `RequestChannel` refuses an API its listener does not enable.
//!
//! A client that asked ApiVersions first never sends any of these (librdkafka and the Java
//! client check the announced ranges before sending): this is for hand-made clients, and so
//! that a probe is answered rather than cut.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{self as m, ApiKey};
use kafka_protocol::protocol::{Decodable, Encodable};
use kafka_protocol::ResponseError;

/// Bytes of an unsupported request's body, at most; a larger one closes the connection.
/// An answer names every entity its request names (each a few bytes of request, up to about
/// 15 of answer), so this bounds the answer, which waits unread in the broker's memory
/// while its client does not read it: a break-it trial turned a 16 MiB FindCoordinator of
/// one-byte keys into a 1.1 GB answer. Clients that asked ApiVersions send none of these.
pub const REQUEST_BYTES_MAX: usize = 16 * 1024;

/// The error code every answer carries: `UNSUPPORTED_VERSION` (35).
fn code() -> i16 {
    ResponseError::UnsupportedVersion.code()
}

fn encode(body: &impl Encodable, version: i16) -> anyhow::Result<BytesMut> {
    let mut buf = BytesMut::with_capacity(body.compute_size(version)?);
    body.encode(&mut buf, version)?;
    Ok(buf)
}

/// Whether [`answer`] has an answer for `key` (at the codec's versions).
#[must_use]
pub fn answerable(key: ApiKey) -> bool {
    !matches!(
        key,
        ApiKey::WriteTxnMarkers
            | ApiKey::InitializeShareGroupState
            | ApiKey::ReadShareGroupState
            | ApiKey::WriteShareGroupState
            | ApiKey::DeleteShareGroupState
            | ApiKey::ReadShareGroupStateSummary
            | ApiKey::ShareGroupDescribe
            | ApiKey::DescribeShareGroupOffsets
    )
}

/// Answers the request with its response's top-level `error_code` set, for each `Key =>
/// Request, Response` in the first list, at every version, and in the second list under its
/// version condition; any other key goes to [`per_entity`].
macro_rules! top_level {
    ($key:expr, $body:expr, $version:expr,
     [$($name:ident => $req:ident, $resp:ident;)*],
     [$($gname:ident if $cond:expr => $greq:ident, $gresp:ident;)*]) => {
        match $key {
            $(ApiKey::$name => {
                m::$req::decode($body, $version)?;
                let mut r = m::$resp::default();
                r.error_code = code();
                encode(&r, $version)
            })*
            $(ApiKey::$gname if $cond => {
                m::$greq::decode($body, $version)?;
                let mut r = m::$gresp::default();
                r.error_code = code();
                encode(&r, $version)
            })*
            other => per_entity(other, $body, $version),
        }
    };
}

/// The response body (encoded at `version`) that answers request `body` of `key` with
/// `UNSUPPORTED_VERSION`; `version` must be within the codec's range for `key`.
///
/// # Errors
/// The request does not decode at `version`, `key` has no answer here (see the module
/// docs), or the response cannot be encoded: the connection is then closed.
pub fn answer(key: ApiKey, version: i16, mut body: Bytes) -> anyhow::Result<BytesMut> {
    let b = &mut body;
    let v = version;
    top_level!(key, b, v, [
            // Not announced; a top-level error code at every version.
            AddOffsetsToTxn => AddOffsetsToTxnRequest, AddOffsetsToTxnResponse;
            EndTxn => EndTxnRequest, EndTxnResponse;
            ConsumerGroupHeartbeat => ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse;
            DescribeAcls => DescribeAclsRequest, DescribeAclsResponse;
            DescribeClientQuotas => DescribeClientQuotasRequest, DescribeClientQuotasResponse;
            DescribeUserScramCredentials => DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse;
            ListTransactions => ListTransactionsRequest, ListTransactionsResponse;
            OffsetDelete => OffsetDeleteRequest, OffsetDeleteResponse;
            UpdateFeatures => UpdateFeaturesRequest, UpdateFeaturesResponse;
            AlterPartitionReassignments => AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse;
            ListPartitionReassignments => ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse;
            GetTelemetrySubscriptions => GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse;
            PushTelemetry => PushTelemetryRequest, PushTelemetryResponse;
            CreateDelegationToken => CreateDelegationTokenRequest, CreateDelegationTokenResponse;
            DescribeDelegationToken => DescribeDelegationTokenRequest, DescribeDelegationTokenResponse;
            ExpireDelegationToken => ExpireDelegationTokenRequest, ExpireDelegationTokenResponse;
            RenewDelegationToken => RenewDelegationTokenRequest, RenewDelegationTokenResponse;
            DescribeQuorum => DescribeQuorumRequest, DescribeQuorumResponse;
            ListConfigResources => ListConfigResourcesRequest, ListConfigResourcesResponse;
            AlterShareGroupOffsets => AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse;
            DeleteShareGroupOffsets => DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsResponse;
            ShareGroupHeartbeat => ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse;
            ShareFetch => ShareFetchRequest, ShareFetchResponse;
            ShareAcknowledge => ShareAcknowledgeRequest, ShareAcknowledgeResponse;
            AddRaftVoter => AddRaftVoterRequest, AddRaftVoterResponse;
            RemoveRaftVoter => RemoveRaftVoterRequest, RemoveRaftVoterResponse;
            UpdateRaftVoter => UpdateRaftVoterRequest, UpdateRaftVoterResponse;
            AllocateProducerIds => AllocateProducerIdsRequest, AllocateProducerIdsResponse;
            AlterPartition => AlterPartitionRequest, AlterPartitionResponse;
            AssignReplicasToDirs => AssignReplicasToDirsRequest, AssignReplicasToDirsResponse;
            BeginQuorumEpoch => BeginQuorumEpochRequest, BeginQuorumEpochResponse;
            EndQuorumEpoch => EndQuorumEpochRequest, EndQuorumEpochResponse;
            BrokerHeartbeat => BrokerHeartbeatRequest, BrokerHeartbeatResponse;
            BrokerRegistration => BrokerRegistrationRequest, BrokerRegistrationResponse;
            ControllerRegistration => ControllerRegistrationRequest, ControllerRegistrationResponse;
            Envelope => EnvelopeRequest, EnvelopeResponse;
            FetchSnapshot => FetchSnapshotRequest, FetchSnapshotResponse;
            UnregisterBroker => UnregisterBrokerRequest, UnregisterBrokerResponse;
            Vote => VoteRequest, VoteResponse;
            // Served, at the versions outside the announced range.
            Heartbeat => HeartbeatRequest, HeartbeatResponse;
            JoinGroup => JoinGroupRequest, JoinGroupResponse;
            SyncGroup => SyncGroupRequest, SyncGroupResponse;
            LeaveGroup => LeaveGroupRequest, LeaveGroupResponse;
            ListGroups => ListGroupsRequest, ListGroupsResponse;
            InitProducerId => InitProducerIdRequest, InitProducerIdResponse;
            DescribeCluster => DescribeClusterRequest, DescribeClusterResponse;
        ], [
            // Served up to 12; a top-level error code from 13 (Metadata), 7 (Fetch).
            Metadata if v >= 13 => MetadataRequest, MetadataResponse;
            Fetch if v >= 7 => FetchRequest, FetchResponse;
        ]
    )
}

/// Answers whose error codes sit in the entities the request names.
#[allow(clippy::too_many_lines)] // one arm per API, each short
fn per_entity(key: ApiKey, b: &mut Bytes, v: i16) -> anyhow::Result<BytesMut> {
    match key {
        ApiKey::Produce => {
            let req = m::ProduceRequest::decode(b, v)?;
            let mut r = m::ProduceResponse::default();
            for t in req.topic_data {
                let mut topic = m::produce_response::TopicProduceResponse::default();
                topic.name = t.name;
                topic.topic_id = t.topic_id;
                for p in t.partition_data {
                    let mut part = m::produce_response::PartitionProduceResponse::default();
                    part.index = p.index;
                    part.error_code = code();
                    part.base_offset = -1;
                    topic.partition_responses.push(part);
                }
                r.responses.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::ListOffsets => {
            let req = m::ListOffsetsRequest::decode(b, v)?;
            let mut r = m::ListOffsetsResponse::default();
            for t in req.topics {
                let mut topic = m::list_offsets_response::ListOffsetsTopicResponse::default();
                topic.name = t.name;
                for p in t.partitions {
                    let mut part =
                        m::list_offsets_response::ListOffsetsPartitionResponse::default();
                    part.partition_index = p.partition_index;
                    part.error_code = code();
                    topic.partitions.push(part);
                }
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::OffsetCommit => {
            let req = m::OffsetCommitRequest::decode(b, v)?;
            let mut r = m::OffsetCommitResponse::default();
            for t in req.topics {
                let mut topic = m::offset_commit_response::OffsetCommitResponseTopic::default();
                topic.name = t.name;
                topic.topic_id = t.topic_id;
                for p in t.partitions {
                    let mut part =
                        m::offset_commit_response::OffsetCommitResponsePartition::default();
                    part.partition_index = p.partition_index;
                    part.error_code = code();
                    topic.partitions.push(part);
                }
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::OffsetFetch => {
            let req = m::OffsetFetchRequest::decode(b, v)?;
            let mut r = m::OffsetFetchResponse::default();
            if v >= 8 {
                for g in req.groups {
                    let mut group = m::offset_fetch_response::OffsetFetchResponseGroup::default();
                    group.group_id = g.group_id;
                    group.error_code = code();
                    r.groups.push(group);
                }
            } else if v >= 2 {
                r.error_code = code();
            } else {
                for t in req.topics.unwrap_or_default() {
                    let mut topic = m::offset_fetch_response::OffsetFetchResponseTopic::default();
                    topic.name = t.name;
                    for p in t.partition_indexes {
                        let mut part =
                            m::offset_fetch_response::OffsetFetchResponsePartition::default();
                        part.partition_index = p;
                        part.committed_offset = -1;
                        part.error_code = code();
                        topic.partitions.push(part);
                    }
                    r.topics.push(topic);
                }
            }
            encode(&r, v)
        }
        ApiKey::FindCoordinator => {
            let req = m::FindCoordinatorRequest::decode(b, v)?;
            let mut r = m::FindCoordinatorResponse::default();
            if v >= 4 {
                for k in req.coordinator_keys {
                    let mut c = m::find_coordinator_response::Coordinator::default();
                    c.key = k;
                    c.node_id = m::BrokerId(-1);
                    c.port = -1;
                    c.error_code = code();
                    r.coordinators.push(c);
                }
            } else {
                r.error_code = code();
                r.node_id = m::BrokerId(-1);
                r.port = -1;
            }
            encode(&r, v)
        }
        ApiKey::DescribeGroups => {
            let req = m::DescribeGroupsRequest::decode(b, v)?;
            let mut r = m::DescribeGroupsResponse::default();
            for g in req.groups {
                let mut group = m::describe_groups_response::DescribedGroup::default();
                group.group_id = g;
                group.error_code = code();
                r.groups.push(group);
            }
            encode(&r, v)
        }
        ApiKey::DeleteRecords => {
            let req = m::DeleteRecordsRequest::decode(b, v)?;
            let mut r = m::DeleteRecordsResponse::default();
            for t in req.topics {
                let mut topic = m::delete_records_response::DeleteRecordsTopicResult::default();
                topic.name = t.name;
                for p in t.partitions {
                    let mut part =
                        m::delete_records_response::DeleteRecordsPartitionResult::default();
                    part.partition_index = p.partition_index;
                    part.low_watermark = -1;
                    part.error_code = code();
                    topic.partitions.push(part);
                }
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::TxnOffsetCommit => {
            let req = m::TxnOffsetCommitRequest::decode(b, v)?;
            let mut r = m::TxnOffsetCommitResponse::default();
            for t in req.topics {
                let mut topic =
                    m::txn_offset_commit_response::TxnOffsetCommitResponseTopic::default();
                topic.name = t.name;
                for p in t.partitions {
                    let mut part =
                        m::txn_offset_commit_response::TxnOffsetCommitResponsePartition::default();
                    part.partition_index = p.partition_index;
                    part.error_code = code();
                    topic.partitions.push(part);
                }
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::AddPartitionsToTxn => {
            let req = m::AddPartitionsToTxnRequest::decode(b, v)?;
            let mut r = m::AddPartitionsToTxnResponse::default();
            let results = |topics: Vec<
                m::add_partitions_to_txn_request::AddPartitionsToTxnTopic,
            >| {
                topics
                    .into_iter()
                    .map(|t| {
                        let mut topic =
                            m::add_partitions_to_txn_response::AddPartitionsToTxnTopicResult::default();
                        topic.name = t.name;
                        for p in t.partitions {
                            let mut part = m::add_partitions_to_txn_response::AddPartitionsToTxnPartitionResult::default();
                            part.partition_index = p;
                            part.partition_error_code = code();
                            topic.results_by_partition.push(part);
                        }
                        topic
                    })
                    .collect::<Vec<_>>()
            };
            if v >= 4 {
                r.error_code = code();
                for t in req.transactions {
                    let mut txn =
                        m::add_partitions_to_txn_response::AddPartitionsToTxnResult::default();
                    txn.transactional_id = t.transactional_id;
                    txn.topic_results = results(t.topics);
                    r.results_by_transaction.push(txn);
                }
            } else {
                r.results_by_topic_v3_and_below = results(req.v3_and_below_topics);
            }
            encode(&r, v)
        }
        ApiKey::CreateAcls => {
            let req = m::CreateAclsRequest::decode(b, v)?;
            let mut r = m::CreateAclsResponse::default();
            for _ in req.creations {
                let mut result = m::create_acls_response::AclCreationResult::default();
                result.error_code = code();
                r.results.push(result);
            }
            encode(&r, v)
        }
        ApiKey::DeleteAcls => {
            let req = m::DeleteAclsRequest::decode(b, v)?;
            let mut r = m::DeleteAclsResponse::default();
            for _ in req.filters {
                let mut result = m::delete_acls_response::DeleteAclsFilterResult::default();
                result.error_code = code();
                r.filter_results.push(result);
            }
            encode(&r, v)
        }
        ApiKey::DeleteGroups => {
            let req = m::DeleteGroupsRequest::decode(b, v)?;
            let mut r = m::DeleteGroupsResponse::default();
            for g in req.groups_names {
                let mut result = m::delete_groups_response::DeletableGroupResult::default();
                result.group_id = g;
                result.error_code = code();
                r.results.push(result);
            }
            encode(&r, v)
        }
        ApiKey::AlterConfigs => {
            let req = m::AlterConfigsRequest::decode(b, v)?;
            let mut r = m::AlterConfigsResponse::default();
            for res in req.resources {
                let mut out = m::alter_configs_response::AlterConfigsResourceResponse::default();
                out.resource_type = res.resource_type;
                out.resource_name = res.resource_name;
                out.error_code = code();
                r.responses.push(out);
            }
            encode(&r, v)
        }
        ApiKey::IncrementalAlterConfigs => {
            let req = m::IncrementalAlterConfigsRequest::decode(b, v)?;
            let mut r = m::IncrementalAlterConfigsResponse::default();
            for res in req.resources {
                let mut out =
                    m::incremental_alter_configs_response::AlterConfigsResourceResponse::default();
                out.resource_type = res.resource_type;
                out.resource_name = res.resource_name;
                out.error_code = code();
                r.responses.push(out);
            }
            encode(&r, v)
        }
        ApiKey::AlterReplicaLogDirs => {
            let req = m::AlterReplicaLogDirsRequest::decode(b, v)?;
            let mut r = m::AlterReplicaLogDirsResponse::default();
            for dir in req.dirs {
                for t in dir.topics {
                    let mut topic =
                        m::alter_replica_log_dirs_response::AlterReplicaLogDirTopicResult::default(
                        );
                    topic.topic_name = t.name;
                    for p in t.partitions {
                        let mut part = m::alter_replica_log_dirs_response::AlterReplicaLogDirPartitionResult::default();
                        part.partition_index = p;
                        part.error_code = code();
                        topic.partitions.push(part);
                    }
                    r.results.push(topic);
                }
            }
            encode(&r, v)
        }
        ApiKey::AlterClientQuotas => {
            let req = m::AlterClientQuotasRequest::decode(b, v)?;
            let mut r = m::AlterClientQuotasResponse::default();
            for e in req.entries {
                let mut entry = m::alter_client_quotas_response::EntryData::default();
                entry.error_code = code();
                for d in e.entity {
                    let mut ent = m::alter_client_quotas_response::EntityData::default();
                    ent.entity_type = d.entity_type;
                    ent.entity_name = d.entity_name;
                    entry.entity.push(ent);
                }
                r.entries.push(entry);
            }
            encode(&r, v)
        }
        ApiKey::AlterUserScramCredentials => {
            let req = m::AlterUserScramCredentialsRequest::decode(b, v)?;
            let mut r = m::AlterUserScramCredentialsResponse::default();
            let users = req
                .deletions
                .into_iter()
                .map(|d| d.name)
                .chain(req.upsertions.into_iter().map(|u| u.name));
            for user in users {
                let mut result =
                    m::alter_user_scram_credentials_response::AlterUserScramCredentialsResult::default();
                result.user = user;
                result.error_code = code();
                r.results.push(result);
            }
            encode(&r, v)
        }
        ApiKey::OffsetForLeaderEpoch => {
            let req = m::OffsetForLeaderEpochRequest::decode(b, v)?;
            let mut r = m::OffsetForLeaderEpochResponse::default();
            for t in req.topics {
                let mut topic =
                    m::offset_for_leader_epoch_response::OffsetForLeaderTopicResult::default();
                topic.topic = t.topic;
                for p in t.partitions {
                    let mut part = m::offset_for_leader_epoch_response::EpochEndOffset::default();
                    part.partition = p.partition;
                    part.error_code = code();
                    topic.partitions.push(part);
                }
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::DescribeProducers => {
            let req = m::DescribeProducersRequest::decode(b, v)?;
            let mut r = m::DescribeProducersResponse::default();
            for t in req.topics {
                let mut topic = m::describe_producers_response::TopicResponse::default();
                topic.name = t.name;
                for p in t.partition_indexes {
                    let mut part = m::describe_producers_response::PartitionResponse::default();
                    part.partition_index = p;
                    part.error_code = code();
                    topic.partitions.push(part);
                }
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::DescribeTransactions => {
            let req = m::DescribeTransactionsRequest::decode(b, v)?;
            let mut r = m::DescribeTransactionsResponse::default();
            for id in req.transactional_ids {
                let mut state = m::describe_transactions_response::TransactionState::default();
                state.transactional_id = id;
                state.error_code = code();
                r.transaction_states.push(state);
            }
            encode(&r, v)
        }
        ApiKey::ConsumerGroupDescribe => {
            let req = m::ConsumerGroupDescribeRequest::decode(b, v)?;
            let mut r = m::ConsumerGroupDescribeResponse::default();
            for g in req.group_ids {
                let mut group = m::consumer_group_describe_response::DescribedGroup::default();
                group.group_id = g;
                group.error_code = code();
                r.groups.push(group);
            }
            encode(&r, v)
        }
        ApiKey::DescribeTopicPartitions => {
            let req = m::DescribeTopicPartitionsRequest::decode(b, v)?;
            let mut r = m::DescribeTopicPartitionsResponse::default();
            for t in req.topics {
                let mut topic = m::describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic::default();
                topic.name = Some(t.name);
                topic.error_code = code();
                r.topics.push(topic);
            }
            encode(&r, v)
        }
        ApiKey::DescribeLogDirs => {
            m::DescribeLogDirsRequest::decode(b, v)?;
            let mut r = m::DescribeLogDirsResponse::default();
            if v >= 3 {
                r.error_code = code();
            } else {
                let mut dir = m::describe_log_dirs_response::DescribeLogDirsResult::default();
                dir.error_code = code();
                r.results.push(dir);
            }
            encode(&r, v)
        }
        ApiKey::ElectLeaders => {
            let req = m::ElectLeadersRequest::decode(b, v)?;
            let mut r = m::ElectLeadersResponse::default();
            if v >= 1 {
                r.error_code = code();
            }
            for t in req.topic_partitions.unwrap_or_default() {
                let mut topic = m::elect_leaders_response::ReplicaElectionResult::default();
                topic.topic = t.topic;
                for p in t.partitions {
                    let mut part = m::elect_leaders_response::PartitionResult::default();
                    part.partition_id = p;
                    part.error_code = code();
                    topic.partition_result.push(part);
                }
                r.replica_election_results.push(topic);
            }
            encode(&r, v)
        }
        other => anyhow::bail!("{other:?} v{v} has no answer here"),
    }
}
