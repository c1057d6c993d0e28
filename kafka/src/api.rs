//! One handler per supported Kafka API, each mapping a decoded request onto the broker's
//! native requests ([`Backend::call`]) and their answers onto the Kafka response.
//!
//! | API | versions | maps to |
//! | --- | --- | --- |
//! | ApiVersions (18) | 0–3 | the table below |
//! | Metadata (3) | 0–12 | `MetadataRequest { topics: true }`: brokers' Kafka addresses, each topic as partition 0 led by the master |
//! | Produce (0) | 0–9 (3–9 served) | one `ProduceRequest` of format Kafka per partition, answered once stabilized |
//! | Fetch (1) | 4–12 | one `FetchRequest { records: true }` per partition, long-polled |
//! | ListOffsets (2) | 1–7 | fetch probes: earliest = the first offset held, latest = HWM + 1, by time = a binary search |
//! | FindCoordinator (10) | 0–4 | groups: the master's Kafka address; transactions: `TRANSACTIONAL_ID_AUTHORIZATION_FAILED` |
//! | JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13) | 0–7, 0–5, 0–4, 0–4 | the master's group coordinator ([`crate::group`]) |
//! | OffsetCommit (8), OffsetFetch (9) | 2–8, 1–7 | `CommitCursorRequest` / `CursorRequest`, cursor = group id |
//! | ListGroups (16), DescribeGroups (15) | 0–4, 0–5 | the master's groups |
//! | CreateTopics (19), DeleteTopics (20) | 0–7 (2–7 served), 0–6 (1–6 served) | `TopicAdminRequest` (one partition per topic) |
//! | CreatePartitions (37) | 0–3 | `INVALID_PARTITIONS` |
//! | DescribeCluster (60), DescribeConfigs (32) | 0–1, 0–4 (1–4 served) | the brokers; `cleanup.policy=delete` per topic |
//! | InitProducerId (22) | 0–4 | a new random producer id (or the next epoch of one): [`init_producer_id`] |
//!
//! Produce is announced from version 0 although a request below 3 closes the connection
//! (versions 0–2 carry message sets v0/v1, which Quire does not read, as Kafka 4 no longer
//! does): librdkafka 2.0 (Debian 12's, tried here) compresses with gzip, snappy or lz4
//! only for a broker whose Produce range includes version 0 — and lz4 only if it
//! announces FindCoordinator 0 — and otherwise sends the batch uncompressed; it always
//! uses the highest version both sides announce (Produce 7, Fetch 11).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreatePartitionsRequest,
    CreateTopicsRequest, DeleteTopicsRequest, DescribeClusterRequest, DescribeConfigsRequest,
    DescribeGroupsRequest, FetchRequest, FetchResponse, FindCoordinatorRequest, HeartbeatRequest,
    InitProducerIdRequest, InitProducerIdResponse, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetFetchRequest, ProduceRequest, ProduceResponse, ProducerId,
    SaslAuthenticateRequest, SaslHandshakeRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use quire_proto::{Body, ErrorCode, ErrorDetail, MessageFormat, Offset, MESSAGES_PER_FRAME_MAX};
use tokio::task::JoinSet;

use crate::batch::{self, BatchError};
use crate::{
    admin, coordinator, split_host_port, Backend, Client, KafkaSettings, Listener, Pending,
};

/// The APIs the listener serves, `(key, lowest version, highest version)`: what
/// ApiVersions announces. Any other request is answered `UNSUPPORTED_VERSION`
/// ([`crate::unsupported`]) or, when the codec cannot frame an answer, closes the
/// connection.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 0, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    // Announced from 0, served from the first version the codec reads (2, 1, 1): as for
    // Produce, librdkafka uses an admin API only if the broker's range starts at 0, and
    // then the highest version both sides know.
    (ApiKey::CreateTopics, 0, 7),
    (ApiKey::DeleteTopics, 0, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::DescribeConfigs, 0, 4),
    // Version 0 (raw SASL tokens after the handshake) closes the connection; librdkafka
    // and the Java client use version 1 and SaslAuthenticate.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// The versions of `key` the listener serves, `(lowest, highest)`; `None` if it does not
/// serve the API.
#[must_use]
pub fn supported_versions(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|&(_, lo, hi)| (lo, hi))
}

/// What a request is answered with.
pub(crate) enum Answer {
    /// Nothing (a produce with `acks=0`).
    None,
    /// The response body, encoded at the request's version.
    Body(BytesMut),
}

pub(crate) fn encoded(body: &impl Encodable, version: i16) -> anyhow::Result<Answer> {
    let mut buf = BytesMut::with_capacity(body.compute_size(version)?);
    body.encode(&mut buf, version)?;
    Ok(Answer::Body(buf))
}

/// The only partition of every topic.
pub(crate) const PARTITION: i32 = 0;

/// Starts serving one decoded request of `version`: a produce is handed to the broker
/// before this returns (so the requests of a connection reach the log in the order they
/// were read), the rest of it and every other request run in the future returned. That
/// future fails if the answer cannot be encoded at `version` (the connection is closed).
pub(crate) async fn start<B: Backend>(
    backend: &B,
    listener: &Arc<Listener>,
    client: Client,
    version: i16,
    req: KafkaRequest,
) -> Finishing {
    match req {
        KafkaRequest::Produce(req) => {
            let acks = req.acks;
            let submitted = produce_submit(backend, req).await;
            Box::pin(produce_answer(submitted, acks, version))
        }
        other => {
            let backend = backend.clone();
            let listener = listener.clone();
            Box::pin(async move { serve(&backend, &listener, &client, version, other).await })
        }
    }
}

