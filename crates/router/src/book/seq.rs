//! A rank's message sequence: counts, gaps and publisher restarts ([`Worker::account_seq`]).

use super::Worker;
use crate::budget::Refusal;
use std::sync::atomic::Ordering::Relaxed;

impl Worker {
    /// Counts one received message of `rank` with sequence `seq` (decoded or not): message count,
    /// gaps and restarts. A negative seq is refused ([`Refusal::NumberOutOfRange`]) and leaves the
    /// rank's seq as it was.
    pub fn account_seq(&self, rank: usize, seq: i64) -> SeqEvent {
        let Some(r) = self.ranks.get(rank) else {
            return SeqEvent::UnknownRank;
        };
        r.messages.fetch_add(1, Relaxed);
        if seq < 0 {
            self.refusals.refuse(Refusal::NumberOutOfRange, || {
                format!("rank {rank}: seq {seq}: expected >= 0")
            });
            return SeqEvent::OutOfRange;
        }
        let prev = r.last_seq.swap(seq, Relaxed);
        if prev < 0 || prev.checked_add(1) == Some(seq) {
            SeqEvent::InOrder
        } else if seq <= prev {
            r.restarts.fetch_add(1, Relaxed);
            SeqEvent::Restart
        } else {
            // 0 <= prev < seq - 1: no overflow; the counter saturates rather than wraps.
            let missed = (seq - prev - 1) as u64;
            let _ = r
                .gaps
                .fetch_update(Relaxed, Relaxed, |g| Some(g.saturating_add(missed)));
            SeqEvent::Gap
        }
    }
}

/// What a sequence number told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEvent {
    InOrder,
    Gap,
    /// Seq went backwards: the publisher restarted. Its message is used at once.
    Restart,
    UnknownRank,
    /// A negative seq: refused, the rank's seq left as it was.
    OutOfRange,
}
