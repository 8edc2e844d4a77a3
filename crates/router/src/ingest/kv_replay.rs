//! The replay side of a KV-event stream ([`super::kv`]): a DEALER opened when a replay is
//! needed, registered in the ingest's epoll set, read as the answer arrives, and closed when the
//! replay ends, fails, or stalls (and is then continued). Its own module so the live side and the
//! replay side of a stream each read on one screen. The same DEALER carries snapshot requests
//! ([`super::kv_snapshot`]); their answers are told apart by their frame count.

use super::epoll::Epoll;
use super::kv::{REPLAY_BACKOFF, REPLAY_TAG, REPLAY_TIMEOUT, Stream, digest, readable};
use super::kv_seq::Replayed;
use super::kv_snapshot::SnapshotLoad;
use crate::cache::{ResyncReason, View};
use crate::zctx::FleetContext;
use loadlink_wire::kv_snapshot::split_epoch_topic;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

pub(super) struct ReplaySocket {
    pub(super) dealer: zmq::Socket,
    pub(super) fd: RawFd,
    pub(super) deadline: Instant,
    /// When its last message arrived.
    pub(super) last_rx: Instant,
    /// No replayed batch seen yet.
    pub(super) first: bool,
    /// It did not cover what was missing.
    pub(super) failed: bool,
    /// A batch inside it was lost (the engine's ROUTER sheds at its HWM): ask again from there.
    pub(super) truncated: bool,
    /// Asked for while the SUB may still be connecting (not because of a gap).
    pub(super) probe: bool,
    /// Asked from before the engine's first batch (a replay that covers it makes the view whole).
    pub(super) from_scratch: bool,
    /// A snapshot request, not a replay ([`super::kv_snapshot`]).
    pub(super) snapshot: Option<SnapshotLoad>,
}

impl ReplaySocket {
    pub(super) fn new(dealer: zmq::Socket, fd: RawFd) -> Self {
        ReplaySocket {
            dealer,
            fd,
            deadline: Instant::now() + REPLAY_TIMEOUT,
            last_rx: Instant::now(),
            first: true,
            failed: false,
            truncated: false,
            probe: false,
            from_scratch: false,
            snapshot: None,
        }
    }
}

impl Stream {
    /// A DEALER connected to the rank's replay endpoint; `None` without one.
    pub(super) fn open_dealer(&self, ctx: &FleetContext) -> Option<(zmq::Socket, RawFd)> {
        let ep = self.k.replay_endpoint.as_deref()?;
        let opened = ctx.dealer_socket().and_then(|d| {
            d.set_linger(0)?;
            // Bounded like the live SUB: a replay that outruns the drain is shed by the engine's
            // ROUTER and continued from where it stopped (see `REPLAY_IDLE`).
            self.k.bounds.apply(&d)?;
            d.connect(ep)?;
            let fd = d.get_fd()?;
            Ok((d, fd))
        });
        opened
            .inspect_err(|e| {
                tracing::warn!(
                    rank = self.k.rank,
                    "cannot open a replay socket to {ep}: {e}"
                )
            })
            .ok()
    }

    /// Opens a DEALER and asks for the batches from the sequencer's start; false without one.
    pub(super) fn start_replay(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) -> bool {
        let Some((dealer, fd)) = self.open_dealer(ctx) else {
            return false;
        };
        let from_scratch = self.seq.is_fresh();
        let start = self.seq.begin_replay();
        let sent = dealer.send_multipart([&b""[..], &start.to_be_bytes()], zmq::DONTWAIT);
        if sent.is_err() || epoll.add(fd, REPLAY_TAG | i as u64).is_err() {
            self.seq.abort_replay();
            return false;
        }
        self.k.stats.replays.fetch_add(1, Relaxed);
        self.book.counters.replays_requested.fetch_add(1, Relaxed);
        let mut r = ReplaySocket::new(dealer, fd);
        r.from_scratch = from_scratch;
        self.replay = Some(r);
        self.drain_replay(epoll, ctx, i);
        true
    }

    /// A new engine lifetime behind the stream: rebuild the slot from scratch.
    pub(super) fn restarted(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize, why: &str) {
        tracing::info!(rank = self.k.rank, "KV-event stream: {why}");
        self.close_replay(epoll);
        self.seq.abort_replay();
        self.resync(ResyncReason::Restart, false);
        self.recover(epoll, ctx, i);
    }

    /// Whether a snapshot may be asked for now.
    pub(super) fn snapshots_possible(&self) -> bool {
        self.snapshots != super::kv_snapshot::SnapshotSupport::No
            && self.snapshot_backoff.is_none_or(|t| Instant::now() >= t)
    }

    pub(super) fn close_replay(&mut self, epoll: &Epoll) {
        if let Some(r) = self.replay.take() {
            epoll.remove(r.fd);
        }
    }

