//! The admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeCluster and
//! DescribeConfigs, mapped onto the broker's topic-admin request (a topic-admin event
//! through the log, answered once stabilized) and its metadata.
//!
//! Kafka clients send CreateTopics and DeleteTopics to the controller, which Metadata names
//! as the master; another broker answers `NOT_CONTROLLER` and the client asks again.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterResponse,
    DescribeConfigsRequest, DescribeConfigsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use quire_proto::{Body, ErrorCode, TopicAction, TopicAdminRequest};

use crate::api::kafka_error;
use crate::{split_host_port, Backend, KafkaSettings};

type Refusal = (ResponseError, Option<String>);

/// The Kafka error for a refused topic change.
fn admin_error(code: ErrorCode) -> ResponseError {
    match code {
        ErrorCode::TopicExists => ResponseError::TopicAlreadyExists,
        ErrorCode::InvalidPartitions => ResponseError::InvalidPartitions,
        ErrorCode::UnknownTopic => ResponseError::UnknownTopicOrPartition,
        ErrorCode::NotMaster => ResponseError::NotController,
        ErrorCode::Unauthorized => ResponseError::ClusterAuthorizationFailed,
        other => kafka_error(other),
    }
}

/// Sends one topic change to the broker.
async fn change<B: Backend>(
    backend: &B,
    action: TopicAction,
    topic: &str,
    partitions: u32,
) -> Result<(), Refusal> {
    let req = TopicAdminRequest {
        action,
        topic: topic.to_owned(),
        partitions,
    };
    match backend.call(req.into()).await {
        Body::AdminResponse(_) => Ok(()),
        Body::ErrorResponse(e) => Err((admin_error(e.code), Some(e.message))),
        _ => Err((ResponseError::UnknownServerError, None)),
    }
}

/// The topics the answering broker's state holds, and whether it is the master.
async fn topics<B: Backend>(backend: &B, settings: &KafkaSettings) -> (Vec<String>, bool) {
    match backend
        .call(quire_proto::MetadataRequest { topics: true }.into())
        .await
    {
        Body::MetadataResponse(m) => (
            m.topics,
            m.master.is_some_and(|b| b.id.0 == settings.node_id),
        ),
        _ => (Vec::new(), false),
    }
}