/// The rest of a request once [`start`] has handed what must keep its order to the broker:
/// its answer, encoded.
pub(crate) type Finishing = std::pin::Pin<Box<dyn Future<Output = anyhow::Result<Answer>> + Send>>;

/// Serves one decoded request at once (a produce without reading ahead of it).
async fn serve<B: Backend>(
    backend: &B,
    listener: &Listener,
    client: &Client,
    version: i16,
    req: KafkaRequest,
) -> anyhow::Result<Answer> {
    let settings = &listener.settings;
    match req {
        KafkaRequest::ApiVersions => encoded(&api_versions(), version),
        KafkaRequest::Metadata(req) => {
            encoded(&metadata(backend, settings, &req, version).await, version)
        }
        KafkaRequest::Produce(req) => {
            let acks = req.acks;
            produce_answer(produce_submit(backend, req).await, acks, version).await
        }
        KafkaRequest::Fetch(req) => encoded(&fetch(backend, req).await, version),
        KafkaRequest::ListOffsets(req) => encoded(&list_offsets(backend, req).await, version),
        KafkaRequest::FindCoordinator(req) => encoded(
            &coordinator::find_coordinator(backend, listener, &req, version).await,
            version,
        ),
        KafkaRequest::InitProducerId(req) => encoded(&init_producer_id(&req), version),
        KafkaRequest::JoinGroup(req) => encoded(
            &coordinator::join_group(backend, listener, client, req, version).await,
            version,
        ),
        KafkaRequest::SyncGroup(req) => encoded(
            &coordinator::sync_group(backend, listener, req).await,
            version,
        ),
        KafkaRequest::Heartbeat(req) => encoded(
            &coordinator::heartbeat(backend, listener, &req).await,
            version,
        ),
        KafkaRequest::LeaveGroup(req) => encoded(
            &coordinator::leave_group(backend, listener, &req, version).await,
            version,
        ),
        KafkaRequest::OffsetCommit(req) => encoded(
            &coordinator::offset_commit(backend, listener, req).await,
            version,
        ),
        KafkaRequest::OffsetFetch(req) => encoded(
            &coordinator::offset_fetch(backend, listener, req, version).await,
            version,
        ),
        KafkaRequest::ListGroups => {
            encoded(&coordinator::list_groups(backend, listener).await, version)
        }
        KafkaRequest::DescribeGroups(req) => encoded(
            &coordinator::describe_groups(backend, listener, &req).await,
            version,
        ),
        KafkaRequest::CreateTopics(req) => {
            encoded(&admin::create_topics(backend, settings, req).await, version)
        }
        KafkaRequest::DeleteTopics(req) => {
            encoded(&admin::delete_topics(backend, req, version).await, version)
        }
        KafkaRequest::CreatePartitions(req) => encoded(&admin::create_partitions(req), version),
        KafkaRequest::DescribeCluster => {
            encoded(&admin::describe_cluster(backend, settings).await, version)
        }
        KafkaRequest::DescribeConfigs(req) => encoded(
            &admin::describe_configs(backend, settings, req).await,
            version,
        ),
        KafkaRequest::SaslHandshake(_) | KafkaRequest::SaslAuthenticate(_) => {
            anyhow::bail!("SASL requests are answered by the connection")
        }
    }
}

/// A request of an API the listener serves, decoded.
#[derive(Debug)]
pub enum KafkaRequest {
    /// ApiVersions (its body carries only the client's name and version).
    ApiVersions,
    /// Metadata.
    Metadata(MetadataRequest),
    /// Produce.
    Produce(ProduceRequest),
    /// Fetch.
    Fetch(FetchRequest),
    /// ListOffsets.
    ListOffsets(ListOffsetsRequest),
    /// FindCoordinator.
    FindCoordinator(FindCoordinatorRequest),
    /// InitProducerId.
    InitProducerId(InitProducerIdRequest),
    /// JoinGroup.
    JoinGroup(JoinGroupRequest),
    /// SyncGroup.
    SyncGroup(SyncGroupRequest),
    /// Heartbeat.
    Heartbeat(HeartbeatRequest),
    /// LeaveGroup.
    LeaveGroup(LeaveGroupRequest),
    /// OffsetCommit.
    OffsetCommit(OffsetCommitRequest),
    /// OffsetFetch.
    OffsetFetch(OffsetFetchRequest),
    /// ListGroups (its filters are not applied).
    ListGroups,
    /// DescribeGroups.
    DescribeGroups(DescribeGroupsRequest),
    /// CreateTopics.
    CreateTopics(CreateTopicsRequest),
    /// DeleteTopics.
    DeleteTopics(DeleteTopicsRequest),
    /// CreatePartitions.
    CreatePartitions(CreatePartitionsRequest),
    /// DescribeCluster (its options are not applied).
    DescribeCluster,
    /// DescribeConfigs.
    DescribeConfigs(DescribeConfigsRequest),
    /// SaslHandshake (answered by the connection, [`crate::sasl`]).
    SaslHandshake(SaslHandshakeRequest),
    /// SaslAuthenticate (likewise).
    SaslAuthenticate(SaslAuthenticateRequest),
}

