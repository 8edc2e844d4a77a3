//! The KV pool with the prefix cache in it: who holds which tokens, admission, room-making,
//! retraction, and what a finished request leaves behind.
//!
//! Tokens in the pool are either a request's own pages (`private`) or cached pages. Cached pages
//! are locked while a request that matched them runs, and evictable otherwise. As in SGLang
//! (`num_used = max_total − (available + evictable)`), evictable cached pages count as free for
//! admission and for the published `num_used_tokens`; they are evicted, least recently used first,
//! only when a step needs the room, and before any running request is retracted.

use super::{Event, HIT_RATE_WINDOW_S, Req, Scheduler};
use crate::radix::PathLock;
use loadlink_wire::tokenize::OUTPUT_TOKEN;

impl Scheduler {
    /// Own KV of the admitted requests (running and chunked).
    fn private_tokens(&self) -> u64 {
        self.running.iter().map(Req::private_kv).sum::<u64>()
            + self.pd.transfer.iter().map(Req::private_kv).sum::<u64>()
            + self.chunked.as_ref().map_or(0, Req::private_kv)
    }

    /// KV tokens in use as SGLang counts them: own pages plus locked cached pages.
    pub fn used_tokens(&self) -> u64 {
        let c = self.cache.stats();
        self.private_tokens() + c.cached_tokens - c.evictable_tokens
    }

    /// Pool tokens holding nothing at all (cached pages, even evictable ones, excluded).
    pub(super) fn free_tokens(&self) -> u64 {
        self.cfg
            .max_total_tokens
            .saturating_sub(self.private_tokens() + self.cache.stats().cached_tokens)
    }

    /// Evicts cached pages until `n` tokens are free (or nothing evictable is left).
    pub(super) fn make_room(&mut self, n: u64) {
        let free = self.free_tokens();
        if free < n {
            self.cache.evict(n - free);
        }
    }

    pub(super) fn reservation(&self, r: &Req) -> u64 {
        ((r.max_new - r.generated.min(r.max_new)) as f64 * self.cfg.new_token_ratio).ceil() as u64
    }

    pub(super) fn reserved_tokens(&self) -> u64 {
        self.running.iter().map(|q| self.reservation(q)).sum()
    }

    /// Admits `req` if there is batch room and KV for its uncached prompt plus its reservation,
    /// with `extra_*` already taken by this step. On success its cached prefix is locked and
    /// counts as prefilled.
    pub(super) fn admit(&mut self, req: &mut Req, extra_batch: usize, extra_tokens: u64) -> bool {
        if self.running.len() + extra_batch + 1 > self.cfg.max_running_requests {
            return false;
        }
        // Lock first, so the room made for this request can never be its own prefix.
        let (lock, hit, loaded) = match req.tokens {
            Some(_) => self.lock_loading_back(req),
            None => (PathLock::default(), 0, 0),
        };
        let need = req.prefill_target() - hit + self.reservation(req);
        let fits = self.used_tokens() + self.reserved_tokens() + extra_tokens + need
            <= self.cfg.max_total_tokens
            // A request larger than the whole pool would never run: admit it alone and let
            // retraction/decode bound it, rather than wedge the queue forever.
            || (self.running.is_empty() && extra_batch == 0 && extra_tokens == 0);
        if !fits {
            self.cache.unlock(lock);
            return false;
        }
        (req.lock, req.shared, req.prefilled) = (lock, hit, hit);
        req.admitted_hit = hit;
        req.loaded = loaded;
        if !req.retracted {
            self.record_hit(hit, req.prompt);
        }
        true
    }

    /// Locks `req`'s cached prefix after loading back what of it continues on the host tier (as
    /// much as the pool has room for): (lock, cached tokens, of them loaded back).
    fn lock_loading_back(&mut self, req: &Req) -> (PathLock, u64, u64) {
        let (lock, hit) = self.cache.lock(&req.chain);
        let host = self.cache.host_continuation(&req.chain);
        if host == 0 {
            return (lock, hit, 0);
        }
        self.make_room(host);
        let loaded = self
            .cache
            .load_back(&req.chain, self.free_tokens().min(host));
        self.cache.unlock(lock);
        let (lock, hit) = self.cache.lock(&req.chain);
        (lock, hit, loaded)
    }

    pub(super) fn record_hit(&mut self, hit: u64, prompt: u64) {
        self.stats.hit_tokens += hit;
        self.stats.prompt_tokens += prompt;
        let now = self.now;
        let w = &mut self.stats.hits;
        w.push_back((now, hit, prompt));
        while w.front().is_some_and(|h| h.0 <= now - HIT_RATE_WINDOW_S) {
            w.pop_front();
        }
    }

    /// Drops every cached page no running request holds.
    pub fn flush_cache(&mut self) {
        self.cache.flush();
    }

    /// Frees a running request's KV and puts it back at the front of the queue.
    pub(super) fn retract(&mut self, mut v: Req) {
        self.cache.unlock(std::mem::take(&mut v.lock));
        (v.shared, v.prefilled, v.retracted) = (0, 0, true);
        v.queued_hit = self.cache.matched_tokens(&v.chain);
        self.retractions += 1;
        self.waiting.push_front(v);
    }

    /// A finished request caches its prompt and the output tokens that have KV (all but the
    /// last), then releases its lock; its own pages that did not become cache pages are freed.
    /// `req` finished when it has generated all it may (announced in `events`), else it runs on.
    pub(super) fn finish_or_run(&mut self, mut req: Req, events: &mut Vec<Event>) {
        if req.generated >= req.max_new {
            events.push(Event::Finished {
                id: req.id,
                prompt_tokens: req.prompt,
                completion_tokens: req.generated,
            });
            self.finish(req);
        } else {
            self.checkpoint(&mut req);
            self.running.push(req);
        }
    }

    /// A request whose prompt is prefilled and that runs on publishes the prompt's full pages
    /// to the cache and locks them, as SGLang does after every prefill (`checkpoint_kv_cache`):
    /// a later request sharing the prompt (a session's next turn arriving while this one
    /// decodes) matches it before this one finishes, and the KV events announce it then.
    fn checkpoint(&mut self, req: &mut Req) {
        let Some(prompt) = req.tokens.clone() else {
            return;
        };
        self.cache.insert(&prompt, &req.chain);
        let (lock, held) = self.cache.lock(&req.chain);
        self.cache.unlock(std::mem::replace(&mut req.lock, lock));
        req.shared = held.min(req.prefilled);
    }

    pub(super) fn finish(&mut self, mut req: Req) {
        if let Some(prompt) = &req.tokens {
            let mut seq = Vec::with_capacity(prompt.len() + req.generated as usize);
            seq.extend_from_slice(prompt);
            seq.extend(std::iter::repeat_n(
                OUTPUT_TOKEN,
                req.generated.saturating_sub(1) as usize,
            ));
            req.chain.extend(&seq, self.cfg.page_size);
            self.cache.insert(&seq, &req.chain);
        }
        self.cache.unlock(req.lock);
    }
}
