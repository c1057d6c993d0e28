//! The group coordinator's requests: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups.
//!
//! The coordinator of every group is the master (one log, one master): FindCoordinator
//! names the master's Kafka address, and any other broker answers the group requests with
//! `NOT_COORDINATOR`, after which clients ask FindCoordinator again. Membership is the
//! master listener's memory ([`crate::group`]); a committed offset is a cursor of the
//! broker state — cursor name = group id, one per topic — committed through the log, so
//! it is stabilized on a quorum of stores before OffsetCommit is answered and survives
//! any failover. The offset is Kafka's: the next offset the group will read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use quire_proto::{Body, Offset};

use crate::api::{kafka_error, PARTITION};
use crate::group::{Answer, GroupState, Join, Joined, Synced};
use crate::{split_host_port, Backend, Client, Listener};

/// How long a JoinGroup or SyncGroup waits for the rest of the group beyond the member's
/// rebalance timeout, at most, before it is answered `REBALANCE_IN_PROGRESS`.
const WAIT_SLACK: Duration = Duration::from_secs(5);
/// How long a SyncGroup waits for the leader's assignment, at most.
const SYNC_WAIT_MAX: Duration = Duration::from_secs(300);
/// How often the coordinator looks for expired sessions and rebalance deadlines.
pub(crate) const TICK: Duration = Duration::from_millis(200);

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// The master epoch if this broker is the master (so the coordinator), else
/// `NOT_COORDINATOR` (`COORDINATOR_NOT_AVAILABLE` if the broker cannot say).
async fn coordinator_epoch<B: Backend>(
    backend: &B,
    listener: &Listener,
) -> Result<u64, ResponseError> {
    match backend
        .call(quire_proto::MetadataRequest::default().into())
        .await
    {
        Body::MetadataResponse(m) => match m.master {
            Some(b) if b.id.0 == listener.settings.node_id => {
                listener.groups().coordinate_in(m.epoch.0);
                Ok(m.epoch.0)
            }
            _ => Err(ResponseError::NotCoordinator),
        },
        _ => Err(ResponseError::CoordinatorNotAvailable),
    }
}