/// Decodes the body of a `key` request at `version` (its header already read).
///
/// # Errors
/// An API the listener does not serve, or a body that does not decode whole.
pub(crate) fn decode_body(
    key: ApiKey,
    version: i16,
    mut body: Bytes,
) -> anyhow::Result<KafkaRequest> {
    let req = match key {
        ApiKey::ApiVersions => {
            ApiVersionsRequest::decode(&mut body, version)?;
            KafkaRequest::ApiVersions
        }
        ApiKey::Metadata => KafkaRequest::Metadata(MetadataRequest::decode(&mut body, version)?),
        ApiKey::Produce => KafkaRequest::Produce(ProduceRequest::decode(&mut body, version)?),
        ApiKey::Fetch => KafkaRequest::Fetch(FetchRequest::decode(&mut body, version)?),
        ApiKey::ListOffsets => {
            KafkaRequest::ListOffsets(ListOffsetsRequest::decode(&mut body, version)?)
        }
        ApiKey::FindCoordinator => {
            KafkaRequest::FindCoordinator(FindCoordinatorRequest::decode(&mut body, version)?)
        }
        ApiKey::InitProducerId => {
            KafkaRequest::InitProducerId(InitProducerIdRequest::decode(&mut body, version)?)
        }
        ApiKey::JoinGroup => KafkaRequest::JoinGroup(JoinGroupRequest::decode(&mut body, version)?),
        ApiKey::SyncGroup => KafkaRequest::SyncGroup(SyncGroupRequest::decode(&mut body, version)?),
        ApiKey::Heartbeat => KafkaRequest::Heartbeat(HeartbeatRequest::decode(&mut body, version)?),
        ApiKey::LeaveGroup => {
            KafkaRequest::LeaveGroup(LeaveGroupRequest::decode(&mut body, version)?)
        }
        ApiKey::OffsetCommit => {
            KafkaRequest::OffsetCommit(OffsetCommitRequest::decode(&mut body, version)?)
        }
        ApiKey::OffsetFetch => {
            KafkaRequest::OffsetFetch(OffsetFetchRequest::decode(&mut body, version)?)
        }
        ApiKey::ListGroups => {
            ListGroupsRequest::decode(&mut body, version)?;
            KafkaRequest::ListGroups
        }
        ApiKey::DescribeGroups => {
            KafkaRequest::DescribeGroups(DescribeGroupsRequest::decode(&mut body, version)?)
        }
        ApiKey::CreateTopics => {
            KafkaRequest::CreateTopics(CreateTopicsRequest::decode(&mut body, version)?)
        }
        ApiKey::DeleteTopics => {
            KafkaRequest::DeleteTopics(DeleteTopicsRequest::decode(&mut body, version)?)
        }
        ApiKey::CreatePartitions => {
            KafkaRequest::CreatePartitions(CreatePartitionsRequest::decode(&mut body, version)?)
        }
        ApiKey::DescribeCluster => {
            DescribeClusterRequest::decode(&mut body, version)?;
            KafkaRequest::DescribeCluster
        }
        ApiKey::DescribeConfigs => {
            KafkaRequest::DescribeConfigs(DescribeConfigsRequest::decode(&mut body, version)?)
        }
        ApiKey::SaslHandshake => {
            anyhow::ensure!(
                version >= 1,
                "SaslHandshake v0 (raw SASL tokens) is not served"
            );
            KafkaRequest::SaslHandshake(SaslHandshakeRequest::decode(&mut body, version)?)
        }
        ApiKey::SaslAuthenticate => {
            KafkaRequest::SaslAuthenticate(SaslAuthenticateRequest::decode(&mut body, version)?)
        }
        other => anyhow::bail!("{other:?} is not served"),
    };
    Ok(req)
}

/// InitProducerId for an idempotent producer (KIP-98; KIP-360 for the epoch bump):
/// a new producer id — 63 random bits, so that any broker can hand one out with no
/// coordination (two producers share one with probability n²/2⁶⁴ for n producers) — at
/// epoch 0; or, asked with a producer id and epoch (version 3 and later), the same id at
/// the next epoch, whose sequences start again at 0 (a new id once the epoch would reach
/// `i16::MAX`). A transactional id is refused with
/// `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`: transactions are not supported.
///
/// How the id, epoch and sequences map onto the broker's idempotent-producer table:
/// [`native_producer`].
pub(crate) fn init_producer_id(req: &InitProducerIdRequest) -> InitProducerIdResponse {
    if req
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty())
    {
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    let (id, epoch) = if req.producer_id.0 >= 0 && (0..i16::MAX - 1).contains(&req.producer_epoch) {
        (req.producer_id.0, req.producer_epoch + 1)
    } else {
        (new_producer_id(), 0)
    };
    InitProducerIdResponse::default()
        .with_producer_id(ProducerId(id))
        .with_producer_epoch(epoch)
}

/// A new Kafka producer id: 63 random bits (`rand`'s thread-local generator, seeded from
/// the operating system).
fn new_producer_id() -> i64 {
    (rand::random::<u64>() >> 1) as i64
}

/// The broker's producer id for a Kafka producer's records to one partition of a topic.
///
/// Kafka numbers a producer's records per partition (each partition's sequences start at
/// 0), and a new epoch starts them at 0 again; the broker's idempotent-producer table
/// numbers them per producer id. So each `(producer id, epoch, topic, partition)` is its
/// own broker producer id: the 64-bit FNV-1a hash of those fields (fixed, so every broker
/// computes the same one, and a new master knows the producer from the log), never 0
/// (which means "not idempotent"). The Kafka sequence is the broker's sequence.
pub(crate) fn native_producer(p: &batch::KafkaProducer, topic: &str, partition: i32) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET_BASIS;
    let fields = [
        &p.id.to_le_bytes()[..],
        &p.epoch.to_le_bytes()[..],
        &partition.to_le_bytes()[..],
        topic.as_bytes(),
    ];
    for b in fields.into_iter().flatten() {
        h = (h ^ u64::from(*b)).wrapping_mul(PRIME);
    }
    h.max(1)
}

