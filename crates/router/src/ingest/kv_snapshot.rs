//! The snapshot side of a KV-event stream ([`super::kv`]): a router that joins late, misses more
//! than the engine's replay buffer holds, or sees its engine restart asks the engine's replay
//! socket for a snapshot of the rank's cache at a barrier seq, loads it into the rank's slot, then
//! continues from `barrier + 1` with the live batches held meanwhile (and a replay for any hole
//! between the two).
//!
//! * **Same socket, same machinery.** The request `[b"", b"snapshot-v1"]` goes out on a replay
//!   DEALER, registered in the ingest's epoll set like a replay; its answers are three frames
//!   (`header`, `chunk`s, `end`, or `error`) where a replay's are four, and the same timeouts
//!   apply. `docs/protocol.md` gives the bytes.
//! * **An engine without snapshots costs nothing.** SGLang 0.5.23 reads the request as a replay
//!   from an absurd seq and answers the bare end marker at once: the stream notes that the engine
//!   has no snapshot and falls back to a replay from seq 0 (today's behaviour), and the slot says
//!   `no_snapshot` when that replay no longer reaches the engine's first batch. A timeout or an
//!   `error` answer falls back the same way and is asked again only after a backoff.
//! * **The slot is rebuilt in place.** The header clears the slot; each chunk is applied under
//!   one write lock, so lookups interleave with a large load. Until the end marker the slot's view
//!   is `loading`, which prices it from the index *and* the approximate tree.
//! * **Bounded.** A header announcing more blocks than the rank's index quota, a chunk past the
//!   announced count, or an id that does not match the header fails the snapshot (counted, with
//!   the reason logged), never the ingest thread.

use super::epoll::Epoll;
use super::kv::{REPLAY_BACKOFF, REPLAY_TAG, Stream};
use super::kv_replay::ReplaySocket;
use crate::cache::{ResyncReason, View};
use crate::zctx::FleetContext;
use loadlink_wire::kv_snapshot::{SNAPSHOT_REQUEST, SnapshotHeader, SnapshotReply, decode_reply};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

/// Whether a stream's engine serves snapshots, as far as the stream has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum SnapshotSupport {
    #[default]
    Unknown,
    Yes,
    /// It answered a snapshot request with a bare replay end (SGLang 0.5.23).
    No,
}

/// A snapshot being received.
#[derive(Debug, Default)]
pub(super) struct SnapshotLoad {
    header: Option<SnapshotHeader>,
    records: u64,
}

impl Stream {
    /// Asks the engine for a snapshot; false when it has none, a recent one failed, or no DEALER
    /// could be opened (the caller falls back to a replay).
    pub(super) fn start_snapshot(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) -> bool {
        if !self.snapshots_possible() {
            return false;
        }
        let Some((dealer, fd)) = self.open_dealer(ctx) else {
            return false;
        };
        let sent = dealer.send_multipart([&b""[..], SNAPSHOT_REQUEST], zmq::DONTWAIT);
        if sent.is_err() || epoll.add(fd, REPLAY_TAG | i as u64).is_err() {
            return false;
        }
        self.close_replay(epoll);
        self.seq.begin_snapshot();
        self.book.counters.snapshots_requested.fetch_add(1, Relaxed);
        self.k.stats.set_view(View::Loading);
        let mut r = ReplaySocket::new(dealer, fd);
        r.snapshot = Some(SnapshotLoad::default());
        self.replay = Some(r);
        self.drain_replay(epoll, ctx, i);
        true
    }

    /// Recovers the slot's view from scratch: a snapshot, else a replay from the engine's first
    /// batch, else the next live batch as it comes (the view then says why it is incomplete).
    pub(super) fn recover(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        self.seq.reset();
        if self.start_snapshot(epoll, ctx, i) || self.start_replay(epoll, ctx, i) {
            return;
        }
        self.seq.accept_any_next();
        self.k.stats.set_view(self.incomplete_view());
        self.flush_held(epoll, ctx, i);
    }

    /// Why the view is incomplete when neither a snapshot nor a replay could fill it.
    pub(super) fn incomplete_view(&self) -> View {
        match self.snapshots {
            _ if self.k.replay_endpoint.is_none() => View::NoReplay,
            SnapshotSupport::No => View::NoSnapshot,
            _ if self.snapshot_backoff.is_some() => View::SnapshotFailed,
            _ => View::Gap,
        }
    }

