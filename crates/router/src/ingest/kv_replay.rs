//! The replay side of a KV-event stream ([`super::kv`]): a DEALER opened when a replay is
//! needed, registered in the ingest's epoll set, read as the answer arrives, and closed when the
//! replay ends, fails, or stalls (and is then continued). Its own module so the live side and the
//! replay side of a stream each read on one screen.

use super::epoll::Epoll;
use super::kv::{REPLAY_BACKOFF, REPLAY_TAG, REPLAY_TIMEOUT, Stream, digest, readable};
use super::kv_seq::Replayed;
use crate::cache::ResyncReason;
use crate::zctx::FleetContext;
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
}

impl Stream {
    /// Opens a DEALER and asks for the batches from the sequencer's start; false without one.
    pub(super) fn start_replay(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) -> bool {
        let Some(ep) = self.k.replay_endpoint.as_deref() else {
            return false;
        };
        let opened = ctx.dealer_socket().and_then(|d| {
            d.set_linger(0)?;
            // Bounded like the live SUB: a replay that outruns the drain is shed by the engine's
            // ROUTER and continued from where it stopped (see `REPLAY_IDLE`).
            self.k.bounds.apply(&d)?;
            d.connect(ep)?;
            let fd = d.get_fd()?;
            Ok((d, fd))
        });
        let (dealer, fd) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(
                    rank = self.k.rank,
                    "cannot open a replay socket to {ep}: {e}"
                );
                return false;
            }
        };
        let start = self.seq.begin_replay();
        let sent = dealer.send_multipart([&b""[..], &start.to_be_bytes()], zmq::DONTWAIT);
        if sent.is_err() || epoll.add(fd, REPLAY_TAG | i as u64).is_err() {
            self.seq.abort_replay();
            return false;
        }
        self.k.stats.replays.fetch_add(1, Relaxed);
        self.book.counters.replays_requested.fetch_add(1, Relaxed);
        self.replay = Some(ReplaySocket {
            dealer,
            fd,
            deadline: Instant::now() + REPLAY_TIMEOUT,
            last_rx: Instant::now(),
            first: true,
            failed: false,
            truncated: false,
            probe: false,
        });
        self.drain_replay(epoll, ctx, i);
        true
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
                    let [empty, _topic, seq, payload] = &frames[..] else {
                        self.book.counters.decode_errors.fetch_add(1, Relaxed);
                        continue;
                    };
                    let Ok(seq) = <[u8; 8]>::try_from(&seq[..]).map(i64::from_be_bytes) else {
                        self.book.counters.decode_errors.fetch_add(1, Relaxed);
                        continue;
                    };
                    if !empty.is_empty() {
                        self.book.counters.decode_errors.fetch_add(1, Relaxed);
                    } else if seq == -1 {
                        self.finish_replay(epoll, ctx, i);
                        return false;
                    } else {
                        self.on_replayed(epoll, ctx, i, seq, payload);
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
            Replayed::Restart => {
                tracing::info!(
                    rank = self.k.rank,
                    "KV-event stream: a new engine behind the gap"
                );
                self.close_replay(epoll);
                self.seq.abort_replay();
                self.resync(ResyncReason::Restart, false);
                self.seq.reset();
                if !self.start_replay(epoll, ctx, i) {
                    self.seq.accept_any_next();
                    self.flush_held(epoll, ctx, i);
                }
            }
            Replayed::NotCovered if first => {
                if let Some(r) = &mut self.replay {
                    r.failed = true;
                }
                self.book.counters.replays_failed.fetch_add(1, Relaxed);
                self.resync(ResyncReason::GapNotCovered, seq > 0);
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
        if let Some(r) = &mut self.replay {
            r.truncated = true;
            r.failed = true; // not a success: it never ended
        }
        self.book.counters.replays_cut_short.fetch_add(1, Relaxed);
        self.finish_replay(epoll, ctx, i);
    }

    pub(super) fn finish_replay(&mut self, epoll: &Epoll, ctx: &FleetContext, i: usize) {
        let (failed, truncated, probe) = self
            .replay
            .as_ref()
            .map_or((false, false, false), |r| (r.failed, r.truncated, r.probe));
        self.close_replay(epoll);
        if !failed {
            self.book.counters.replays_succeeded.fetch_add(1, Relaxed);
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
        let probe = self.replay.as_ref().is_some_and(|r| r.probe);
        tracing::warn!(rank = self.k.rank, probe, "KV-event replay timed out");
        self.close_replay(epoll);
        self.seq.abort_replay();
        self.book.counters.replays_failed.fetch_add(1, Relaxed);
        // A probe was not covering a known gap: what the slot holds stays valid.
        if !probe {
            self.resync(ResyncReason::ReplayFailed, true);
            self.seq.accept_any_next();
        }
        self.backoff_until = Some(Instant::now() + REPLAY_BACKOFF);
        self.flush_held(epoll, ctx, i);
    }
}
