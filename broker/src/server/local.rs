//! [`LocalClient`]: requests to the broker's actor from inside the process, for listeners
//! that speak another protocol (the Kafka listener, quire-kafka).
//!
//! A request takes the path a client connection's request takes — the same broker-wide
//! produce byte budget and fetch answer budget, the same ACL check, the same actor and
//! engine — and its answer comes back as a [`Body`] instead of an encoded frame. Its
//! principal is `ANONYMOUS` unless the caller names one ([`LocalClient::acting_as`]: the
//! Kafka listener names the holder of a verified client certificate): with
//! `authorization = "acl"`, an `ANONYMOUS` caller may do only what entries for
//! `ANONYMOUS` (or `*`) allow.
//!
//! Bounds: at most [`LOCAL_REQUESTS_MAX`] requests of all callers wait for an answer at
//! once (callers wait beyond it). A fetch holds its share of `fetch_responses_bytes_max`
//! until the actor answers; the caller then owns the answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use quire_proto::{Body, ErrorCode, ErrorResponse, RequestId};
use tokio::sync::{mpsc, Semaphore};

use super::conn::{self, ConnShared, Permits, Request, Responder};
use crate::security::Principal;

/// Requests of in-process callers that wait for an answer at once, at most.
pub const LOCAL_REQUESTS_MAX: usize = 4096;

/// A handle that sends requests to the broker's actor from inside the process; cheap to
/// clone (clones share the bound).
#[derive(Clone, Debug)]
pub struct LocalClient {
    shared: ConnShared,
    requests: Arc<Semaphore>,
    /// Who the requests are made for (the ACL check's principal).
    principal: Principal,
}

impl LocalClient {
    pub(crate) fn new(shared: ConnShared) -> LocalClient {
        LocalClient {
            shared,
            requests: Arc::new(Semaphore::new(LOCAL_REQUESTS_MAX)),
            principal: Principal::Anonymous,
        }
    }

    /// Whether this client's principal may be a member of Kafka consumer group `group`
    /// ([`crate::security::authorize_group`]).
    #[must_use]
    pub fn group_allowed(&self, group: &str) -> bool {
        let shared = &self.shared;
        if !shared.auth.authorization {
            return true;
        }
        let tables = crate::security::current(&shared.security);
        crate::security::authorize_group(&shared.auth, &tables, &self.principal, group).is_ok()
    }

    /// The SCRAM-SHA-256 credential of `user` in the applied security tables.
    #[must_use]
    pub fn scram_credential(&self, user: &str) -> Option<quire_proto::ScramCredential> {
        crate::security::current(&self.shared.security)
            .credential(user)
            .cloned()
    }

    /// How long logins from `ip` stay refused (the broker-wide failed-login window shared
    /// with the native listener).
    #[must_use]
    pub fn login_blocked(&self, ip: std::net::IpAddr) -> Option<std::time::Duration> {
        self.shared
            .login_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .blocked(ip, Instant::now())
    }

    /// Counts a failed login from `ip`.
    pub fn login_failed(&self, ip: std::net::IpAddr) {
        self.shared
            .login_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .failed(ip, Instant::now());
    }

    /// The same client, its requests made for `principal` (sharing the bound).
    #[must_use]
    pub fn acting_as(&self, principal: Principal) -> LocalClient {
        LocalClient {
            principal,
            ..self.clone()
        }
    }

    /// Hands `body` (a client request: produce, fetch, metadata, cursor, commit …) to the
    /// actor as the broker takes it from a client connection, and resolves once it is in
    /// the actor's queue (requests submitted one after another are served in that order)
    /// to the answer still to come: the response body, or an [`ErrorResponse`] body
    /// (`NotMaster`, `Timeout`, `Unauthorized`, …; `ShuttingDown` once the actor has
    /// stopped).
    pub async fn submit(&self, body: Body) -> quire_kafka::Pending {
        fn answered(b: Body) -> quire_kafka::Pending {
            Box::pin(std::future::ready(b))
        }
        fn stopping() -> Body {
            ErrorResponse::new(ErrorCode::ShuttingDown, "the broker is stopping").into()
        }
        let stopped = || answered(stopping());
        let shared = &self.shared;
        if shared.auth.authorization {
            let tables = crate::security::current(&shared.security);
            if let Err(refusal) =
                crate::security::authorize(&shared.auth, &tables, &self.principal, &body)
            {
                shared.metrics.reject_frame("unauthorized");
                return answered(refusal.into());
            }
        }
        let Ok(request) = self.requests.clone().acquire_owned().await else {
            return stopped();
        };
        let produce_bytes = match &body {
            Body::ProduceRequest(p) => {
                let want = conn::produce_permit_bytes(p, shared.produce_bytes_max);
                match shared.produce_bytes.clone().acquire_many_owned(want).await {
                    Ok(p) => Some(p),
                    Err(_) => return stopped(),
                }
            }
            _ => None,
        };
        let shared_response_bytes = match &body {
            Body::FetchRequest(f) => {
                let bound = conn::fetch_response_bytes_max(
                    f,
                    shared.message_event_bytes_max.load(Ordering::Relaxed),
                );
                Some(shared.fetch_responses.acquire(bound).await)
            }
            _ => None,
        };
        let (tx, mut rx) = mpsc::channel(1);
        let req = Request {
            request_id: RequestId(1),
            body,
            reply: Responder::local(tx, shared.metrics.clone()),
            permits: Permits {
                request,
                _produce_bytes: produce_bytes,
                response_bytes: None,
                shared_response_bytes,
            },
            received: Instant::now(),
        };
        if shared.actor.send(req).await.is_err() {
            return stopped();
        }
        Box::pin(async move { rx.recv().await.unwrap_or_else(stopping) })
    }
}
