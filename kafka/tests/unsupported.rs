//! Requests the listener does not serve — an API ApiVersions does not announce, or a
//! served API at a version outside the announced range — are answered with
//! `UNSUPPORTED_VERSION` (35) in a response that decodes at the request's version, rather
//! than closing the connection.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use quire_kafka::{decode_request, unsupported, Decoded, SUPPORTED_APIS};

const UNSUPPORTED_VERSION: i16 = 35;

/// `header + body` of `key` at `version`, as a client sends it after the size prefix.
fn request(key: ApiKey, version: i16, body: &impl Encodable) -> Bytes {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(11)
        .with_client_id(Some(StrBytes::from_static_str("probe")))
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    buf.freeze()
}

fn answered(bytes: Bytes) -> (i32, BytesMut) {
    match decode_request(bytes) {
        Ok(Decoded::Unsupported {
            correlation_id,
            answer: Some(answer),
            ..
        }) => (correlation_id, answer),
        Ok(other) => panic!("not answered as unsupported: {other:?}"),
        Err(why) => panic!("closed: {why}"),
    }
}

fn served(key: ApiKey, version: i16) -> bool {
    SUPPORTED_APIS
        .iter()
        .any(|&(k, lo, hi)| k == key && (lo..=hi).contains(&version))
}

/// For each API (and its request and response types): whether its answer to an empty
/// request carries the error at the top (else in the entities the request names).
macro_rules! every_api {
    ($check:ident; $($key:ident => $req:ident, $resp:ident, $top:expr;)*) => {
        $( $check::<$req, $resp>(ApiKey::$key, $top); )*
    };
}

fn check<Req: Encodable + Default, Resp: Decodable>(key: ApiKey, top: bool) {
    let range = key.valid_versions();
    for version in range.min..=range.max {
        if served(key, version) || !unsupported::answerable(key) {
            continue;
        }
        let mut body = BytesMut::new();
        if Req::default().encode(&mut body, version).is_err() {
            // The codec's request type stops short of the API key's range (OffsetCommit
            // 10, OffsetFetch 10): nothing to answer from, so it closes.
            continue;
        }
        let bytes = request(key, version, &Req::default());
        if key == ApiKey::Produce {
            // A default produce has acks=0: never answered (tested below).
            continue;
        }
        let (correlation_id, answer) = answered(bytes);
        assert_eq!(correlation_id, 11);
        let mut body = answer.clone().freeze();
        Resp::decode(&mut body, version)
            .unwrap_or_else(|e| panic!("{key:?} v{version}: the answer does not decode: {e}"));
        if top {
            assert!(
                answer
                    .windows(2)
                    .any(|w| w == UNSUPPORTED_VERSION.to_be_bytes()),
                "{key:?} v{version}: no UNSUPPORTED_VERSION in {answer:?}"
            );
        }
    }
}

