//! [`ErrorResponse`]: the body any peer may answer any request with, carrying a stable
//! [`ErrorCode`], a human-readable message and, for the codes that need one, a typed
//! [`ErrorDetail`].

use crate::client::BrokerInfo;
use crate::codec::{BodyWriter, Reader};
use crate::error::{ErrorCode, WireError};
use crate::limits::ERROR_MESSAGE_BYTES_MAX;
use crate::types::{Epoch, Incarnation, LogId, Offset, StoreId};

/// Typed facts that go with some error codes.
///
/// ```text
/// 1      detail tag            u8: 0 None, 1 NotVoter, 2 NotMaster, 3 Trimmed
/// NotVoter:  8 store_id u64, 8 incarnation u64
/// NotMaster: 8 epoch u64, then Option<BrokerInfo> (tag u8; id u16, addr string)
/// Trimmed:   8 first_offset u64
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ErrorDetail {
    /// No detail.
    #[default]
    None,
    /// With [`ErrorCode::NotVoter`]: the store's identity on its new incarnation. A broker
    /// must not count this store toward a fence quorum or Qa.
    NotVoter {
        /// The store's identity.
        store_id: StoreId,
        /// Its (new) incarnation.
        incarnation: Incarnation,
    },
    /// With [`ErrorCode::NotMaster`]: who the master is, as far as this broker knows.
    NotMaster {
        /// Highest epoch this broker knows.
        epoch: Epoch,
        /// The master, if known.
        master: Option<BrokerInfo>,
    },
    /// With [`ErrorCode::Trimmed`]: where the log now starts.
    Trimmed {
        /// The lowest offset still held; reads can start here.
        first_offset: Offset,
    },
    /// With [`ErrorCode::Corrupt`]: the record that failed its checks on the answering
    /// store.
    Corrupt {
        /// Its offset: the records before it were returned good, if any were asked for.
        offset: Offset,
    },
}

/// Any peer → requester: the request failed.
///
/// A response with [`crate::RequestId::CONNECTION`] (0) is about the connection as a whole
/// (typically a framing error), sent just before the sender closes it.
///
/// ```text
/// off   size   field
/// 0     2      code                  u16 (ErrorCode)
/// 2     2+n    message               string ≤ ERROR_MESSAGE_BYTES_MAX
/// ..    1+…    detail                ErrorDetail
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorResponse {
    /// What failed, as a stable number.
    pub code: ErrorCode,
    /// For people; never parsed. At most [`ERROR_MESSAGE_BYTES_MAX`] bytes.
    pub message: String,
    /// Typed facts for codes that carry them.
    pub detail: ErrorDetail,
}

impl ErrorResponse {
    /// An error without detail; `message` is cut at a character boundary to at most
    /// [`ERROR_MESSAGE_BYTES_MAX`] bytes.
    #[must_use]
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorResponse {
        let mut message = message.into();
        if message.len() > ERROR_MESSAGE_BYTES_MAX {
            let mut end = ERROR_MESSAGE_BYTES_MAX;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        ErrorResponse {
            code,
            message,
            detail: ErrorDetail::None,
        }
    }

    /// A store's answer to a fence once it is on a new incarnation.
    #[must_use]
    pub fn not_voter(store_id: StoreId, incarnation: Incarnation) -> ErrorResponse {
        ErrorResponse {
            detail: ErrorDetail::NotVoter {
                store_id,
                incarnation,
            },
            ..ErrorResponse::new(
                ErrorCode::NotVoter,
                format!(
                    "store {} incarnation {} is not a voter (new incarnation)",
                    store_id.0, incarnation.0
                ),
            )
        }
    }

    /// The answer to a frame about a log this peer does not host or serve
    /// ([`ErrorCode::UnknownLog`]); sent under the request's own log id.
    #[must_use]
    pub fn unknown_log(log: LogId) -> ErrorResponse {
        ErrorResponse::new(
            ErrorCode::UnknownLog,
            format!("log {log} is not served here (this build serves log 0 only)"),
        )
    }

    /// A non-master broker's answer to a client request.
    #[must_use]
    pub fn not_master(epoch: Epoch, master: Option<BrokerInfo>) -> ErrorResponse {
        let message = match &master {
            Some(m) => format!("not the master; broker {} at {} is", m.id.0, m.addr),
            None => "not the master; master unknown".to_owned(),
        };
        ErrorResponse {
            detail: ErrorDetail::NotMaster { epoch, master },
            ..ErrorResponse::new(ErrorCode::NotMaster, message)
        }
    }

    /// The answer to a read of `requested`, which retention deleted; the log now starts at
    /// `first_offset`.
    #[must_use]
    pub fn trimmed(requested: Offset, first_offset: Offset) -> ErrorResponse {
        ErrorResponse {
            detail: ErrorDetail::Trimmed { first_offset },
            ..ErrorResponse::new(
                ErrorCode::Trimmed,
                format!(
                    "offset {} was trimmed by retention; the log starts at {}",
                    requested.0, first_offset.0
                ),
            )
        }
    }

    /// A store's answer to a read whose first record fails its checks on its disk: the
    /// record at `offset` is damaged here and must be read from another store.
    #[must_use]
    pub fn corrupt(offset: Offset, problem: impl std::fmt::Display) -> ErrorResponse {
        ErrorResponse {
            detail: ErrorDetail::Corrupt { offset },
            ..ErrorResponse::new(
                ErrorCode::Corrupt,
                format!(
                    "the record at offset {} is corrupt on this store ({problem}); read it from another store",
                    offset.0
                ),
            )
        }
    }

    /// The answer to a frame that failed to decode with `error`.
    #[must_use]
    pub fn from_wire_error(error: &WireError) -> ErrorResponse {
        ErrorResponse::new(error.error_code(), error.to_string())
    }

    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u16(self.code.as_u16());
        w.string("error message", &self.message, ERROR_MESSAGE_BYTES_MAX)?;
        match &self.detail {
            ErrorDetail::None => w.u8(0),
            ErrorDetail::NotVoter {
                store_id,
                incarnation,
            } => {
                w.u8(1);
                w.u64(store_id.0);
                w.u64(incarnation.0);
            }
            ErrorDetail::NotMaster { epoch, master } => {
                w.u8(2);
                w.u64(epoch.0);
                BrokerInfo::write_opt(master.as_ref(), w)?;
            }
            ErrorDetail::Trimmed { first_offset } => {
                w.u8(3);
                w.u64(first_offset.0);
            }
            ErrorDetail::Corrupt { offset } => {
                w.u8(4);
                w.u64(offset.0);
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let code = r.u16("error code")?;
        let code = ErrorCode::from_u16(code).ok_or(WireError::UnknownErrorCode { code })?;
        let message = r.string("error message", ERROR_MESSAGE_BYTES_MAX)?;
        let field = "error detail";
        let detail = match r.u8(field)? {
            0 => ErrorDetail::None,
            1 => ErrorDetail::NotVoter {
                store_id: StoreId(r.u64(field)?),
                incarnation: Incarnation(r.u64(field)?),
            },
            2 => ErrorDetail::NotMaster {
                epoch: r.epoch(field)?,
                master: BrokerInfo::read_opt(r)?,
            },
            3 => ErrorDetail::Trimmed {
                first_offset: Offset(r.u64(field)?),
            },
            4 => ErrorDetail::Corrupt {
                offset: Offset(r.u64(field)?),
            },
            byte => return Err(WireError::InvalidTag { field, byte }),
        };
        Ok(ErrorResponse {
            code,
            message,
            detail,
        })
    }
}