fn api_versions() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(
        SUPPORTED_APIS
            .iter()
            .map(|&(k, lo, hi)| {
                ApiVersion::default()
                    .with_api_key(k as i16)
                    .with_min_version(lo)
                    .with_max_version(hi)
            })
            .collect(),
    )
}

/// The answer to an ApiVersions request at a version this listener does not serve
/// (answered at version 0).
pub(crate) fn api_versions_unsupported() -> ApiVersionsResponse {
    api_versions().with_error_code(ResponseError::UnsupportedVersion.code())
}

/// The Kafka error for a broker's error answer.
pub(crate) fn kafka_error(code: ErrorCode) -> ResponseError {
    match code {
        ErrorCode::NotMaster => ResponseError::NotLeaderOrFollower,
        ErrorCode::Timeout | ErrorCode::Overloaded | ErrorCode::ShuttingDown => {
            ResponseError::RequestTimedOut
        }
        ErrorCode::NoQuorum => ResponseError::NotEnoughReplicas,
        ErrorCode::MessageTooLarge | ErrorCode::FrameTooLarge => ResponseError::MessageTooLarge,
        ErrorCode::InvalidName => ResponseError::InvalidTopicException,
        ErrorCode::Unauthorized => ResponseError::TopicAuthorizationFailed,
        ErrorCode::LimitReached => ResponseError::PolicyViolation,
        ErrorCode::OffsetOutOfRange | ErrorCode::Trimmed => ResponseError::OffsetOutOfRange,
        ErrorCode::UnknownTopic => ResponseError::UnknownTopicOrPartition,
        ErrorCode::SequenceGap => ResponseError::OutOfOrderSequenceNumber,
        ErrorCode::UnknownProducer => ResponseError::UnknownProducerId,
        ErrorCode::Malformed => ResponseError::InvalidRequest,
        _ => ResponseError::UnknownServerError,
    }
}

/// The Kafka error for an answer that is not the response expected.
fn unexpected(answer: &Body) -> ResponseError {
    match answer {
        Body::ErrorResponse(e) => kafka_error(e.code),
        _ => ResponseError::UnknownServerError,
    }
}

fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

/// Metadata: every broker with a Kafka address, and each topic asked for (all this
/// broker's state holds, for a null or — at version 0 — empty list) as partition 0 led by
/// the master.
async fn metadata<B: Backend>(
    backend: &B,
    settings: &KafkaSettings,
    req: &MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let brokers: Vec<MetadataResponseBroker> = settings
        .brokers
        .iter()
        .filter_map(|(id, addr)| {
            let (host, port) = split_host_port(addr)?;
            Some(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(i32::from(*id)))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port),
            )
        })
        .collect();
    let node_ids: Vec<BrokerId> = brokers.iter().map(|b| b.node_id).collect();
    let view = backend
        .call(quire_proto::MetadataRequest { topics: true }.into())
        .await;
    let (master, known): (Option<i32>, HashSet<String>) = match view {
        Body::MetadataResponse(m) => (
            m.master.map(|b| i32::from(b.id.0)),
            m.topics.into_iter().collect(),
        ),
        _ => (None, HashSet::new()),
    };
    let wanted: Vec<Option<String>> = match &req.topics {
        Some(t) if !(version == 0 && t.is_empty()) => t
            .iter()
            .map(|t| t.name.as_ref().map(|n| n.0.to_string()))
            .collect(),
        _ => {
            let mut all: Vec<String> = known.iter().cloned().collect();
            all.sort();
            all.into_iter().map(Some).collect()
        }
    };
    let topics = wanted
        .into_iter()
        .map(|name| {
            let Some(name) = name else {
                // Asked for by topic id: Quire topics have none.
                return MetadataResponseTopic::default()
                    .with_error_code(ResponseError::UnknownTopicId.code());
            };
            let topic = MetadataResponseTopic::default().with_name(Some(topic_name(&name)));
            if quire_proto::client::validate_topic(&name).is_err() {
                return topic.with_error_code(ResponseError::InvalidTopicException.code());
            }
            // A topic is created by its first message, so any valid name asked for is
            // announced: a producer writes to it, a consumer waits for its first record.
            // (A slave's topic list trails the master's, so "unknown" from a slave could
            // be wrong a moment after a produce anyway.)
            let partition = MetadataResponsePartition::default()
                .with_partition_index(PARTITION)
                .with_leader_epoch(-1)
                .with_replica_nodes(node_ids.clone())
                .with_isr_nodes(node_ids.clone());
            let partition = match master {
                Some(m) => partition.with_leader_id(BrokerId(m)),
                None => partition
                    .with_leader_id(BrokerId(-1))
                    .with_error_code(ResponseError::LeaderNotAvailable.code()),
            };
            topic.with_partitions(vec![partition])
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(settings.cluster_id.clone())))
        .with_controller_id(BrokerId(master.unwrap_or(-1)))
        .with_topics(topics)
}