#[test]
fn every_api_the_codec_knows_and_the_listener_does_not_serve_is_answered() {
    every_api!(check;
        Produce => ProduceRequest, ProduceResponse, false;
        Fetch => FetchRequest, FetchResponse, true;
        ListOffsets => ListOffsetsRequest, ListOffsetsResponse, false;
        Metadata => MetadataRequest, MetadataResponse, true;
        OffsetCommit => OffsetCommitRequest, OffsetCommitResponse, false;
        OffsetFetch => OffsetFetchRequest, OffsetFetchResponse, false;
        FindCoordinator => FindCoordinatorRequest, FindCoordinatorResponse, false;
        JoinGroup => JoinGroupRequest, JoinGroupResponse, true;
        Heartbeat => HeartbeatRequest, HeartbeatResponse, true;
        LeaveGroup => LeaveGroupRequest, LeaveGroupResponse, true;
        SyncGroup => SyncGroupRequest, SyncGroupResponse, true;
        DescribeGroups => DescribeGroupsRequest, DescribeGroupsResponse, false;
        ListGroups => ListGroupsRequest, ListGroupsResponse, true;
        DeleteRecords => DeleteRecordsRequest, DeleteRecordsResponse, false;
        InitProducerId => InitProducerIdRequest, InitProducerIdResponse, true;
        OffsetForLeaderEpoch => OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, false;
        AddPartitionsToTxn => AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, false;
        AddOffsetsToTxn => AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, true;
        EndTxn => EndTxnRequest, EndTxnResponse, true;
        TxnOffsetCommit => TxnOffsetCommitRequest, TxnOffsetCommitResponse, false;
        DescribeAcls => DescribeAclsRequest, DescribeAclsResponse, true;
        CreateAcls => CreateAclsRequest, CreateAclsResponse, false;
        DeleteAcls => DeleteAclsRequest, DeleteAclsResponse, false;
        AlterConfigs => AlterConfigsRequest, AlterConfigsResponse, false;
        AlterReplicaLogDirs => AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, false;
        DescribeLogDirs => DescribeLogDirsRequest, DescribeLogDirsResponse, true;
        CreateDelegationToken => CreateDelegationTokenRequest, CreateDelegationTokenResponse, true;
        RenewDelegationToken => RenewDelegationTokenRequest, RenewDelegationTokenResponse, true;
        ExpireDelegationToken => ExpireDelegationTokenRequest, ExpireDelegationTokenResponse, true;
        DescribeDelegationToken => DescribeDelegationTokenRequest, DescribeDelegationTokenResponse, true;
        DeleteGroups => DeleteGroupsRequest, DeleteGroupsResponse, false;
        ElectLeaders => ElectLeadersRequest, ElectLeadersResponse, false;
        IncrementalAlterConfigs => IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, false;
        AlterPartitionReassignments => AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, true;
        ListPartitionReassignments => ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, true;
        OffsetDelete => OffsetDeleteRequest, OffsetDeleteResponse, true;
        DescribeClientQuotas => DescribeClientQuotasRequest, DescribeClientQuotasResponse, true;
        AlterClientQuotas => AlterClientQuotasRequest, AlterClientQuotasResponse, false;
        DescribeUserScramCredentials => DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse, true;
        AlterUserScramCredentials => AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, false;
        Vote => VoteRequest, VoteResponse, true;
        BeginQuorumEpoch => BeginQuorumEpochRequest, BeginQuorumEpochResponse, true;
        EndQuorumEpoch => EndQuorumEpochRequest, EndQuorumEpochResponse, true;
        DescribeQuorum => DescribeQuorumRequest, DescribeQuorumResponse, true;
        AlterPartition => AlterPartitionRequest, AlterPartitionResponse, true;
        UpdateFeatures => UpdateFeaturesRequest, UpdateFeaturesResponse, true;
        Envelope => EnvelopeRequest, EnvelopeResponse, true;
        FetchSnapshot => FetchSnapshotRequest, FetchSnapshotResponse, true;
        DescribeCluster => DescribeClusterRequest, DescribeClusterResponse, true;
        DescribeProducers => DescribeProducersRequest, DescribeProducersResponse, false;
        BrokerRegistration => BrokerRegistrationRequest, BrokerRegistrationResponse, true;
        BrokerHeartbeat => BrokerHeartbeatRequest, BrokerHeartbeatResponse, true;
        UnregisterBroker => UnregisterBrokerRequest, UnregisterBrokerResponse, true;
        DescribeTransactions => DescribeTransactionsRequest, DescribeTransactionsResponse, false;
        ListTransactions => ListTransactionsRequest, ListTransactionsResponse, true;
        AllocateProducerIds => AllocateProducerIdsRequest, AllocateProducerIdsResponse, true;
        ConsumerGroupHeartbeat => ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, true;
        ConsumerGroupDescribe => ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, false;
        ControllerRegistration => ControllerRegistrationRequest, ControllerRegistrationResponse, true;
        GetTelemetrySubscriptions => GetTelemetrySubscriptionsRequest, GetTelemetrySubscriptionsResponse, true;
        PushTelemetry => PushTelemetryRequest, PushTelemetryResponse, true;
        AssignReplicasToDirs => AssignReplicasToDirsRequest, AssignReplicasToDirsResponse, true;
        ListConfigResources => ListConfigResourcesRequest, ListConfigResourcesResponse, true;
        DescribeTopicPartitions => DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, false;
        ShareGroupHeartbeat => ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse, true;
        ShareFetch => ShareFetchRequest, ShareFetchResponse, true;
        ShareAcknowledge => ShareAcknowledgeRequest, ShareAcknowledgeResponse, true;
        AddRaftVoter => AddRaftVoterRequest, AddRaftVoterResponse, true;
        RemoveRaftVoter => RemoveRaftVoterRequest, RemoveRaftVoterResponse, true;
        UpdateRaftVoter => UpdateRaftVoterRequest, UpdateRaftVoterResponse, true;
        AlterShareGroupOffsets => AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse, true;
        DeleteShareGroupOffsets => DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsResponse, true;
    );
}

#[test]
fn a_produce_above_the_served_versions_gets_an_error_for_every_partition() {
    for version in [10, 13] {
        let mut topic = TopicProduceData::default();
        topic.name = TopicName(StrBytes::from_static_str("orders"));
        for index in [0, 3] {
            topic
                .partition_data
                .push(PartitionProduceData::default().with_index(index));
        }
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_topic_data(vec![topic]);
        let (_, answer) = answered(request(ApiKey::Produce, version, &req));
        let resp = ProduceResponse::decode(&mut answer.freeze(), version).unwrap();
        let parts = &resp.responses[0].partition_responses;
        let got: Vec<(i32, i16)> = parts.iter().map(|p| (p.index, p.error_code)).collect();
        assert_eq!(got, [(0, UNSUPPORTED_VERSION), (3, UNSUPPORTED_VERSION)]);
        if version < 13 {
            assert_eq!(resp.responses[0].name.0.as_str(), "orders");
        }
    }
}