    /// One three-frame answer to a snapshot request.
    pub(super) fn on_snapshot_reply(
        &mut self,
        epoll: &Epoll,
        ctx: &FleetContext,
        i: usize,
        kind: &[u8],
        payload: &[u8],
    ) {
        let reply = match decode_reply(kind, payload) {
            Ok(r) => r,
            Err(e) => return self.snapshot_failed(epoll, ctx, i, &format!("malformed: {e}")),
        };
        let Some(load) = self.replay.as_mut().and_then(|r| r.snapshot.as_mut()) else {
            self.book.counters.decode_errors.fetch_add(1, Relaxed);
            return;
        };
        match reply {
            SnapshotReply::Header(h) => {
                if let Err(why) = self.check_header(&h) {
                    return self.snapshot_failed(epoll, ctx, i, &why);
                }
                let load = self.replay.as_mut().and_then(|r| r.snapshot.as_mut());
                if let Some(load) = load {
                    *load = SnapshotLoad {
                        header: Some(h),
                        records: 0,
                    };
                }
                self.adopt_epoch(h.epoch);
                self.resync(ResyncReason::Snapshot, false);
                self.k.stats.set_view(View::Loading);
            }
            SnapshotReply::Chunk {
                barrier_id,
                records,
            } => {
                let Some(h) = load.header else {
                    return self.snapshot_failed(epoll, ctx, i, "a chunk before the header");
                };
                load.records += records.len() as u64;
                if barrier_id != h.barrier_id || load.records > h.record_count {
                    let why = format!(
                        "chunk of barrier {barrier_id} with {} records in all, header: barrier {} with {}",
                        load.records, h.barrier_id, h.record_count
                    );
                    return self.snapshot_failed(epoll, ctx, i, &why);
                }
                let blocks = self
                    .book
                    .load_records(self.k.slot, records, self.block_size);
                self.book
                    .counters
                    .snapshot_blocks
                    .fetch_add(blocks, Relaxed);
            }
            SnapshotReply::End {
                barrier_id,
                record_count,
            } => {
                let Some(h) = load.header else {
                    return self.snapshot_failed(epoll, ctx, i, "an end before the header");
                };
                if barrier_id != h.barrier_id
                    || record_count != h.record_count
                    || load.records != h.record_count
                {
                    let why = format!(
                        "end of barrier {barrier_id} after {} of {record_count} records, header: barrier {} with {}",
                        load.records, h.barrier_id, h.record_count
                    );
                    return self.snapshot_failed(epoll, ctx, i, &why);
                }
                self.snapshot_loaded(epoll, ctx, i, h.barrier_seq);
            }
            SnapshotReply::Error { reason } => {
                self.snapshot_failed(epoll, ctx, i, &format!("the engine answered: {reason}"))
            }
        }
    }

    fn check_header(&self, h: &SnapshotHeader) -> Result<(), String> {
        if h.version != 1 {
            return Err(format!("header version {}, expected 1", h.version));
        }
        if h.barrier_seq.checked_add(1) != Some(h.resume_seq) || h.barrier_seq < -1 {
            return Err(format!(
                "header resume_seq {} is not barrier_seq {} + 1",
                h.resume_seq, h.barrier_seq
            ));
        }
        let quota = self.book.rank_quota() as u64;
        if h.record_count > quota {
            return Err(format!(
                "header announces {} records, more than the rank's index quota of {quota} blocks (--kv-index-max-blocks-per-rank)",
                h.record_count
            ));
        }
        Ok(())
    }

    fn snapshot_loaded(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize, barrier: i64) {
        self.close_replay(epoll);
        self.snapshots = SnapshotSupport::Yes;
        self.snapshot_backoff = None;
        self.seq.loaded_snapshot(barrier);
        self.k.stats.last_seq.store(barrier, Relaxed);
        self.k.stats.snapshots.fetch_add(1, Relaxed);
        self.book.counters.snapshots_loaded.fetch_add(1, Relaxed);
        self.k.stats.set_view(View::Complete);
        self.fruitless = 0;
        self.flush_held(epoll, ctx, i);
    }

    /// The engine answered the snapshot request with a bare replay end: it has no snapshots.
    pub(super) fn snapshot_unsupported(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        tracing::info!(
            rank = self.k.rank,
            "the engine serves no KV snapshots (a bare replay end): replaying its buffer instead"
        );
        self.snapshots = SnapshotSupport::No;
        self.close_replay(epoll);
        self.seq.abort_replay();
        self.book.counters.snapshots_failed.fetch_add(1, Relaxed);
        self.recover(epoll, ctx, i);
    }

    /// A snapshot that failed (malformed, error, timeout): the slot is rebuilt from a replay, and
    /// snapshots are asked again after [`REPLAY_BACKOFF`].
    pub(super) fn snapshot_failed(
        &mut self,
        epoll: &Epoll,
        ctx: &FleetContext,
        i: usize,
        why: &str,
    ) {
        tracing::warn!(rank = self.k.rank, "KV snapshot failed: {why}");
        self.close_replay(epoll);
        self.seq.abort_replay();
        self.book.counters.snapshots_failed.fetch_add(1, Relaxed);
        self.snapshot_backoff = Some(Instant::now() + REPLAY_BACKOFF);
        // What a partial load left is not the engine's cache.
        self.resync(ResyncReason::Snapshot, false);
        self.recover(epoll, ctx, i);
    }

    /// Asks again for the snapshot a view still owes (it failed, or a gap nothing could fill)
    /// once the backoff has passed. The sweep calls it: on a stream that went quiet no live batch
    /// would reveal the hole again, and the view would stay incomplete for good.
    pub(super) fn retry_snapshot_if_due(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        let owed = matches!(self.k.stats.view(), View::SnapshotFailed | View::Gap);
        if owed && self.replay.is_none() && self.snapshots_possible() {
            self.recover(epoll, ctx, i);
        }
    }

    /// Takes `epoch` as the engine lifetime the slot follows.
    pub(super) fn adopt_epoch(&mut self, epoch: u64) {
        self.epoch = Some(epoch);
        self.k.stats.epoch.store(epoch, Relaxed);
    }

    /// Fences a batch by the epoch in its topic frame: `Some(true)` drop it (an older lifetime),
    /// `Some(false)` a newer lifetime began (a restart), `None` carry on.
    pub(super) fn fence(&mut self, epoch: Option<u64>) -> Option<bool> {
        let (Some(e), Some(cur)) = (epoch, self.epoch) else {
            if let Some(e) = epoch {
                self.adopt_epoch(e);
            }
            return None;
        };
        match e.cmp(&cur) {
            std::cmp::Ordering::Less => {
                self.book.counters.fenced.fetch_add(1, Relaxed);
                Some(true)
            }
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Greater => {
                self.adopt_epoch(e);
                Some(false)
            }
        }
    }
}