    /// Receives up to [`Stream::wakeup`] replayed batches; true when it stopped there with the
    /// replay still open (the caller serves it again on its next turn).
    pub(super) fn drain_replay(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) -> bool {
        let mut taken = 0;
        loop {
            let Some(r) = &mut self.replay else {
                return false;
            };
            if taken >= self.wakeup {
                return true;
            }
            match r.dealer.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => {
                    taken += 1;
                    r.last_rx = Instant::now();
                    let snapshot = r.snapshot.is_some();
                    if snapshot {
                        r.first = false;
                    }
                    if let [empty, kind, payload] = &frames[..]
                        && empty.is_empty()
                        && snapshot
                    {
                        self.on_snapshot_reply(epoll, ctx, i, kind, payload);
                        continue;
                    }
                    let [empty, topic, seq, payload] = &frames[..] else {
                        self.book.counters.decode_errors.fetch_add(1, Relaxed);
                        continue;
                    };
                    let Ok(seq) = <[u8; 8]>::try_from(&seq[..]).map(i64::from_be_bytes) else {
                        self.book.counters.decode_errors.fetch_add(1, Relaxed);
                        continue;
                    };
                    if !empty.is_empty() {
                        self.book.counters.decode_errors.fetch_add(1, Relaxed);
                    } else if snapshot {
                        // A replay answer to a snapshot request: an engine without snapshots.
                        self.snapshot_unsupported(epoll, ctx, i);
                    } else if seq == -1 {
                        self.finish_replay(epoll, ctx, i);
                        return false;
                    } else {
                        match self.fence(split_epoch_topic(topic).1) {
                            Some(true) => {}
                            Some(false) => self.restarted(epoll, ctx, i, "a new epoch in a replay"),
                            None => self.on_replayed(epoll, ctx, i, seq, payload),
                        }
                    }
                }
                Err(zmq::Error::EAGAIN) if readable(&r.dealer) => continue,
                Err(_) => return false,
            }
        }
    }

    pub(super) fn on_replayed(
        &mut self,
        epoll: &Epoll,
        ctx: &FleetContext,
        i: usize,
        seq: i64,
        p: &[u8],
    ) {
        let first = self
            .replay
            .as_mut()
            .is_some_and(|r| std::mem::take(&mut r.first));
        match self.seq.replayed(seq, digest(p)) {
            Replayed::Apply => self.apply(seq, p, false),
            Replayed::Skip => {}
            Replayed::Restart => self.restarted(epoll, ctx, i, "a new engine behind the gap"),
            // The buffer no longer reaches what is missing, or a batch inside it was lost (the
            // publisher dropped it on a full queue, or its ROUTER shed it): a snapshot fills the
            // hole, if the engine serves them.
            Replayed::NotCovered if self.snapshots_possible() => {
                self.close_replay(epoll);
                self.seq.abort_replay();
                self.book.counters.replays_failed.fetch_add(1, Relaxed);
                self.resync(ResyncReason::GapNotCovered, false);
                self.recover(epoll, ctx, i);
            }
            Replayed::NotCovered if first => {
                if let Some(r) = &mut self.replay {
                    r.failed = true;
                }
                self.book.counters.replays_failed.fetch_add(1, Relaxed);
                self.resync(ResyncReason::GapNotCovered, seq > 0);
                if seq > 0 {
                    self.k.stats.set_view(self.incomplete_view());
                }
                self.seq.restart_at(seq);
                self.apply(seq, p, false);
            }
            // A batch lost inside the replay itself: the rest comes with the next replay.
            Replayed::NotCovered => {
                if let Some(r) = &mut self.replay {
                    r.truncated = true;
                }
            }
        }
    }

    /// The replay answered, then went silent without its end marker: cut short (see
    /// [`super::kv::REPLAY_IDLE`]); finish it as truncated, which asks for the rest.
    pub(super) fn replay_stalled(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        if self.replay.as_ref().is_some_and(|r| r.snapshot.is_some()) {
            return self.snapshot_failed(epoll, ctx, i, "it stopped answering before its end");
        }
        if let Some(r) = &mut self.replay {
            r.truncated = true;
            r.failed = true; // not a success: it never ended
        }
        self.book.counters.replays_cut_short.fetch_add(1, Relaxed);
        self.finish_replay(epoll, ctx, i);
    }

    pub(super) fn finish_replay(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        let (failed, truncated, probe, from_scratch) = self
            .replay
            .as_ref()
            .map_or((false, false, false, false), |r| {
                (r.failed, r.truncated, r.probe, r.from_scratch)
            });
        self.close_replay(epoll);
        if !failed {
            self.book.counters.replays_succeeded.fetch_add(1, Relaxed);
            if from_scratch && !truncated {
                // Every batch the engine ever published, in order: the whole cache.
                self.k.stats.set_view(View::Complete);
            }
        }
        if self.seq.end_replay() {
            self.fruitless = 0;
            if truncated && self.start_replay(epoll, ctx, i) {
                return; // the held batches wait for the rest
            }
        } else {
            // A probe that finds nothing new is what a probe is for, not a fruitless replay.
            self.fruitless += u32::from(!probe);
        }
        self.flush_held(epoll, ctx, i);
    }

    pub(super) fn replay_timed_out(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        if self.replay.as_ref().is_some_and(|r| r.snapshot.is_some()) {
            return self.snapshot_failed(epoll, ctx, i, "no answer in time");
        }
        let probe = self.replay.as_ref().is_some_and(|r| r.probe);
        tracing::warn!(rank = self.k.rank, probe, "KV-event replay timed out");
        self.close_replay(epoll);
        self.seq.abort_replay();
        self.book.counters.replays_failed.fetch_add(1, Relaxed);
        // A probe was not covering a known gap: what the slot holds stays valid.
        if !probe {
            self.resync(ResyncReason::ReplayFailed, true);
            self.seq.accept_any_next();
            self.k.stats.set_view(self.incomplete_view());
        }
        self.backoff_until = Some(Instant::now() + REPLAY_BACKOFF);
        self.flush_held(epoll, ctx, i);
    }
}
