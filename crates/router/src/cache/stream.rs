//! What the KV-event streams did: each stream's own counters ([`StreamStats`], shared by the
//! ingest thread that owns the stream's sockets and `/workers`), why a stream's slot was rebuilt
//! ([`ResyncReason`]), and the book-wide counters behind the `loadlink_kv_*` families
//! ([`CacheCounters`]). The ingest side ([`crate::ingest::kv`]) decides *when* to apply, clear or
//! resync (seqs, gaps, replays); the [`super::CacheBook`] does it and counts it here.

use std::sync::atomic::{AtomicI64, AtomicU64};

/// One KV-event stream's counters, shared by the ingest thread (writer) and `/workers`.
#[derive(Debug)]
pub struct StreamStats {
    pub rank: u32,
    /// Gaps detected (each a run of one or more missing seqs).
    pub gaps: AtomicU64,
    /// Replays requested.
    pub replays: AtomicU64,
    /// Times the slot was cleared and rebuilt (restart, uncovered gap, failed replay).
    pub resyncs: AtomicU64,
    /// The last seq applied; -1 before the first.
    pub last_seq: AtomicI64,
}

impl StreamStats {
    pub(crate) fn new(rank: u32) -> Self {
        StreamStats {
            rank,
            gaps: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            last_seq: AtomicI64::new(-1),
        }
    }
}

/// Why a slot was cleared and rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// The stream's seq went back, or a replay showed a different history: a new engine.
    Restart,
    /// The replay buffer no longer held the missing batches.
    GapNotCovered,
    /// The replay did not answer in time.
    ReplayFailed,
    /// A gap on a stream without a replay endpoint.
    NoReplay,
}

impl ResyncReason {
    pub const ALL: [ResyncReason; 4] = [
        ResyncReason::Restart,
        ResyncReason::GapNotCovered,
        ResyncReason::ReplayFailed,
        ResyncReason::NoReplay,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Restart => "restart",
            ResyncReason::GapNotCovered => "gap_not_covered",
            ResyncReason::ReplayFailed => "replay_failed",
            ResyncReason::NoReplay => "no_replay",
        }
    }
}

/// Book-wide counters (the `loadlink_kv_*` families).
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// Events applied, by type: stored, removed, cleared.
    pub events: [AtomicU64; 3],
    /// Block hashes carried by the applied stored / removed events.
    pub block_events: [AtomicU64; 2],
    pub batches: AtomicU64,
    pub gaps: AtomicU64,
    pub replays_requested: AtomicU64,
    pub replays_succeeded: AtomicU64,
    pub replays_failed: AtomicU64,
    /// Replays that went silent before their end marker (the engine shed at its HWM) and were
    /// continued from where they stopped.
    pub replays_cut_short: AtomicU64,
    /// Resyncs by [`ResyncReason`] (same order as [`ResyncReason::ALL`]).
    pub resyncs: [AtomicU64; 4],
    pub decode_errors: AtomicU64,
    /// Live seqs that were already applied (replayed first, then seen live).
    pub duplicates: AtomicU64,
    /// KV-event streams held by the ingest threads.
    pub streams: AtomicU64,
}

/// The `type` labels of [`CacheCounters::events`].
pub const EVENT_TYPES: [&str; 3] = ["stored", "removed", "cleared"];
