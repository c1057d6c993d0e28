//! The store engine's submissions on their way through the WAL: shared by the tokio store
//! actor ([`crate::store`]) and quire-sim's store driver, so both run the same steps from
//! [`crate::engine::Command::Submit`] to [`Engine::resolved`].
//!
//! A submission becomes one or more WAL appends ([`split_for_segments`]: one WAL append
//! must fit in one segment, a catch-up append may be larger than a small one). The WAL
//! resolves appends in the order they were made, each after the fdatasync that covers it
//! (group commit: one fdatasync may resolve many). A submission is reported to the engine
//! once: failed at its first failed append, durable once its last append is.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

use quire_proto::{Body, Epoch, ErrorCode, ErrorResponse, Event, RejectReason};
use quire_wal::format::{record_bytes, HEADER_BYTES};
use quire_wal::{Append, Storage, Wal, WalError};

use crate::engine::{Engine, StoreLog};

/// One WAL append (a part of engine submission `seq`) on its way to durability.
#[derive(Debug)]
struct Part {
    seq: u64,
    /// The last WAL append of submission `seq`.
    last: bool,
    state: PartState,
}

#[derive(Debug)]
enum PartState {
    Pending(Append),
    Done(Option<Result<(), WalError>>),
}

/// The WAL appends in flight, oldest first. See the module docs.
#[derive(Debug, Default)]
pub struct Submissions {
    parts: VecDeque<Part>,
    /// The highest submission reported to the engine.
    reported: u64,
}

impl Submissions {
    /// No submission in flight.
    #[must_use]
    pub fn new() -> Submissions {
        Submissions::default()
    }

    /// Whether no WAL append is in flight.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Hands engine submission `seq` (entries of master epoch `epoch`) to `wal`. A WAL
    /// append refused at once (validation, a failed log, a full queue: nothing of it is
    /// written; parts before it are, and the master resends what it has no ack for) is
    /// answered through [`Engine::refused`] with [`refusal`].
    pub fn submit<S: Storage, T>(
        &mut self,
        engine: &mut Engine<T>,
        wal: &Wal<S>,
        seq: u64,
        epoch: Epoch,
        events: Vec<Event>,
    ) {
        let chunks = split_for_segments(events, wal.segment_bytes(), wal.alignment_bytes());
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let mut append = wal.append(epoch, chunk);
            if let Some(e) = append.refused_at_once() {
                let body = refusal(engine, wal, &e);
                engine.refused(seq, body);
                self.parts.push_back(Part {
                    seq,
                    last: true,
                    state: PartState::Done(Some(Ok(()))),
                });
                return;
            }
            let state = PartState::Pending(append);
            self.parts.push_back(Part {
                seq,
                last: i + 1 == n,
                state,
            });
        }
    }

    /// Reports to `engine`, in order, every WAL append that has resolved, stopping at the
    /// first one still pending. Returns how many WAL appends it took (the group-commit
    /// size when called right after a completion).
    pub fn report_ready<S: Storage, T>(&mut self, engine: &mut Engine<T>, wal: &Wal<S>) -> u64 {
        let mut taken = 0;
        while let Some(front) = self.parts.front_mut() {
            let result = match &mut front.state {
                PartState::Pending(a) => a.try_result().map(|r| r.map(|_| ())),
                PartState::Done(r) => r.take(),
            };
            let Some(result) = result else { break };
            let (seq, last) = (front.seq, front.last);
            self.parts.pop_front();
            taken += 1;
            self.report(engine, wal, seq, last, &result);
        }
        taken
    }

    /// Waits until the oldest WAL append has resolved (then [`Submissions::report_ready`]
    /// takes it). Pending forever if none is in flight.
    pub async fn oldest_resolved(&mut self) {
        poll_fn(|cx| {
            let Some(front) = self.parts.front_mut() else {
                return Poll::Pending;
            };
            match &mut front.state {
                PartState::Pending(a) => match Pin::new(a).poll(cx) {
                    Poll::Ready(r) => {
                        front.state = PartState::Done(Some(r.map(|_| ())));
                        Poll::Ready(())
                    }
                    Poll::Pending => Poll::Pending,
                },
                PartState::Done(_) => Poll::Ready(()),
            }
        })
        .await;
    }

    fn report<S: Storage, T>(
        &mut self,
        engine: &mut Engine<T>,
        wal: &Wal<S>,
        seq: u64,
        last: bool,
        result: &Result<(), WalError>,
    ) {
        if seq <= self.reported {
            return;
        }
        match result {
            Err(e) => {
                tracing::error!(error = %e, "WAL append failed: the log is failed and takes no more appends");
            }
            Ok(()) if !last => return,
            Ok(()) => {}
        }
        self.reported = seq;
        engine.resolved(seq, result.is_ok(), wal);
    }
}