/// Produce, first step: each partition's batches decoded and handed to the broker as one
/// native produce of Kafka records, in the order of the request (so a request's records,
/// and those of the requests read after it, get offsets in that order).
async fn produce_submit<B: Backend>(
    backend: &B,
    req: ProduceRequest,
) -> Vec<(TopicName, Vec<(i32, Submitted)>)> {
    let transactional = req
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty());
    let mut out = Vec::with_capacity(req.topic_data.len());
    for topic in req.topic_data {
        let name = topic.name.0.to_string();
        let mut parts = Vec::with_capacity(topic.partition_data.len());
        for part in topic.partition_data {
            // Decompressing and decoding is CPU work of up to a 64 MiB batch: off the
            // runtime's threads, which also run the broker's heartbeats, and one partition
            // at a time in the whole process, so that many small compressed requests
            // cannot take every core and gigabytes at once.
            let topic = name.clone();
            let decoded = match DECODES.acquire().await {
                Ok(_one) => tokio::task::spawn_blocking(move || {
                    produce_request(&topic, part.index, part.records, transactional)
                })
                .await
                .unwrap_or_else(|_| Err((ResponseError::UnknownServerError, None))),
                Err(_) => Err((ResponseError::UnknownServerError, None)),
            };
            let submitted = match decoded {
                Ok(body) => Submitted::Sent(backend.submit(body).await),
                Err(e) => Submitted::Refused(e),
            };
            parts.push((part.index, submitted));
        }
        out.push((topic.name, parts));
    }
    out
}

/// Produced partitions decompressed and decoded at once in the process, at most (each up
/// to 64 MiB decompressed and 64 MiB of records).
pub const DECODES_MAX: usize = 1;
static DECODES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(DECODES_MAX);

/// A partition of a produce: handed to the broker, or refused before.
enum Submitted {
    Sent(Pending),
    Refused(PartitionError),
}

/// Produce, second step, encoded: no answer for `acks=0`.
async fn produce_answer(
    submitted: Vec<(TopicName, Vec<(i32, Submitted)>)>,
    acks: i16,
    version: i16,
) -> anyhow::Result<Answer> {
    let resp = produce_finish(submitted).await;
    if acks == 0 {
        Ok(Answer::None)
    } else {
        encoded(&resp, version)
    }
}

/// Produce, second step: the answers, once stabilized (or refused).
async fn produce_finish(topics: Vec<(TopicName, Vec<(i32, Submitted)>)>) -> ProduceResponse {
    let mut responses = Vec::with_capacity(topics.len());
    for (name, parts) in topics {
        let mut partition_responses = Vec::with_capacity(parts.len());
        for (index, submitted) in parts {
            let r = match submitted {
                Submitted::Refused(e) => Err(e),
                Submitted::Sent(pending) => match pending.await {
                    Body::ProduceResponse(r) => i64::try_from(r.base_offset.0)
                        .map_err(|_| (ResponseError::UnknownServerError, None)),
                    Body::ErrorResponse(e) => Err((kafka_error(e.code), Some(e.message))),
                    other => Err((unexpected(&other), None)),
                },
            };
            let part = PartitionProduceResponse::default()
                .with_index(index)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            partition_responses.push(match r {
                Ok(base) => part.with_base_offset(base),
                Err((e, msg)) => part
                    .with_base_offset(-1)
                    .with_error_code(e.code())
                    .with_error_message(msg.map(StrBytes::from_string)),
            });
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(name)
                .with_partition_responses(partition_responses),
        );
    }
    ProduceResponse::default().with_responses(responses)
}

type PartitionError = (ResponseError, Option<String>);

/// The native produce for one partition's bytes, or why there is none.
fn produce_request(
    topic: &str,
    partition: i32,
    records: Option<Bytes>,
    transactional: bool,
) -> Result<Body, PartitionError> {
    if partition != PARTITION {
        return Err((ResponseError::UnknownTopicOrPartition, None));
    }
    if transactional {
        return Err((
            ResponseError::TransactionalIdAuthorizationFailed,
            Some("transactions are not supported (docs/kafka.md)".to_owned()),
        ));
    }
    if quire_proto::client::validate_topic(topic).is_err() {
        return Err((ResponseError::InvalidTopicException, None));
    }
    let produced = match batch::messages_of(records.unwrap_or_default()) {
        Ok(p) => p,
        Err(BatchError::Corrupt(why)) => return Err((ResponseError::CorruptMessage, Some(why))),
        Err(BatchError::TooLarge(why)) => {
            return Err((ResponseError::RecordListTooLarge, Some(why)))
        }
        Err(BatchError::Transactional) => {
            return Err((
                ResponseError::TransactionalIdAuthorizationFailed,
                Some("transactional and control records are not supported".to_owned()),
            ))
        }
    };
    if produced.messages.is_empty() {
        return Err((ResponseError::CorruptMessage, Some("no records".to_owned())));
    }
    let (producer_id, sequence) = produced.producer.map_or((0, 0), |p| {
        (
            native_producer(&p, topic, partition),
            u64::from(p.first_sequence.unsigned_abs()),
        )
    });
    Ok(quire_proto::ProduceRequest {
        topic: topic.to_owned(),
        producer_id,
        sequence,
        messages: produced.messages,
        format: MessageFormat::Kafka,
    }
    .into())
}