/// Whether `name` is a topic name Kafka accepts (its `Topic.validate`): 1 to 249 ASCII
/// letters, digits, `.`, `_` and `-`, and neither `.` nor `..`. Quire's own names are
/// looser (any 255 bytes); topics a Kafka client creates keep to Kafka's, so that every
/// Kafka client can use them.
fn kafka_legal(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// CreateTopics: each topic created with one partition. A partition count other than 1
/// (or -1, the broker's default) is `INVALID_PARTITIONS`; topic configs are
/// `INVALID_CONFIG` (Quire has no per-topic settings: retention and sizes are the
/// brokers'); the replication factor is not checked (every store holds every topic).
/// `validate_only` checks the name, the count and that the topic does not exist.
pub(crate) async fn create_topics<B: Backend>(
    backend: &B,
    settings: &KafkaSettings,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let (existing, master) = if req.validate_only {
        topics(backend, settings).await
    } else {
        (Vec::new(), true)
    };
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let r: Result<(), Refusal> = if !kafka_legal(&name) {
            Err((
                ResponseError::InvalidTopicException,
                Some("a Kafka topic name is 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-', and not '.' or '..'".to_owned()),
            ))
        } else if !(t.num_partitions == -1 || t.num_partitions == 1) {
            Err((
                ResponseError::InvalidPartitions,
                Some(format!(
                    "{} partitions asked for: every topic is one partition in this version",
                    t.num_partitions
                )),
            ))
        } else if let Some(c) = t.configs.first() {
            Err((
                ResponseError::InvalidConfig,
                Some(format!(
                    "topic setting {:?} is not supported: retention and sizes are the brokers' settings",
                    c.name.to_string()
                )),
            ))
        } else if req.validate_only {
            if !master {
                Err((ResponseError::NotController, None))
            } else if existing.contains(&name) {
                Err((ResponseError::TopicAlreadyExists, None))
            } else {
                Ok(())
            }
        } else {
            change(backend, TopicAction::Create, &name, 1).await
        };
        let out = CreatableTopicResult::default().with_name(t.name);
        results.push(match r {
            Ok(()) => out.with_num_partitions(1).with_replication_factor(-1),
            Err((e, msg)) => out
                .with_error_code(e.code())
                .with_error_message(msg.map(StrBytes::from_string))
                .with_num_partitions(-1)
                .with_replication_factor(-1),
        });
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// DeleteTopics: each topic named deleted (by id, from version 6: `UNKNOWN_TOPIC_ID`,
/// Quire topics have no ids).
pub(crate) async fn delete_topics<B: Backend>(
    backend: &B,
    req: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let names: Vec<Option<TopicName>> = if version >= 6 {
        req.topics.into_iter().map(|t| t.name).collect()
    } else {
        req.topic_names.into_iter().map(Some).collect()
    };
    let mut responses = Vec::with_capacity(names.len());
    for name in names {
        let Some(name) = name else {
            responses.push(
                DeletableTopicResult::default()
                    .with_error_code(ResponseError::UnknownTopicId.code()),
            );
            continue;
        };
        let topic = name.0.to_string();
        let r = if quire_proto::validate_topic(&topic).is_err() {
            Err((ResponseError::InvalidTopicException, None))
        } else {
            change(backend, TopicAction::Delete, &topic, 0).await
        };
        let out = DeletableTopicResult::default().with_name(Some(name));
        responses.push(match r {
            Ok(()) => out,
            Err((e, msg)) => out
                .with_error_code(e.code())
                .with_error_message(msg.map(StrBytes::from_string)),
        });
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// CreatePartitions: refused for every topic (`INVALID_PARTITIONS`): a topic is one
/// partition in this version.
pub(crate) fn create_partitions(req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    CreatePartitionsResponse::default().with_results(
        req.topics
            .into_iter()
            .map(|t| {
                CreatePartitionsTopicResult::default()
                    .with_name(t.name)
                    .with_error_code(ResponseError::InvalidPartitions.code())
                    .with_error_message(Some(StrBytes::from_static_str(
                        "every topic is one partition in this version",
                    )))
            })
            .collect(),
    )
}

/// DescribeCluster: the cluster id, the master as controller, every broker with a Kafka
/// address.
pub(crate) async fn describe_cluster<B: Backend>(
    backend: &B,
    settings: &KafkaSettings,
) -> DescribeClusterResponse {
    let master = match backend
        .call(quire_proto::MetadataRequest::default().into())
        .await
    {
        Body::MetadataResponse(m) => m.master.map(|b| i32::from(b.id.0)),
        _ => None,
    };
    let brokers = settings
        .brokers
        .iter()
        .filter_map(|(id, addr)| {
            let (host, port) = split_host_port(addr)?;
            Some(
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(i32::from(*id)))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port),
            )
        })
        .collect();
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(settings.cluster_id.clone()))
        .with_controller_id(BrokerId(master.unwrap_or(-1)))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(i32::MIN)
}

/// Kafka's resource types in DescribeConfigs.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// Kafka's config source "default".
const SOURCE_DEFAULT: i8 = 5;

/// DescribeConfigs: a topic's settings are the brokers' (Quire has no per-topic ones), so
/// a topic shows `cleanup.policy=delete` (no compaction), read-only; a broker shows none.
/// A topic the broker does not hold is `UNKNOWN_TOPIC_OR_PARTITION`; other resource types
/// `INVALID_REQUEST`.
pub(crate) async fn describe_configs<B: Backend>(
    backend: &B,
    settings: &KafkaSettings,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let (known, _) = topics(backend, settings).await;
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let out = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match r.resource_type {
                RESOURCE_TOPIC if known.iter().any(|t| **t == *r.resource_name) => {
                    let wanted = |name: &str| {
                        r.configuration_keys
                            .as_ref()
                            .is_none_or(|keys| keys.iter().any(|k| &**k == name))
                    };
                    let configs = [("cleanup.policy", "delete")]
                        .into_iter()
                        .filter(|(n, _)| wanted(n))
                        .map(|(n, v)| {
                            DescribeConfigsResourceResult::default()
                                .with_name(StrBytes::from_static_str(n))
                                .with_value(Some(StrBytes::from_static_str(v)))
                                .with_read_only(true)
                                .with_config_source(SOURCE_DEFAULT)
                        })
                        .collect();
                    out.with_configs(configs)
                }
                RESOURCE_TOPIC => {
                    out.with_error_code(ResponseError::UnknownTopicOrPartition.code())
                }
                RESOURCE_BROKER => out,
                _ => out.with_error_code(ResponseError::InvalidRequest.code()),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka() {
        for good in ["orders", "a.b_c-D9", &"x".repeat(249)] {
            assert!(kafka_legal(good), "{good}");
        }
        for bad in ["", ".", "..", "bad name", "x/y", "é", &"x".repeat(250)] {
            assert!(!kafka_legal(bad), "{bad}");
        }
    }
}