/// FindCoordinator: for a group (key type 0), the master's Kafka address; for a
/// transactional id, `TRANSACTIONAL_ID_AUTHORIZATION_FAILED` (no transactions).
pub(crate) async fn find_coordinator<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: &FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let master = match backend
        .call(quire_proto::MetadataRequest::default().into())
        .await
    {
        Body::MetadataResponse(m) => m.master.map(|b| b.id.0),
        _ => None,
    };
    let found = master.and_then(|id| {
        let (_, addr) = listener.settings.brokers.iter().find(|(b, _)| *b == id)?;
        let (host, port) = split_host_port(addr)?;
        Some((id, host, port))
    });
    let answer = |key_type: i8| -> Result<(u16, String, i32), (ResponseError, &'static str)> {
        if key_type != 0 {
            // Not COORDINATOR_NOT_AVAILABLE, which clients retry until their own timeout
            // (init_transactions() then fails with a bare _TIMED_OUT): an error they take
            // as fatal, with this message (found by a new-user trial).
            return Err((
                ResponseError::TransactionalIdAuthorizationFailed,
                "transactions are not supported (docs/kafka.md)",
            ));
        }
        found.clone().ok_or((
            ResponseError::CoordinatorNotAvailable,
            "no master with a Kafka listener is known",
        ))
    };
    if version >= 4 {
        let coordinators = req
            .coordinator_keys
            .iter()
            .map(|k| {
                let c = Coordinator::default().with_key(k.clone());
                match answer(req.key_type) {
                    Ok((id, host, port)) => c
                        .with_node_id(BrokerId(i32::from(id)))
                        .with_host(s(&host))
                        .with_port(port),
                    Err((e, why)) => c
                        .with_node_id(BrokerId(-1))
                        .with_port(-1)
                        .with_error_code(e.code())
                        .with_error_message(Some(StrBytes::from_static_str(why))),
                }
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    match answer(req.key_type) {
        Ok((id, host, port)) => FindCoordinatorResponse::default()
            .with_node_id(BrokerId(i32::from(id)))
            .with_host(s(&host))
            .with_port(port),
        Err((e, why)) => {
            let r = FindCoordinatorResponse::default()
                .with_error_code(e.code())
                .with_node_id(BrokerId(-1))
                .with_port(-1);
            if version >= 1 {
                r.with_error_message(Some(StrBytes::from_static_str(why)))
            } else {
                r
            }
        }
    }
}

/// The group id of a group request this broker coordinates, or why it cannot serve it
/// (`NOT_COORDINATOR`, `COORDINATOR_NOT_AVAILABLE`, `INVALID_GROUP_ID`).
async fn coordinated_group<B: Backend>(
    backend: &B,
    listener: &Listener,
    g: &GroupId,
) -> Result<String, ResponseError> {
    coordinator_epoch(backend, listener).await?;
    let id = group_id(g)?;
    if !backend.group_allowed(&id) {
        return Err(ResponseError::GroupAuthorizationFailed);
    }
    Ok(id)
}

/// The Kafka error for a cursor request's error answer: a broker that is no longer the
/// master is no longer the coordinator.
fn cursor_error(answer: &Body) -> ResponseError {
    match answer {
        Body::ErrorResponse(e) if e.code == quire_proto::ErrorCode::NotMaster => {
            ResponseError::NotCoordinator
        }
        Body::ErrorResponse(e) => kafka_error(e.code),
        _ => ResponseError::UnknownServerError,
    }
}

/// The group id as a cursor name, or `INVALID_GROUP_ID`.
fn group_id(g: &GroupId) -> Result<String, ResponseError> {
    let id = g.0.to_string();
    quire_proto::client::validate_cursor(&id).map_err(|_| ResponseError::InvalidGroupId)?;
    Ok(id)
}

/// Waits for an answer to come, at most `wait`; `timed_out` if none came.
async fn await_answer<T>(answer: Answer<T>, wait: Duration, timed_out: impl FnOnce() -> T) -> T {
    match answer {
        Answer::Now(t) => t,
        Answer::Later(rx) => match tokio::time::timeout(wait, rx).await {
            Ok(Ok(t)) => t,
            _ => timed_out(),
        },
    }
}

/// JoinGroup: answered when the group's join phase ends (every member joined again, or
/// the rebalance timeout passed).
pub(crate) async fn join_group<B: Backend>(
    backend: &B,
    listener: &Listener,
    client: &Client,
    req: JoinGroupRequest,
    version: i16,
) -> JoinGroupResponse {
    let member = req.member_id.to_string();
    let joined = match coordinated_group(backend, listener, &req.group_id).await {
        Err(e) => Joined {
            error: Some(e),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member,
            members: Vec::new(),
        },
        Ok(group) => {
            let wait = Duration::from_millis(
                req.rebalance_timeout_ms
                    .max(req.session_timeout_ms)
                    .max(0)
                    .unsigned_abs()
                    .into(),
            ) + WAIT_SLACK;
            let join = Join {
                group,
                member_id: member.clone(),
                instance_id: req.group_instance_id.map(|i| i.to_string()),
                client_id: client.id.clone(),
                client_host: client.host.clone(),
                session_timeout_ms: req.session_timeout_ms,
                rebalance_timeout_ms: if version == 0 {
                    req.session_timeout_ms
                } else {
                    req.rebalance_timeout_ms
                },
                protocol_type: req.protocol_type.to_string(),
                protocols: req
                    .protocols
                    .into_iter()
                    .map(|p| (p.name.to_string(), p.metadata))
                    .collect(),
                member_id_required: version >= 4,
            };
            let answer = listener.groups().join(join, Instant::now());
            await_answer(answer, wait, || Joined {
                error: Some(ResponseError::RebalanceInProgress),
                generation: -1,
                protocol_type: None,
                protocol_name: None,
                leader: String::new(),
                member_id: member,
                members: Vec::new(),
            })
            .await
        }
    };
    JoinGroupResponse::default()
        .with_error_code(joined.error.map_or(0, |e| e.code()))
        .with_generation_id(joined.generation)
        .with_protocol_type(joined.protocol_type.as_deref().map(s))
        .with_protocol_name(Some(s(joined.protocol_name.as_deref().unwrap_or(""))))
        .with_leader(s(&joined.leader))
        .with_member_id(s(&joined.member_id))
        .with_members(
            joined
                .members
                .into_iter()
                .map(|(id, instance, metadata)| {
                    JoinGroupResponseMember::default()
                        .with_member_id(s(&id))
                        .with_group_instance_id(instance.as_deref().map(s))
                        .with_metadata(metadata)
                })
                .collect(),
        )
}

/// SyncGroup: the leader's assignments handed to every member of the generation.
pub(crate) async fn sync_group<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: SyncGroupRequest,
) -> SyncGroupResponse {
    let synced = match coordinated_group(backend, listener, &req.group_id).await {
        Err(e) => Answer::Now(error_synced(e)),
        Ok(group) => listener.groups().sync(
            &group,
            req.generation_id,
            &req.member_id,
            req.assignments
                .into_iter()
                .map(|a| (a.member_id.to_string(), a.assignment))
                .collect(),
            Instant::now(),
        ),
    };
    let synced = await_answer(synced, SYNC_WAIT_MAX, || {
        error_synced(ResponseError::RebalanceInProgress)
    })
    .await;
    SyncGroupResponse::default()
        .with_error_code(synced.error.map_or(0, |e| e.code()))
        .with_protocol_type(synced.protocol_type.as_deref().map(s))
        .with_protocol_name(synced.protocol_name.as_deref().map(s))
        .with_assignment(synced.assignment)
}

fn error_synced(e: ResponseError) -> Synced {
    Synced {
        error: Some(e),
        protocol_type: None,
        protocol_name: None,
        assignment: bytes::Bytes::new(),
    }
}

/// Heartbeat.
pub(crate) async fn heartbeat<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: &HeartbeatRequest,
) -> HeartbeatResponse {
    let error = match coordinated_group(backend, listener, &req.group_id).await {
        Err(e) => Some(e),
        Ok(group) => {
            listener
                .groups()
                .heartbeat(&group, req.generation_id, &req.member_id, Instant::now())
        }
    };
    HeartbeatResponse::default().with_error_code(error.map_or(0, |e| e.code()))
}

