//! One rank's resident adapters as the book believes them, and the price of one more
//! ([`Slot::cost`]): the load, the expected reload of the adapter it evicts, and, when every
//! resident adapter is in use, the wait for one to drain (an engine never evicts an adapter a
//! running request uses: SGLang's `--max-loras-per-batch` pool, loadlink's scheduler model).

use super::{AdapterCost, AdapterId, RECENT_TAU_MS};

/// A count that decays with time constant [`RECENT_TAU_MS`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Decayed {
    value: f64,
    at_ms: u64,
}

impl Decayed {
    pub(super) fn at(self, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64;
        self.value * (-dt / RECENT_TAU_MS).exp()
    }

    pub(super) fn add(&mut self, now_ms: u64) {
        *self = Decayed {
            value: self.at(now_ms) + 1.0,
            at_ms: now_ms.max(self.at_ms),
        };
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) id: AdapterId,
    /// The last dispatch (or report) naming it.
    pub(super) last_ms: u64,
    pub(super) uses: Decayed,
    /// This router's requests for it on the rank not finished yet.
    pub(super) inflight: u32,
}

/// What pricing on one worker needs besides the slot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pool {
    pub(super) capacity: usize,
    pub(super) load_s: f64,
    /// The worker's mean request duration (dispatch to finish), ms.
    pub(super) request_ms: f64,
    pub(super) horizon_ms: u64,
}

/// One rank's resident adapters, least recently used first.
#[derive(Debug, Clone, Default)]
pub(super) struct Slot {
    pub(super) lru: Vec<Entry>,
    /// Every adapter request recorded on the rank.
    pub(super) total: Decayed,
}

impl Slot {
    pub(super) fn live(&self, now_ms: u64, horizon_ms: u64) -> impl Iterator<Item = &Entry> {
        self.lru
            .iter()
            .filter(move |e| e.last_ms.saturating_add(horizon_ms) > now_ms)
    }

    /// `e`'s share of the rank's recent requests: the chance the next one here wants it.
    fn share(&self, e: &Entry, now: u64) -> f64 {
        let total = self.total.at(now);
        if total > 0.0 {
            (e.uses.at(now) / total).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// The price of a request for `id` here: 0 when resident; a load into a free slot; a load
    /// evicting the least recently used idle adapter, plus its expected reload; or, when every
    /// resident adapter has requests in flight, also the wait until the soonest of them drains
    /// (its last request's expected end: the worker's mean request duration after it was sent).
    pub(super) fn cost(&self, id: AdapterId, pool: Pool, now: u64) -> AdapterCost {
        let (mut live, mut idle, mut busy) = (0, None, None::<(f64, &Entry)>);
        for e in self.live(now, pool.horizon_ms) {
            if e.id == id {
                return AdapterCost::RESIDENT;
            }
            live += 1;
            if e.inflight == 0 {
                idle = idle.or(Some(e));
            } else {
                let left_ms = pool.request_ms - now.saturating_sub(e.last_ms) as f64;
                let wait_s = left_ms.max(0.0) / 1000.0;
                if busy.is_none_or(|(w, _)| wait_s < w) {
                    busy = Some((wait_s, e));
                }
            }
        }
        let load = |victim: Option<&Entry>, wait_s: f64| AdapterCost {
            resident: false,
            evicts: victim.is_some(),
            waits: wait_s > 0.0,
            load_s: pool.load_s * (1.0 + victim.map_or(0.0, |v| self.share(v, now))),
            wait_s,
        };
        match (live >= pool.capacity.max(1), idle, busy) {
            (false, _, _) => load(None, 0.0),
            (true, Some(v), _) => load(Some(v), 0.0),
            (true, None, Some((wait_s, v))) => load(Some(v), wait_s),
            (true, None, None) => load(None, 0.0), // unreachable: a full pool has entries
        }
    }

    /// Records a request for `id`; whether it was a load, and whether that evicted another (the
    /// least recently used idle adapter, else the least recently used).
    pub(super) fn record(&mut self, id: AdapterId, pool: Pool, now: u64) -> (bool, bool) {
        self.lru
            .retain(|e| e.last_ms.saturating_add(pool.horizon_ms) > now);
        self.total.add(now);
        if let Some(k) = self.lru.iter().position(|e| e.id == id) {
            let mut e = self.lru.remove(k);
            e.last_ms = now;
            e.uses.add(now);
            e.inflight = e.inflight.saturating_add(1);
            self.lru.push(e);
            return (false, false);
        }
        let evicts = self.lru.len() >= pool.capacity.max(1);
        while self.lru.len() >= pool.capacity.max(1) {
            let victim = self.lru.iter().position(|e| e.inflight == 0).unwrap_or(0);
            self.lru.remove(victim);
        }
        let mut uses = Decayed::default();
        uses.add(now);
        self.lru.push(Entry {
            id,
            last_ms: now,
            uses,
            inflight: 1,
        });
        (true, evicts)
    }

    /// One of this router's requests for `id` finished.
    pub(super) fn done(&mut self, id: AdapterId) {
        if let Some(e) = self.lru.iter_mut().find(|e| e.id == id) {
            e.inflight = e.inflight.saturating_sub(1);
        }
    }
}
