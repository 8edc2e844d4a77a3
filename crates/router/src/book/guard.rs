//! The in-flight guard: a dispatch counted on a worker (and on the rank it was routed to by name)
//! from the moment it exists, and an open request until it is dropped (body end or disconnect).
//!
//! A streaming request is also counted as *unstarted* until its first answer bytes
//! ([`InflightGuard::awaiting_first_bytes`], [`InflightGuard::started`]): until then it is queued
//! for prefill or still on its way there, so its tokens are a floor under the worker's queued
//! prefill however fresh the snapshot (one taken while it was being tokenized does not show it).
//! A non-streaming answer says nothing about when its prefill ended, so only streaming requests
//! are counted.

use super::{DISPATCH_TOKENS_GUESS, Worker};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// An in-flight request on a worker (or one of its ranks); releases the count when dropped (body
/// end or disconnect).
#[derive(Debug)]
pub struct InflightGuard {
    worker: Arc<Worker>,
    /// The rank it was routed to by name, if any (counted there too).
    rank: Option<u32>,
    /// The uncached tokens it was dispatched with.
    tokens: u64,
    /// Of those, what still counts as unstarted (0 once answered, or when not streaming).
    unstarted: u64,
}

impl InflightGuard {
    /// Counts a dispatch and an open request on `worker`, expected to prefill
    /// [`DISPATCH_TOKENS_GUESS`] tokens there.
    pub fn new(worker: Arc<Worker>) -> Self {
        Self::with_tokens(worker, DISPATCH_TOKENS_GUESS as u64)
    }

    /// [`InflightGuard::new`] for a request expected to prefill `uncached_tokens` there (its prompt
    /// minus the prefix the router believes cached), so cost policies count what was dispatched
    /// since the last snapshot in tokens.
    pub fn with_tokens(worker: Arc<Worker>, uncached_tokens: u64) -> Self {
        Self::to_target(worker, None, uncached_tokens)
    }

    /// [`InflightGuard::with_tokens`] for a request routed to `rank` of `worker` by name: counted on
    /// the worker and on the rank ([`Worker::rank_load_at`]).
    pub fn to_target(worker: Arc<Worker>, rank: Option<u32>, uncached_tokens: u64) -> Self {
        worker.dispatched_tokens.fetch_add(uncached_tokens, Relaxed);
        worker.inflight_tokens.fetch_add(uncached_tokens, Relaxed);
        worker.inflight.fetch_add(1, Relaxed);
        worker.dispatched.fetch_add(1, Relaxed);
        worker.requests_total.fetch_add(1, Relaxed);
        let rank = rank.filter(|&r| worker.ranks.get(r as usize).is_some());
        if let Some(r) = rank.and_then(|r| worker.ranks.get(r as usize)) {
            let routed = &r.routed;
            routed.dispatched_tokens.fetch_add(uncached_tokens, Relaxed);
            routed.inflight_tokens.fetch_add(uncached_tokens, Relaxed);
            routed.inflight.fetch_add(1, Relaxed);
            routed.dispatched.fetch_add(1, Relaxed);
            routed.requests_total.fetch_add(1, Relaxed);
        }
        InflightGuard {
            worker,
            rank,
            tokens: uncached_tokens,
            unstarted: 0,
        }
    }

    /// Counts this (streaming) request's tokens as unstarted until [`InflightGuard::started`] or
    /// the drop.
    pub fn awaiting_first_bytes(mut self) -> Self {
        self.unstarted = self.tokens;
        self.worker
            .unstarted_tokens
            .fetch_add(self.unstarted, Relaxed);
        if let Some(r) = self.routed() {
            r.unstarted_tokens.fetch_add(self.unstarted, Relaxed);
        }
        self
    }

    /// Its first answer bytes arrived: its prefill has run (or it failed); no longer unstarted.
    pub fn started(&mut self) {
        let n = std::mem::take(&mut self.unstarted);
        if n == 0 {
            return;
        }
        self.worker.unstarted_tokens.fetch_sub(n, Relaxed);
        if let Some(r) = self.routed() {
            r.unstarted_tokens.fetch_sub(n, Relaxed);
        }
    }

    fn routed(&self) -> Option<&super::ranks::RankRouted> {
        let r = self.rank.and_then(|r| self.worker.ranks.get(r as usize))?;
        Some(r.routed())
    }

    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// The rank it was routed to by name.
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.started();
        self.worker.inflight.fetch_sub(1, Relaxed);
        self.worker.inflight_tokens.fetch_sub(self.tokens, Relaxed);
        if let Some(r) = self.routed() {
            r.inflight.fetch_sub(1, Relaxed);
            r.inflight_tokens.fetch_sub(self.tokens, Relaxed);
        }
    }
}
