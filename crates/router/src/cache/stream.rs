//! What the KV-event streams did: each stream's own counters ([`StreamStats`], shared by the
//! ingest thread that owns the stream's sockets and `/workers`), why a stream's slot was rebuilt
//! ([`ResyncReason`]), and the book-wide counters behind the `loadlink_kv_*` families
//! ([`CacheCounters`]). The ingest side ([`crate::ingest::kv`]) decides *when* to apply, clear or
//! resync (seqs, gaps, replays); the [`super::CacheBook`] does it and counts it here.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64};

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
    /// Snapshots loaded into the slot.
    pub snapshots: AtomicU64,
    /// The engine lifetime (epoch) the slot reflects; 0 while unknown.
    pub epoch: AtomicU64,
    /// Whether the slot's view is complete, and if not why ([`View`]).
    view: AtomicU8,
}

impl StreamStats {
    pub(crate) fn new(rank: u32) -> Self {
        StreamStats {
            rank,
            gaps: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            last_seq: AtomicI64::new(-1),
            snapshots: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            view: AtomicU8::new(View::Loading as u8),
        }
    }

    /// How complete the slot's view is.
    pub fn view(&self) -> View {
        View::from_u8(self.view.load(Relaxed))
    }

    pub fn set_view(&self, v: View) {
        self.view.store(v as u8, Relaxed);
    }
}

/// How much of its engine's cache a slot reflects. Only a `Complete` slot is priced from the
/// index alone; every other state is priced from the larger of the index's and the approximate
/// tree's answers (never a partial index as if it were complete), and `/workers` names the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum View {
    /// A snapshot (or the first replay) is on its way.
    Loading = 0,
    /// Snapshot or replay from the engine's first batch, then every batch in order.
    Complete = 1,
    /// The engine has no snapshot and its replay buffer no longer reaches its first batch: the
    /// slot holds what was replayed and what came since, not what the engine cached before.
    NoSnapshot = 2,
    /// The engine's snapshot failed (error, timeout or malformed) and the replay could not fill
    /// the hole; it is asked again after a backoff (sooner on the next gap or restart).
    SnapshotFailed = 3,
    /// Events were lost and nothing could fill them (replays failed or backed off).
    Gap = 4,
    /// The engine advertises no replay socket: what it cached before the subscription is unknown.
    NoReplay = 5,
}

impl View {
    pub const ALL: [View; 6] = [
        View::Loading,
        View::Complete,
        View::NoSnapshot,
        View::SnapshotFailed,
        View::Gap,
        View::NoReplay,
    ];

    fn from_u8(v: u8) -> View {
        View::ALL.get(v as usize).copied().unwrap_or(View::Gap)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            View::Loading => "loading",
            View::Complete => "complete",
            View::NoSnapshot => "no_snapshot",
            View::SnapshotFailed => "snapshot_failed",
            View::Gap => "gap",
            View::NoReplay => "no_replay",
        }
    }

    pub fn is_complete(self) -> bool {
        self == View::Complete
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
    /// A snapshot replaced the slot's view (join, uncovered gap, restart, epoch change).
    Snapshot,
}

impl ResyncReason {
    pub const ALL: [ResyncReason; 5] = [
        ResyncReason::Restart,
        ResyncReason::GapNotCovered,
        ResyncReason::ReplayFailed,
        ResyncReason::NoReplay,
        ResyncReason::Snapshot,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Restart => "restart",
            ResyncReason::GapNotCovered => "gap_not_covered",
            ResyncReason::ReplayFailed => "replay_failed",
            ResyncReason::NoReplay => "no_replay",
            ResyncReason::Snapshot => "snapshot",
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
    pub resyncs: [AtomicU64; 5],
    /// Snapshots asked for, loaded whole, and failed (error, timeout, malformed, or an engine
    /// that answered with a bare replay end: it has none).
    pub snapshots_requested: AtomicU64,
    pub snapshots_loaded: AtomicU64,
    pub snapshots_failed: AtomicU64,
    /// Blocks loaded from snapshots.
    pub snapshot_blocks: AtomicU64,
    /// Live or replayed batches from an older engine lifetime (epoch), dropped.
    pub fenced: AtomicU64,
    pub decode_errors: AtomicU64,
    /// Live seqs that were already applied (replayed first, then seen live).
    pub duplicates: AtomicU64,
    /// KV-event streams held by the ingest threads.
    pub streams: AtomicU64,
}

/// The `type` labels of [`CacheCounters::events`].
pub const EVENT_TYPES: [&str; 3] = ["stored", "removed", "cleared"];