/// LeaveGroup: one member (versions 0–2) or several (3 and later).
pub(crate) async fn leave_group<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: &LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let members: Vec<String> = if version >= 3 {
        req.members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect()
    } else {
        vec![req.member_id.to_string()]
    };
    let results = match coordinated_group(backend, listener, &req.group_id).await {
        Err(e) => {
            return LeaveGroupResponse::default().with_error_code(e.code());
        }
        Ok(group) => listener.groups().leave(&group, &members, Instant::now()),
    };
    if version < 3 {
        return LeaveGroupResponse::default()
            .with_error_code(results.first().copied().flatten().map_or(0, |e| e.code()));
    }
    LeaveGroupResponse::default().with_members(
        req.members
            .iter()
            .zip(results)
            .map(|(m, e)| {
                MemberResponse::default()
                    .with_member_id(m.member_id.clone())
                    .with_group_instance_id(m.group_instance_id.clone())
                    .with_error_code(e.map_or(0, |e| e.code()))
            })
            .collect(),
    )
}

/// OffsetCommit: each partition's offset as the cursor `group` of its topic, committed
/// through the log (answered once stabilized).
pub(crate) async fn offset_commit<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let refused = match coordinated_group(backend, listener, &req.group_id).await {
        Err(e) => Err(e),
        Ok(group) => match listener.groups().may_commit(
            &group,
            req.generation_id_or_member_epoch,
            &req.member_id,
            Instant::now(),
        ) {
            Some(e) => Err(e),
            None => Ok(group),
        },
    };
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let error = match &refused {
                Err(e) => Some(*e),
                Ok(group) => {
                    commit_one(backend, group, &name, p.partition_index, p.committed_offset).await
                }
            };
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error.map_or(0, |e| e.code())),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    OffsetCommitResponse::default().with_topics(topics)
}

async fn commit_one<B: Backend>(
    backend: &B,
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Option<ResponseError> {
    if partition != PARTITION {
        return Some(ResponseError::UnknownTopicOrPartition);
    }
    if quire_proto::client::validate_topic(topic).is_err() {
        return Some(ResponseError::InvalidTopicException);
    }
    let Ok(offset) = u64::try_from(offset) else {
        return Some(ResponseError::InvalidCommitOffsetSize);
    };
    let answer = backend
        .call(
            quire_proto::CommitCursorRequest {
                topic: topic.to_owned(),
                cursor: group.to_owned(),
                offset: Offset(offset),
            }
            .into(),
        )
        .await;
    match answer {
        Body::CommitCursorResponse(_) => None,
        other => Some(cursor_error(&other)),
    }
}

/// OffsetFetch (versions 1–7: one group): each partition's committed offset, -1 for none.
/// Asked for all topics (a null list: the admin client's `list_consumer_group_offsets`
/// without partitions), it answers every topic the group has committed an offset in: each
/// topic the broker state holds is asked for the group's cursor, and those with none are
/// left out.
pub(crate) async fn offset_fetch<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let refused = coordinated_group(backend, listener, &req.group_id).await;
    let asked: Vec<(TopicName, Vec<i32>)> = match (req.topics, &refused) {
        (Some(topics), _) => topics
            .into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect(),
        (None, Err(_)) => Vec::new(),
        (None, Ok(group)) => committed_topics(backend, group).await,
    };
    let mut topics = Vec::new();
    for (topic_name, partition_indexes) in asked {
        let name = topic_name.0.to_string();
        let mut partitions = Vec::with_capacity(partition_indexes.len());
        for p in partition_indexes {
            let r = match &refused {
                Err(e) => Err(*e),
                Ok(group) => fetch_one(backend, group, &name, p).await,
            };
            let part = OffsetFetchResponsePartition::default()
                .with_partition_index(p)
                .with_committed_leader_epoch(-1)
                .with_metadata(Some(StrBytes::default()));
            partitions.push(match r {
                Ok(offset) => part.with_committed_offset(offset),
                Err(e) => part.with_committed_offset(-1).with_error_code(e.code()),
            });
        }
        topics.push(
            OffsetFetchResponseTopic::default()
                .with_name(topic_name)
                .with_partitions(partitions),
        );
    }
    let resp = OffsetFetchResponse::default().with_topics(topics);
    match refused {
        Err(e) if version >= 2 => resp.with_error_code(e.code()),
        _ => resp,
    }
}