#[test]
fn entity_answers_name_what_the_request_named() {
    // OffsetFetch 8 (a version the listener does not serve): one answer per group.
    let req = OffsetFetchRequest::default().with_groups(vec![
        offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g1"))),
        offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g2"))),
    ]);
    let (_, answer) = answered(request(ApiKey::OffsetFetch, 8, &req));
    let resp = OffsetFetchResponse::decode(&mut answer.freeze(), 8).unwrap();
    let got: Vec<(&str, i16)> = resp
        .groups
        .iter()
        .map(|g| (g.group_id.0.as_str(), g.error_code))
        .collect();
    assert_eq!(
        got,
        [("g1", UNSUPPORTED_VERSION), ("g2", UNSUPPORTED_VERSION)]
    );

    // DeleteRecords (not announced): every partition named.
    let req = DeleteRecordsRequest::default().with_topics(vec![
        delete_records_request::DeleteRecordsTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![
                delete_records_request::DeleteRecordsPartition::default().with_partition_index(2),
            ]),
    ]);
    let (_, answer) = answered(request(ApiKey::DeleteRecords, 2, &req));
    let resp = DeleteRecordsResponse::decode(&mut answer.freeze(), 2).unwrap();
    let p = &resp.topics[0].partitions[0];
    assert_eq!((p.partition_index, p.error_code), (2, UNSUPPORTED_VERSION));

    // FindCoordinator 5: every key.
    let req = FindCoordinatorRequest::default().with_coordinator_keys(vec![
        StrBytes::from_static_str("a"),
        StrBytes::from_static_str("b"),
    ]);
    let (_, answer) = answered(request(ApiKey::FindCoordinator, 5, &req));
    let resp = FindCoordinatorResponse::decode(&mut answer.freeze(), 5).unwrap();
    let got: Vec<(&str, i16)> = resp
        .coordinators
        .iter()
        .map(|c| (c.key.as_str(), c.error_code))
        .collect();
    assert_eq!(
        got,
        [("a", UNSUPPORTED_VERSION), ("b", UNSUPPORTED_VERSION)]
    );
}

#[test]
fn what_has_no_answer_still_closes() {
    // A version the codec does not know.
    let mut bytes = request(ApiKey::Heartbeat, 4, &HeartbeatRequest::default()).to_vec();
    bytes[2..4].copy_from_slice(&99i16.to_be_bytes());
    assert!(decode_request(Bytes::from(bytes)).is_err());
    // An unknown API key.
    let mut bytes = request(ApiKey::Heartbeat, 4, &HeartbeatRequest::default()).to_vec();
    bytes[0..2].copy_from_slice(&999i16.to_be_bytes());
    assert!(decode_request(Bytes::from(bytes)).is_err());
    // An inter-broker API whose answer names topic ids.
    let bytes = request(
        ApiKey::WriteTxnMarkers,
        1,
        &WriteTxnMarkersRequest::default(),
    );
    assert!(decode_request(bytes).is_err());
    // Produce 2: below what the codec reads (Kafka 4 removed it).
    let mut bytes = request(ApiKey::Produce, 3, &ProduceRequest::default()).to_vec();
    bytes[2..4].copy_from_slice(&2i16.to_be_bytes());
    assert!(decode_request(Bytes::from(bytes)).is_err());
    // A body cut short.
    let bytes = request(ApiKey::EndTxn, 3, &EndTxnRequest::default());
    assert!(decode_request(bytes.slice(..bytes.len() - 3)).is_err());
}

#[test]
fn a_produce_with_acks_0_at_a_version_not_served_is_not_answered() {
    let req = ProduceRequest::default().with_acks(0);
    match decode_request(request(ApiKey::Produce, 10, &req)) {
        Ok(Decoded::Unsupported { answer: None, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// An answer names every entity its request names, so an unsupported request is answered
/// only up to 16 KiB: a FindCoordinator of a million one-byte keys (a 1.1 GB answer, found
/// by a break-it trial) closes the connection, and the largest one answered stays small.
#[test]
fn an_unsupported_request_is_answered_only_while_small() {
    let keys = |n: usize| {
        FindCoordinatorRequest::default()
            .with_coordinator_keys((0..n).map(|_| StrBytes::from_static_str("")).collect())
    };
    assert!(decode_request(request(ApiKey::FindCoordinator, 5, &keys(1_000_000))).is_err());
    // One byte per empty key (compact strings): as many as fit.
    let largest = request(
        ApiKey::FindCoordinator,
        5,
        &keys(unsupported::REQUEST_BYTES_MAX - 64),
    );
    assert!(largest.len() <= unsupported::REQUEST_BYTES_MAX);
    let (_, answer) = answered(largest);
    assert!(
        answer.len() < 16 * unsupported::REQUEST_BYTES_MAX,
        "{}",
        answer.len()
    );
}