/// Fetch: each partition read from its offset; when the first pass finds fewer than
/// `min_bytes`, a second pass waits up to `max_wait_ms` and answers as soon as one
/// partition has records.
async fn fetch<B: Backend>(backend: &B, req: FetchRequest) -> FetchResponse {
    let mut wanted = Vec::new();
    for topic in &req.topics {
        for p in &topic.partitions {
            wanted.push((
                topic.topic.clone(),
                p.partition,
                p.fetch_offset,
                p.partition_max_bytes,
            ));
        }
    }
    let max_bytes = usize::try_from(req.max_bytes.max(1))
        .unwrap_or(1)
        .min(FETCH_RESPONSE_BYTES_MAX);
    let mut parts: Vec<PartitionData> = fetch_pass(backend, &wanted, max_bytes).await;
    let bytes: usize = parts
        .iter()
        .map(|p| p.records.as_ref().map_or(0, Bytes::len))
        .sum();
    let min_bytes = usize::try_from(req.min_bytes.max(1)).unwrap_or(1);
    let wait_ms = u32::try_from(req.max_wait_ms.max(0)).unwrap_or(0);
    let all_failed = parts.iter().all(|p| p.error_code != 0);
    if bytes < min_bytes && wait_ms > 0 && !all_failed {
        // Wait on the first few partitions only: each waiting fetch holds a place in the
        // broker's bound of in-process requests (the others are asked again next fetch).
        let waiting: Vec<(usize, Wanted)> = wanted
            .iter()
            .cloned()
            .enumerate()
            .filter(|(i, _)| parts[*i].error_code == 0)
            .take(FETCH_WAITING_PARTITIONS_MAX)
            .collect();
        let waited = fetch_waiting(backend, waiting, wait_ms).await;
        for (i, p) in waited {
            parts[i] = p;
        }
    }
    within_max_bytes(&mut parts, max_bytes);
    let mut responses: Vec<FetchableTopicResponse> = Vec::new();
    for ((topic, _, _, _), part) in wanted.into_iter().zip(parts) {
        match responses.last_mut() {
            Some(r) if r.topic == topic => r.partitions.push(part),
            _ => responses.push(
                FetchableTopicResponse::default()
                    .with_topic(topic)
                    .with_partitions(vec![part]),
            ),
        }
    }
    FetchResponse::default().with_responses(responses)
}

type Wanted = (TopicName, i32, i64, i32);

/// Partitions of one fetch read from the broker at once, at most.
pub const FETCH_CONCURRENCY_MAX: usize = 8;
/// Partitions of one fetch that wait for records (`max_wait_ms`), at most.
pub const FETCH_WAITING_PARTITIONS_MAX: usize = 8;
/// Record bytes one fetch answer carries at most, whatever its `max_bytes`.
pub const FETCH_RESPONSE_BYTES_MAX: usize = 64 << 20;

/// Reads every partition once, without waiting, [`FETCH_CONCURRENCY_MAX`] at a time, until
/// the answer holds `max_bytes` of records (the partitions after that are answered with
/// none, and asked again by the client's next fetch).
async fn fetch_pass<B: Backend>(
    backend: &B,
    wanted: &[Wanted],
    max_bytes: usize,
) -> Vec<PartitionData> {
    let mut tasks = JoinSet::new();
    let mut out: Vec<Option<PartitionData>> = vec![None; wanted.len()];
    let mut next = 0;
    let mut bytes = 0usize;
    loop {
        while tasks.len() < FETCH_CONCURRENCY_MAX && next < wanted.len() && bytes < max_bytes {
            let backend = backend.clone();
            let w = wanted[next].clone();
            let i = next;
            tasks.spawn(async move { (i, fetch_partition(&backend, w, 0).await) });
            next += 1;
        }
        let Some(done) = tasks.join_next().await else {
            break;
        };
        if let Ok((i, p)) = done {
            bytes += p.records.as_ref().map_or(0, Bytes::len);
            out[i] = Some(p);
        }
    }
    out.into_iter()
        .zip(wanted)
        .map(|(p, w)| p.unwrap_or_else(|| not_read(w.1)))
        .collect()
}

/// Holds an answer to the fetch's `max_bytes` as Kafka does: partitions keep their records
/// in the order asked while the total stays within `max_bytes`, and the first partition
/// with records keeps them whatever their size (so a record larger than `max_bytes` is
/// still delivered). A partition read at once with others (up to
/// [`FETCH_CONCURRENCY_MAX`]) whose records would go over is answered as not read; the
/// client asks for it again from the same offset.
fn within_max_bytes(parts: &mut [PartitionData], max_bytes: usize) {
    let mut total = 0usize;
    for p in parts.iter_mut() {
        let len = p.records.as_ref().map_or(0, Bytes::len);
        if len == 0 {
            continue;
        }
        if total > 0 && total + len > max_bytes {
            *p = not_read(p.partition_index);
        } else {
            total += len;
        }
    }
}

/// A partition this answer did not read (its byte bound was reached first).
fn not_read(partition: i32) -> PartitionData {
    PartitionData::default()
        .with_partition_index(partition)
        .with_high_watermark(-1)
        .with_records(Some(Bytes::new()))
}

/// The long poll: every partition asked again with `wait_ms`; returns those answered by
/// the first with records (or all, if none had any by the deadline). The fetches still
/// waiting in the broker end at their own deadline, unanswered to the client.
async fn fetch_waiting<B: Backend>(
    backend: &B,
    wanted: Vec<(usize, Wanted)>,
    wait_ms: u32,
) -> Vec<(usize, PartitionData)> {
    let mut tasks = JoinSet::new();
    for (i, w) in wanted {
        let backend = backend.clone();
        tasks.spawn(async move { (i, fetch_partition(&backend, w, wait_ms).await) });
    }
    let mut out = Vec::new();
    let deadline =
        tokio::time::Instant::now() + std::time::Duration::from_millis(u64::from(wait_ms) + 1_000);
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        if let Ok((i, p)) = done {
            let has_records = p.records.as_ref().is_some_and(|r| !r.is_empty());
            out.push((i, p));
            if has_records {
                break;
            }
        }
    }
    // Answers that are already in are kept; the rest are left to run out.
    while let Some(Ok((i, p))) = tasks.try_join_next() {
        out.push((i, p));
    }
    tasks.detach_all();
    out
}