/// The topics in which `group` has a committed offset (its partition 0), in the broker
/// state's topic order.
async fn committed_topics<B: Backend>(backend: &B, group: &str) -> Vec<(TopicName, Vec<i32>)> {
    let names = match backend
        .call(quire_proto::MetadataRequest { topics: true }.into())
        .await
    {
        Body::MetadataResponse(m) => m.topics,
        _ => Vec::new(),
    };
    let mut committed = Vec::new();
    for name in names {
        if matches!(fetch_one(backend, group, &name, PARTITION).await, Ok(o) if o >= 0) {
            committed.push((TopicName(StrBytes::from_string(name)), vec![PARTITION]));
        }
    }
    committed
}

async fn fetch_one<B: Backend>(
    backend: &B,
    group: &str,
    topic: &str,
    partition: i32,
) -> Result<i64, ResponseError> {
    if partition != PARTITION {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    if quire_proto::client::validate_topic(topic).is_err() {
        return Err(ResponseError::InvalidTopicException);
    }
    let answer = backend
        .call(
            quire_proto::CursorRequest {
                topic: topic.to_owned(),
                cursor: group.to_owned(),
            }
            .into(),
        )
        .await;
    match answer {
        Body::CursorResponse(r) => Ok(r
            .offset
            .map_or(-1, |o| i64::try_from(o.0).unwrap_or(i64::MAX))),
        other => Err(cursor_error(&other)),
    }
}

/// ListGroups: the groups with members this broker coordinates (none on a broker that is
/// not the master).
pub(crate) async fn list_groups<B: Backend>(
    backend: &B,
    listener: &Listener,
) -> ListGroupsResponse {
    if coordinator_epoch(backend, listener).await.is_err() {
        return ListGroupsResponse::default();
    }
    let groups = listener
        .groups()
        .list()
        .into_iter()
        .filter(|(id, _, _)| backend.group_allowed(id))
        .map(|(id, protocol_type, state)| {
            ListedGroup::default()
                .with_group_id(GroupId(s(&id)))
                .with_protocol_type(s(&protocol_type))
                .with_group_state(StrBytes::from_static_str(state.name()))
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

/// Bytes of member metadata and assignments one DescribeGroups answer carries, at most:
/// a group that would take it past this is answered `POLICY_VIOLATION` (ask for fewer
/// groups at a time), and so are the groups after it.
pub const DESCRIBE_BYTES_MAX: usize = 32 << 20;

/// DescribeGroups: each group's state, protocol and members; a group named twice is
/// answered once.
pub(crate) async fn describe_groups<B: Backend>(
    backend: &B,
    listener: &Listener,
    req: &DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let coordinator = coordinator_epoch(backend, listener).await;
    let mut seen = std::collections::HashSet::new();
    let mut bytes = 0usize;
    let groups = req
        .groups
        .iter()
        .filter(|g| seen.insert(g.0.clone()))
        .map(|g| {
            let out = DescribedGroup::default().with_group_id(g.clone());
            if let Err(e) = coordinator {
                return out.with_error_code(e.code());
            }
            if !backend.group_allowed(&g.0) {
                return out.with_error_code(ResponseError::GroupAuthorizationFailed.code());
            }
            let d = listener.groups().describe(&g.0);
            bytes += d
                .members
                .iter()
                .map(|m| m.metadata.len() + m.assignment.len())
                .sum::<usize>();
            if bytes > DESCRIBE_BYTES_MAX {
                return out.with_error_code(ResponseError::PolicyViolation.code());
            }
            let state = if d.members.is_empty() {
                GroupState::Empty
            } else {
                d.state
            };
            out.with_group_state(StrBytes::from_static_str(state.name()))
                .with_protocol_type(s(&d.protocol_type))
                .with_protocol_data(s(&d.protocol))
                .with_members(
                    d.members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(s(&m.member_id))
                                .with_group_instance_id(m.instance_id.as_deref().map(s))
                                .with_client_id(s(&m.client_id))
                                .with_client_host(s(&m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

/// Runs the coordinator's clock: expired sessions and rebalance deadlines, every
/// [`TICK`], for as long as the listener lives.
pub(crate) async fn run_clock(listener: Arc<Listener>) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        listener.groups().tick(Instant::now());
    }
}
