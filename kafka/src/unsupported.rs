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
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;

/// The error code every answer carries: `UNSUPPORTED_VERSION` (35).
fn code() -> i16 {
    ResponseError::UnsupportedVersion.code()
}

fn message() -> Option<StrBytes> {
    Some(StrBytes::from_static_str(
        "not supported by Quire at this version (docs/kafka.md)",
    ))
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

/// An answer whose only error field is the top-level `error_code`.
macro_rules! top_level {
    ($req:ty, $resp:ty, $body:expr, $version:expr) => {{
        <$req>::decode($body, $version)?;
        let mut r = <$resp>::default();
        r.error_code = code();
        encode(&r, $version)
    }};
}

/// The response body (encoded at `version`) that answers request `body` of `key` with
/// `UNSUPPORTED_VERSION`; `version` must be within the codec's range for `key`.
///
/// # Errors
/// The request does not decode at `version`, `key` has no answer here (see the module
/// docs), or the response cannot be encoded: the connection is then closed.
#[allow(clippy::too_many_lines)] // one arm per API, each short
pub fn answer(key: ApiKey, version: i16, mut body: Bytes) -> anyhow::Result<BytesMut> {
    let b = &mut body;
    let v = version;
    match key {
        // Top-level error code at every version.
        ApiKey::AddOffsetsToTxn => {
            top_level!(m::AddOffsetsToTxnRequest, m::AddOffsetsToTxnResponse, b, v)
        }
        ApiKey::EndTxn => top_level!(m::EndTxnRequest, m::EndTxnResponse, b, v),
        ApiKey::ConsumerGroupHeartbeat => top_level!(
            m::ConsumerGroupHeartbeatRequest,
            m::ConsumerGroupHeartbeatResponse,
            b,
            v
        ),
        ApiKey::DescribeAcls => top_level!(m::DescribeAclsRequest, m::DescribeAclsResponse, b, v),
        ApiKey::DescribeClientQuotas => top_level!(
            m::DescribeClientQuotasRequest,
            m::DescribeClientQuotasResponse,
            b,
            v
        ),
        ApiKey::DescribeUserScramCredentials => top_level!(
            m::DescribeUserScramCredentialsRequest,
            m::DescribeUserScramCredentialsResponse,
            b,
            v
        ),
        ApiKey::ListTransactions => {
            top_level!(
                m::ListTransactionsRequest,
                m::ListTransactionsResponse,
                b,
                v
            )
        }
        ApiKey::OffsetDelete => top_level!(m::OffsetDeleteRequest, m::OffsetDeleteResponse, b, v),
        ApiKey::UpdateFeatures => {
            top_level!(m::UpdateFeaturesRequest, m::UpdateFeaturesResponse, b, v)
        }
        ApiKey::AlterPartitionReassignments => top_level!(
            m::AlterPartitionReassignmentsRequest,
            m::AlterPartitionReassignmentsResponse,
            b,
            v
        ),
        ApiKey::ListPartitionReassignments => top_level!(
            m::ListPartitionReassignmentsRequest,
            m::ListPartitionReassignmentsResponse,
            b,
            v
        ),
        ApiKey::GetTelemetrySubscriptions => top_level!(
            m::GetTelemetrySubscriptionsRequest,
            m::GetTelemetrySubscriptionsResponse,
            b,
            v
        ),
        ApiKey::PushTelemetry => {
            top_level!(m::PushTelemetryRequest, m::PushTelemetryResponse, b, v)
        }
        ApiKey::CreateDelegationToken => top_level!(
            m::CreateDelegationTokenRequest,
            m::CreateDelegationTokenResponse,
            b,
            v
        ),
        ApiKey::DescribeDelegationToken => top_level!(
            m::DescribeDelegationTokenRequest,
            m::DescribeDelegationTokenResponse,
            b,
            v
        ),
        ApiKey::ExpireDelegationToken => top_level!(
            m::ExpireDelegationTokenRequest,
            m::ExpireDelegationTokenResponse,
            b,
            v
        ),
        ApiKey::RenewDelegationToken => top_level!(
            m::RenewDelegationTokenRequest,
            m::RenewDelegationTokenResponse,
            b,
            v
        ),
        ApiKey::DescribeQuorum => {
            top_level!(m::DescribeQuorumRequest, m::DescribeQuorumResponse, b, v)
        }
        ApiKey::ListConfigResources => top_level!(
            m::ListConfigResourcesRequest,
            m::ListConfigResourcesResponse,
            b,
            v
        ),
        ApiKey::AlterShareGroupOffsets => top_level!(
            m::AlterShareGroupOffsetsRequest,
            m::AlterShareGroupOffsetsResponse,
            b,
            v
        ),
        ApiKey::DeleteShareGroupOffsets => top_level!(
            m::DeleteShareGroupOffsetsRequest,
            m::DeleteShareGroupOffsetsResponse,
            b,
            v
        ),
        ApiKey::ShareGroupHeartbeat => top_level!(
            m::ShareGroupHeartbeatRequest,
            m::ShareGroupHeartbeatResponse,
            b,
            v
        ),
        ApiKey::ShareFetch => top_level!(m::ShareFetchRequest, m::ShareFetchResponse, b, v),
        ApiKey::ShareAcknowledge => {
            top_level!(
                m::ShareAcknowledgeRequest,
                m::ShareAcknowledgeResponse,
                b,
                v
            )
        }
        ApiKey::AddRaftVoter => top_level!(m::AddRaftVoterRequest, m::AddRaftVoterResponse, b, v),
        ApiKey::RemoveRaftVoter => {
            top_level!(m::RemoveRaftVoterRequest, m::RemoveRaftVoterResponse, b, v)
        }
        ApiKey::UpdateRaftVoter => {
            top_level!(m::UpdateRaftVoterRequest, m::UpdateRaftVoterResponse, b, v)
        }
        ApiKey::AllocateProducerIds => top_level!(
            m::AllocateProducerIdsRequest,
            m::AllocateProducerIdsResponse,
            b,
            v
        ),
        ApiKey::AlterPartition => {
            top_level!(m::AlterPartitionRequest, m::AlterPartitionResponse, b, v)
        }
        ApiKey::AssignReplicasToDirs => top_level!(
            m::AssignReplicasToDirsRequest,
            m::AssignReplicasToDirsResponse,
            b,
            v
        ),
        ApiKey::BeginQuorumEpoch => {
            top_level!(
                m::BeginQuorumEpochRequest,
                m::BeginQuorumEpochResponse,
                b,
                v
            )
        }
        ApiKey::EndQuorumEpoch => {
            top_level!(m::EndQuorumEpochRequest, m::EndQuorumEpochResponse, b, v)
        }
        ApiKey::BrokerHeartbeat => {
            top_level!(m::BrokerHeartbeatRequest, m::BrokerHeartbeatResponse, b, v)
        }
        ApiKey::BrokerRegistration => top_level!(
            m::BrokerRegistrationRequest,
            m::BrokerRegistrationResponse,
            b,
            v
        ),
        ApiKey::ControllerRegistration => top_level!(
            m::ControllerRegistrationRequest,
            m::ControllerRegistrationResponse,
            b,
            v
        ),
        ApiKey::Envelope => top_level!(m::EnvelopeRequest, m::EnvelopeResponse, b, v),
        ApiKey::FetchSnapshot => {
            top_level!(m::FetchSnapshotRequest, m::FetchSnapshotResponse, b, v)
        }
        ApiKey::UnregisterBroker => {
            top_level!(
                m::UnregisterBrokerRequest,
                m::UnregisterBrokerResponse,
                b,
                v
            )
        }
        ApiKey::Vote => top_level!(m::VoteRequest, m::VoteResponse, b, v),
        // Served APIs, at the versions outside the announced range that have a top-level
        // error code (Metadata 13, Fetch 13–18, and every version of these).
        ApiKey::Heartbeat => top_level!(m::HeartbeatRequest, m::HeartbeatResponse, b, v),
        ApiKey::JoinGroup => top_level!(m::JoinGroupRequest, m::JoinGroupResponse, b, v),
        ApiKey::SyncGroup => top_level!(m::SyncGroupRequest, m::SyncGroupResponse, b, v),
        ApiKey::LeaveGroup => top_level!(m::LeaveGroupRequest, m::LeaveGroupResponse, b, v),
        ApiKey::ListGroups => top_level!(m::ListGroupsRequest, m::ListGroupsResponse, b, v),
        ApiKey::InitProducerId => {
            top_level!(m::InitProducerIdRequest, m::InitProducerIdResponse, b, v)
        }
        ApiKey::DescribeCluster => {
            top_level!(m::DescribeClusterRequest, m::DescribeClusterResponse, b, v)
        }
        ApiKey::Metadata if v >= 13 => {
            top_level!(m::MetadataRequest, m::MetadataResponse, b, v)
        }
        ApiKey::Fetch if v >= 7 => top_level!(m::FetchRequest, m::FetchResponse, b, v),
        _ => per_entity(key, b, v),
    }
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
                    c.error_message = message();
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
                result.error_message = message();
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
                result.error_message = message();
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
                out.error_message = message();
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
                out.error_message = message();
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
                entry.error_message = message();
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
                result.error_message = message();
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
                    part.error_message = message();
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
                group.error_message = message();
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
                    part.error_message = message();
                    topic.partition_result.push(part);
                }
                r.replica_election_results.push(topic);
            }
            encode(&r, v)
        }
        other => anyhow::bail!("{other:?} v{v} has no answer here"),
    }
}