/// The answer to an append the WAL refused at once with `e`: a failed log or a full queue
/// are the engine's rejections (the master's cue to go elsewhere or back off); an entry too
/// large is malformed; anything else is an internal error (the engine validated the
/// append, so the WAL should not refuse it).
pub fn refusal<T>(engine: &Engine<T>, log: &impl StoreLog, e: &WalError) -> Body {
    match e {
        WalError::Failed { .. } => engine.rejected(RejectReason::LogFailed, log).into(),
        WalError::TooLarge { what: "queue", .. } => {
            engine.rejected(RejectReason::Overloaded, log).into()
        }
        WalError::Closed => {
            ErrorResponse::new(ErrorCode::ShuttingDown, "the store is shutting down").into()
        }
        WalError::TooLarge { .. } => ErrorResponse::new(ErrorCode::Malformed, e.to_string()).into(),
        _ => {
            tracing::error!(error = %e, "the WAL refused an accepted append");
            ErrorResponse::new(ErrorCode::Internal, e.to_string()).into()
        }
    }
}

/// Splits `records` into runs that each fit one WAL append: a run's records plus a possible
/// truncation marker (one header), padded to `align_bytes`, stay within `segment_bytes`. A
/// record too large for any segment is a run of its own (the WAL refuses it as too large).
fn split_for_segments(
    records: Vec<Event>,
    segment_bytes: u64,
    align_bytes: u64,
) -> Vec<Vec<Event>> {
    // Padding to the alignment adds less than `align_bytes`.
    let budget = segment_bytes
        .saturating_sub(align_bytes)
        .saturating_sub(HEADER_BYTES as u64);
    let mut runs: Vec<Vec<Event>> = Vec::new();
    let mut run: Vec<Event> = Vec::new();
    let mut run_bytes = 0u64;
    for r in records {
        let bytes = record_bytes(r.payload.len()) as u64;
        if !run.is_empty() && run_bytes + bytes > budget {
            runs.push(std::mem::take(&mut run));
            run_bytes = 0;
        }
        run_bytes += bytes;
        run.push(r);
    }
    if !run.is_empty() {
        runs.push(run);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::EventKind;

    fn records(sizes: &[usize]) -> Vec<Event> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Event {
                epoch: quire_proto::Epoch(1),
                offset: quire_proto::Offset(i as u64),
                kind: EventKind::Message,
                payload: bytes::Bytes::from(vec![0u8; n]).into(),
            })
            .collect()
    }

    fn run_lengths(runs: &[Vec<Event>]) -> Vec<usize> {
        runs.iter().map(Vec::len).collect()
    }

    #[test]
    fn runs_fit_a_segment_with_room_for_a_marker_and_padding() {
        // 64 KiB segments, 4 KiB alignment: a budget of 60 KiB - 32 bytes per run.
        let seg = 64 * 1024;
        let runs = split_for_segments(records(&[3_000; 50]), seg, 4096);
        for run in &runs {
            let bytes: usize = run.iter().map(|r| record_bytes(r.payload.len())).sum();
            assert!((bytes + HEADER_BYTES) as u64 <= seg - 4096, "{bytes}");
        }
        assert_eq!(run_lengths(&runs).iter().sum::<usize>(), 50);
        // Offsets stay in order across runs.
        let offsets: Vec<u64> = runs.iter().flatten().map(|r| r.offset.0).collect();
        assert_eq!(offsets, (0..50).collect::<Vec<_>>());
        assert!(runs.len() > 1);
    }

    #[test]
    fn a_small_append_is_one_run_and_an_oversize_record_is_alone() {
        assert_eq!(
            run_lengths(&split_for_segments(records(&[10, 10]), 1 << 20, 4096)),
            vec![2]
        );
        assert_eq!(
            run_lengths(&split_for_segments(
                records(&[10, 200_000, 10]),
                64 * 1024,
                4096
            )),
            vec![1, 1, 1]
        );
        assert!(split_for_segments(Vec::new(), 1 << 20, 4096).is_empty());
    }
}