/// A partition answered with an error. Its records are empty, not null: the field is
/// nullable in the schema, but librdkafka 2.16 refuses a null record set in a flexible
/// Fetch answer ("invalid MessageSetSize -1", a protocol parse failure of the whole
/// answer, the partition fetched again at once in a loop), and Kafka sends empty ones.
fn failed(partition: i32, e: ResponseError) -> PartitionData {
    PartitionData::default()
        .with_partition_index(partition)
        .with_error_code(e.code())
        .with_high_watermark(-1)
        .with_records(Some(Bytes::new()))
}

/// Kafka's high watermark (the next offset to be stabilized) for a Quire HWM (the last
/// stabilized offset).
fn high_watermark(hwm: Option<Offset>) -> i64 {
    hwm.map_or(0, |o| {
        i64::try_from(o.0).unwrap_or(i64::MAX).saturating_add(1)
    })
}

async fn fetch_partition<B: Backend>(backend: &B, w: Wanted, wait_ms: u32) -> PartitionData {
    let (topic, partition, offset, max_bytes) = w;
    if partition != PARTITION {
        return failed(partition, ResponseError::UnknownTopicOrPartition);
    }
    let Ok(from) = u64::try_from(offset) else {
        return failed(partition, ResponseError::OffsetOutOfRange);
    };
    let name = topic.0.to_string();
    if quire_proto::client::validate_topic(&name).is_err() {
        return failed(partition, ResponseError::InvalidTopicException);
    }
    let answer = backend
        .call(
            quire_proto::FetchRequest {
                topic: name,
                from_offset: Offset(from),
                max_messages: u32::try_from(MESSAGES_PER_FRAME_MAX).unwrap_or(u32::MAX),
                max_bytes: u32::try_from(max_bytes.max(1)).unwrap_or(1),
                wait_ms,
                records: true,
            }
            .into(),
        )
        .await;
    match answer {
        Body::FetchResponse(r) => {
            let hw = high_watermark(r.hwm);
            if offset > hw {
                // Past the end: Kafka's answer, on which a consumer resets its position
                // by `auto.offset.reset` instead of waiting there for ever.
                return failed(partition, ResponseError::OffsetOutOfRange);
            }
            match batch::batches_of(Offset(from), &r.messages, &r.formats, r.next_offset) {
                Ok(records) => PartitionData::default()
                    .with_partition_index(partition)
                    .with_high_watermark(hw)
                    .with_last_stable_offset(hw)
                    .with_records(Some(records)),
                Err(e) => {
                    tracing::error!(error = %e, "cannot build a record batch");
                    failed(partition, ResponseError::CorruptMessage)
                }
            }
        }
        Body::ErrorResponse(e) => {
            let mut p = failed(partition, kafka_error(e.code));
            if let ErrorDetail::Trimmed { first_offset } = e.detail {
                p = p.with_log_start_offset(i64::try_from(first_offset.0).unwrap_or(-1));
            }
            p
        }
        other => failed(partition, unexpected(&other)),
    }
}

/// ListOffsets: the earliest offset (-2: where the log starts), the latest (-1: the high
/// watermark), the record with the largest timestamp (-3, KIP-734: [`max_timestamp`]), or
/// the first record at or after a timestamp (≥ 0, [`offset_for_time`]) of partition 0,
/// learned from fetch probes. Other negative timestamps (-4 and -5, tiered storage) are
/// `INVALID_REQUEST`.
async fn list_offsets<B: Backend>(backend: &B, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut topics = Vec::new();
    for topic in req.topics {
        let mut parts = Vec::new();
        for p in topic.partitions {
            let part = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_timestamp(-1)
                .with_leader_epoch(-1);
            let r = if p.partition_index != PARTITION {
                Err(ResponseError::UnknownTopicOrPartition)
            } else {
                match p.timestamp {
                    -2 => earliest_and_latest(backend, &topic.name.0)
                        .await
                        .map(|(e, _)| e),
                    -1 => earliest_and_latest(backend, &topic.name.0)
                        .await
                        .map(|(_, l)| l),
                    -3 => match max_timestamp(backend, &topic.name.0).await {
                        Ok(found) => {
                            let (offset, ts) = found.unwrap_or((-1, -1));
                            parts.push(part.with_offset(offset).with_timestamp(ts));
                            continue;
                        }
                        Err(e) => Err(e),
                    },
                    t if t >= 0 => match offset_for_time(backend, &topic.name.0, t).await {
                        Ok(found) => {
                            let (offset, ts) = found.unwrap_or((-1, -1));
                            parts.push(part.with_offset(offset).with_timestamp(ts));
                            continue;
                        }
                        Err(e) => Err(e),
                    },
                    _ => Err(ResponseError::InvalidRequest),
                }
            };
            parts.push(match r {
                Ok(offset) => part.with_offset(offset),
                Err(e) => part.with_offset(-1).with_error_code(e.code()),
            });
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(parts),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// The first record of `topic` whose timestamp is at least `target` (ms), as `(offset,
/// timestamp)`; `None` if no record is that late.
///
/// A binary search over the topic's offsets, one fetch of one record per step (about
/// 2·log₂ of the log's length): exact when the topic's timestamps do not go backwards
/// (Kafka's time index makes the same assumption, keeping the largest timestamp so far);
/// otherwise a record at or after the time, not always the first. A native message has
/// no timestamp and counts as earlier than any time.
async fn offset_for_time<B: Backend>(
    backend: &B,
    topic: &str,
    target: i64,
) -> Result<Option<(i64, i64)>, ResponseError> {
    let (first, end) = earliest_and_latest(backend, topic).await?;
    let (mut lo, mut hi) = (first.max(0).unsigned_abs(), end.max(0).unsigned_abs());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match first_record_at(backend, topic, mid).await? {
            Some((_, ts)) if ts >= target => hi = mid,
            Some((offset, _)) => lo = offset + 1,
            None => hi = mid,
        }
    }
    Ok(match first_record_at(backend, topic, lo).await? {
        Some((offset, ts)) if ts >= target => Some((i64::try_from(offset).unwrap_or(-1), ts)),
        _ => None,
    })
}

/// The record of `topic` with the largest timestamp, as `(offset, timestamp)` (ListOffsets
/// -3, KIP-734); `None` if the topic has no record.
///
/// Two binary searches, one fetch of one record per step: the topic's last record, then
/// ([`offset_for_time`]) the first record with that record's timestamp — Kafka answers the
/// first offset to reach the largest timestamp. Exact when the topic's timestamps do not go
/// backwards, as for [`offset_for_time`]. When the last message is a native one (no
/// timestamp), its offset with timestamp -1.
async fn max_timestamp<B: Backend>(
    backend: &B,
    topic: &str,
) -> Result<Option<(i64, i64)>, ResponseError> {
    let (first, end) = earliest_and_latest(backend, topic).await?;
    let first = first.max(0).unsigned_abs();
    // The smallest offset with no record of the topic at or after it.
    let (mut lo, mut hi) = (first, end.max(0).unsigned_abs());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match first_record_at(backend, topic, mid).await? {
            Some((offset, _)) => lo = offset + 1,
            None => hi = mid,
        }
    }
    if lo == first {
        return Ok(None);
    }
    let Some((last, ts)) = first_record_at(backend, topic, lo - 1).await? else {
        return Ok(None);
    };
    if ts < 0 {
        return Ok(Some((i64::try_from(last).unwrap_or(-1), -1)));
    }
    Ok(offset_for_time(backend, topic, ts)
        .await?
        .or(Some((i64::try_from(last).unwrap_or(-1), ts))))
}

/// The first record of `topic` at or after `from`: its offset and timestamp (-1 for a
/// native message); `None` if there is none yet.
async fn first_record_at<B: Backend>(
    backend: &B,
    topic: &str,
    from: u64,
) -> Result<Option<(u64, i64)>, ResponseError> {
    let answer = backend
        .call(
            quire_proto::FetchRequest {
                topic: topic.to_owned(),
                from_offset: Offset(from),
                max_messages: 1,
                max_bytes: 1,
                wait_ms: 0,
                records: true,
            }
            .into(),
        )
        .await;
    match answer {
        Body::FetchResponse(r) => Ok(r.messages.first().map(|(offset, bytes)| {
            let kafka = r.formats.first() == Some(&MessageFormat::Kafka);
            let ts = kafka
                .then(|| quire_proto::KafkaRecord::decode(bytes).ok())
                .flatten()
                .map_or(-1, |rec| rec.timestamp_ms);
            (offset.0, ts)
        })),
        other => Err(unexpected(&other)),
    }
}

/// `(first offset held, high watermark)` of the log `topic` is in.
async fn earliest_and_latest<B: Backend>(
    backend: &B,
    topic: &str,
) -> Result<(i64, i64), ResponseError> {
    if quire_proto::client::validate_topic(topic).is_err() {
        return Err(ResponseError::InvalidTopicException);
    }
    let probe = |from: u64| {
        backend.call(
            quire_proto::FetchRequest {
                topic: topic.to_owned(),
                from_offset: Offset(from),
                max_messages: 1,
                max_bytes: 1,
                wait_ms: 0,
                records: true,
            }
            .into(),
        )
    };
    let mut first = 0u64;
    let mut answer = probe(0).await;
    if let Body::ErrorResponse(e) = &answer {
        if let ErrorDetail::Trimmed { first_offset } = e.detail {
            first = first_offset.0;
            answer = probe(first).await;
        }
    }
    match answer {
        Body::FetchResponse(r) => Ok((
            i64::try_from(first).unwrap_or(i64::MAX),
            high_watermark(r.hwm),
        )),
        other => Err(unexpected(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(index: i32, len: usize) -> PartitionData {
        PartitionData::default()
            .with_partition_index(index)
            .with_high_watermark(100)
            .with_records(Some(Bytes::from(vec![0u8; len])))
    }

    #[test]
    fn a_fetch_answer_holds_max_bytes_but_always_the_first_records() {
        let sizes = |parts: &[PartitionData]| -> Vec<usize> {
            parts
                .iter()
                .map(|p| p.records.as_ref().map_or(0, Bytes::len))
                .collect()
        };
        // In the order asked: 600 fits, 500 would go over, the error stays, 300 fits.
        let mut parts = vec![
            part(0, 0),
            part(1, 600),
            part(2, 500),
            failed(3, ResponseError::UnknownTopicOrPartition),
            part(4, 300),
        ];
        within_max_bytes(&mut parts, 1000);
        assert_eq!(sizes(&parts), [0, 600, 0, 0, 300]);
        assert_eq!(parts[2].high_watermark, -1, "answered as not read");
        assert_eq!(parts[2].partition_index, 2);
        assert_eq!(
            parts[3].error_code,
            ResponseError::UnknownTopicOrPartition.code()
        );
        // The first partition with records keeps them, however large.
        let mut parts = vec![part(0, 5000), part(1, 10)];
        within_max_bytes(&mut parts, 1000);
        assert_eq!(sizes(&parts), [5000, 0]);
    }
}
