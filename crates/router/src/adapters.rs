//! The router's belief about which LoRA adapters are resident on each worker (and each DP rank),
//! and what sending a request for an adapter there would cost in seconds ([`AdapterBook`]).
//!
//! **Why.** An engine serving many adapters of one base model keeps only a few of them in its GPU
//! pool (SGLang: `--max-loras-per-batch` slots; loadlink: `--max-loaded-loras`). A request for an
//! adapter that is not resident waits for it to be loaded, and the engine pauses its batch for the
//! load; the load also evicts the least recently used adapter, which the next request for *that*
//! adapter pays to reload. A router that ignores this spreads every adapter over every worker and
//! every pool thrashes; one that prices it keeps each adapter on a few workers.
//!
//! **Sources, best first.**
//! * What the engine reports (`loaded_loras` of `loadlink engine`'s `/server_info`, one list per
//!   rank, least recently used first): [`AdapterBook::report`] replaces the belief of each rank.
//!   (vLLM's `/v1/models` lists the adapters a worker *can* serve, not which are loaded: that
//!   decides candidates, not residency, and is not recorded here.)
//! * Between reports, and for engines that report nothing, this router's own dispatches
//!   ([`AdapterBook::record_dispatch`]): an adapter sent to a rank is resident there from then on,
//!   in a least-recently-used list bounded by the worker's capacity (`max_loaded_loras` when
//!   advertised, else [`DEFAULT_ADAPTER_CAPACITY`]). Other routers and direct clients load adapters
//!   this router never sees, so an entry unused for [`ADAPTER_HORIZON_MS`] is forgotten (as the
//!   approximate prefix tree forgets blocks).
//!
//! **Price** ([`AdapterCost`]): 0 when resident; else the worker's load time (its
//! advertised `lora_load_time_s`, else the book's default, `--adapter-load-s`), plus, when the pool
//! is full, the reload the eviction causes: the evicted adapter's share of this rank's recent
//! adapter requests (decayed counts, time constant [`RECENT_TAU_MS`]) is the chance the rank's
//! next adapter request wants it back, so the expected reload is that share × the load time. An
//! engine never evicts an adapter that running requests use: when every resident adapter has
//! requests of this router in flight there ([`AdapterBook::record_done`] ends them), the request
//! waits until one drains, priced as the time left of the soonest one's last request (the worker's
//! mean request duration, measured from the same calls, after it was sent). That wait, not the load
//! itself, is what makes an adapter-blind fleet slow: with 32 adapters and 4 slots per engine a
//! full batch nearly always uses every slot. A whole-worker candidate of several ranks is priced
//! at the mean over its ranks (its engine's dispatcher picks the rank by load, not by adapter).
//!
//! Adapter names are interned once ([`AdapterBook::intern`]); the hot path handles [`AdapterId`]s
//! and looks workers up by their URL without allocating. One mutex guards the book; a request takes
//! it once to price all its candidates ([`AdapterBook::fill_costs`]) and once to record its
//! dispatch.

mod hooks;
mod ticket;
pub use ticket::AdapterTicket;
mod slot;

use crate::candidate::Candidates;
use parking_lot::Mutex;
use slot::{Entry, Pool, Slot};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Resident adapters per rank assumed for a worker that does not advertise `max_loaded_loras`:
/// SGLang's default `--max-loras-per-batch` (8), the size of its GPU adapter pool. (vLLM's
/// `--max-loras` defaults to 1; with fewer slots than believed the router is merely optimistic,
/// and the engine's reports or the horizon correct it.)
pub const DEFAULT_ADAPTER_CAPACITY: usize = 8;
/// Seconds to load an adapter on a worker that does not advertise `lora_load_time_s`: a rank-16
/// adapter of an 8B model is some tens of MB, copied host to device in about this long (and
/// `loadlink engine --lora-load-time`'s default).
pub const DEFAULT_ADAPTER_LOAD_S: f64 = 0.05;
/// An entry of the dispatch history unused this long is forgotten (the approximate prefix tree's
/// time-to-live, `APPROX_TTL_MS`).
pub const ADAPTER_HORIZON_MS: u64 = 120_000;
/// Request duration (dispatch to finish) assumed on a worker before any finished there: about
/// S1's mean (128 output tokens at 30 ms a step, plus its prefill and queue).
pub const DEFAULT_REQUEST_S: f64 = 4.0;
/// Weight of one finished request in a worker's mean request duration.
const REQUEST_EWMA: f64 = 0.05;
/// Time constant of the decayed request counts behind the eviction price.
pub const RECENT_TAU_MS: f64 = 30_000.0;
/// Distinct adapter names the book tracks; beyond it, new names are not interned (priced as
/// never resident, recorded nowhere), so hostile names cannot grow it.
pub const MAX_ADAPTER_NAMES: usize = 4096;
/// Ranks and adapters per rank taken from a report; the rest is ignored.
pub const MAX_REPORTED: usize = 1024;

/// An interned adapter name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdapterId(u32);

/// What placing a request for an adapter on one candidate implies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdapterCost {
    /// The adapter is believed resident there (on every rank, for a whole worker): no load.
    pub resident: bool,
    /// Loading it evicts a resident adapter (the pool is full; on some rank, for a whole worker).
    pub evicts: bool,
    /// Every resident adapter has requests in flight: the request waits for one to drain.
    pub waits: bool,
    /// Seconds the engine loads for: 0 when resident; else one load, plus the expected reload
    /// of what it evicts (the mean over the ranks, for a whole worker). The engine's batch pauses
    /// for these ([`crate::policy::min_ttft`] prices that for every request on it).
    pub load_s: f64,
    /// Seconds the request waits for a resident adapter to drain (0 unless `waits`).
    pub wait_s: f64,
}

impl AdapterCost {
    /// Resident, or no adapter at all: nothing to pay.
    pub const RESIDENT: AdapterCost = AdapterCost {
        resident: true,
        evicts: false,
        waits: false,
        load_s: 0.0,
        wait_s: 0.0,
    };

    /// This request's own delay: the load and the wait.
    pub fn seconds(&self) -> f64 {
        self.load_s + self.wait_s
    }
}

/// The book's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdapterBookConfig {
    pub default_capacity: usize,
    pub default_load_s: f64,
    pub horizon_ms: u64,
    /// Request duration assumed until this router has seen requests on a worker finish, seconds.
    pub request_s_prior: f64,
}

impl Default for AdapterBookConfig {
    fn default() -> Self {
        AdapterBookConfig {
            default_capacity: DEFAULT_ADAPTER_CAPACITY,
            default_load_s: DEFAULT_ADAPTER_LOAD_S,
            horizon_ms: ADAPTER_HORIZON_MS,
            request_s_prior: DEFAULT_REQUEST_S,
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct AdapterCounters {
    /// Dispatches recorded.
    pub dispatches: AtomicU64,
    /// Of them, to a rank where the adapter was not believed resident (a load predicted).
    pub predicted_loads: AtomicU64,
    /// Of those, loads predicted to evict a resident adapter.
    pub predicted_evictions: AtomicU64,
    /// Engine reports applied.
    pub reports: AtomicU64,
}

#[derive(Debug, Clone, Default)]
struct WorkerAdapters {
    capacity: Option<usize>,
    load_s: Option<f64>,
    /// Mean request duration from this router's finished requests there, ms (`None`: none yet).
    request_ms: Option<f64>,
    slots: Vec<Slot>,
}

#[derive(Debug, Default)]
struct Inner {
    names: HashMap<Box<str>, AdapterId>,
    workers: HashMap<Box<str>, WorkerAdapters>,
}

/// The router's belief about resident adapters, per worker (keyed by its URL) and rank.
#[derive(Debug, Default)]
pub struct AdapterBook {
    cfg: AdapterBookConfig,
    inner: Mutex<Inner>,
    pub counters: AdapterCounters,
}

impl AdapterBook {
    pub fn new(cfg: AdapterBookConfig) -> Self {
        AdapterBook {
            cfg,
            ..AdapterBook::default()
        }
    }

    pub fn config(&self) -> AdapterBookConfig {
        self.cfg
    }

    /// The id of adapter `name`, interning it on first sight; `None` once [`MAX_ADAPTER_NAMES`]
    /// names are known (the adapter is then priced as never resident).
    pub fn intern(&self, name: &str) -> Option<AdapterId> {
        intern_in(&mut self.inner.lock().names, name)
    }

    /// The id of a known adapter, without interning.
    pub fn id(&self, name: &str) -> Option<AdapterId> {
        self.inner.lock().names.get(name).copied()
    }

    /// What a worker advertises (`/server_info`: `max_loaded_loras`, `lora_load_time_s`); `None`
    /// keeps the book's default. Values that make no sense (0 slots, a negative or non-finite
    /// time) count as not advertised.
    pub fn configure(&self, worker: &str, capacity: Option<usize>, load_s: Option<f64>) {
        let mut g = self.inner.lock();
        let w = worker_mut(&mut g.workers, worker);
        w.capacity = capacity.filter(|&c| c > 0);
        w.load_s = load_s.filter(|s| s.is_finite() && *s >= 0.0);
    }

    /// The engine's report of the adapters resident on each rank (least recently used first):
    /// replaces what the dispatch history believed there (the decayed request counts and the
    /// in-flight requests of adapters still resident are kept). Names beyond the interner's bound are left out.
    pub fn report<S: AsRef<str>>(&self, worker: &str, ranks: &[Vec<S>], now_ms: u64) {
        let mut g = self.inner.lock();
        let ids: Vec<Vec<AdapterId>> = ranks
            .iter()
            .take(MAX_REPORTED)
            .map(|names| {
                let it = names.iter().take(MAX_REPORTED);
                it.filter_map(|n| intern_in(&mut g.names, n.as_ref()))
                    .collect()
            })
            .collect();
        let w = worker_mut(&mut g.workers, worker);
        w.slots
            .resize_with(ids.len().max(w.slots.len()), Slot::default);
        for (slot, ids) in w.slots.iter_mut().zip(&ids) {
            let old = std::mem::take(&mut slot.lru);
            slot.lru = ids
                .iter()
                .map(|&id| {
                    let was = old.iter().find(|e| e.id == id);
                    Entry {
                        id,
                        last_ms: now_ms,
                        uses: was.map_or_else(Default::default, |e| e.uses),
                        inflight: was.map_or(0, |e| e.inflight),
                    }
                })
                .collect();
        }
        self.counters.reports.fetch_add(1, Relaxed);
    }

    /// A request for `adapter` was sent to `worker` (rank `rank`; `None`: the worker whole, whose
    /// dispatcher spreads its requests over every rank, so each rank is taken to hold it).
    /// Pair it with [`AdapterBook::record_done`] when the request ends.
    pub fn record_dispatch(&self, worker: &str, rank: Option<u32>, adapter: AdapterId, now: u64) {
        let mut g = self.inner.lock();
        let w = worker_mut(&mut g.workers, worker);
        let pool = self.pool(w);
        let range = match rank.map(|r| r as usize) {
            Some(r) if r < MAX_REPORTED => {
                if w.slots.len() <= r {
                    w.slots.resize_with(r + 1, Slot::default);
                }
                r..r + 1
            }
            Some(_) => return,
            None => {
                if w.slots.is_empty() {
                    w.slots.push(Slot::default());
                }
                0..w.slots.len()
            }
        };
        let (mut load, mut evict) = (false, false);
        for slot in &mut w.slots[range] {
            let (l, e) = slot.record(adapter, pool, now);
            (load, evict) = (load | l, evict | e);
        }
        self.counters.dispatches.fetch_add(1, Relaxed);
        if load {
            self.counters.predicted_loads.fetch_add(1, Relaxed);
        }
        if evict {
            self.counters.predicted_evictions.fetch_add(1, Relaxed);
        }
    }

    /// A request recorded by [`AdapterBook::record_dispatch`] at `sent_ms` ended at `now` (finished,
    /// failed or cancelled): its adapter has one request fewer in flight there, and its duration
    /// enters the worker's mean.
    pub fn record_done(
        &self,
        worker: &str,
        rank: Option<u32>,
        adapter: AdapterId,
        (sent_ms, now): (u64, u64),
    ) {
        let mut g = self.inner.lock();
        let Some(w) = g.workers.get_mut(worker) else {
            return;
        };
        let took = now.saturating_sub(sent_ms) as f64;
        let mean = w.request_ms.map_or(took, |m| m + REQUEST_EWMA * (took - m));
        w.request_ms = Some(mean);
        let slots = match rank {
            Some(r) => w.slots.get_mut(r as usize..=r as usize),
            None => Some(&mut w.slots[..]),
        };
        for slot in slots.into_iter().flatten() {
            slot.done(adapter);
        }
    }

    fn pool(&self, w: &WorkerAdapters) -> Pool {
        Pool {
            capacity: w.capacity.unwrap_or(self.cfg.default_capacity),
            load_s: w.load_s.unwrap_or(self.cfg.default_load_s),
            request_ms: w.request_ms.unwrap_or(self.cfg.request_s_prior * 1000.0),
            horizon_ms: self.cfg.horizon_ms,
        }
    }

    /// What sending a request for `adapter` to `worker` (rank `rank`) costs now.
    pub fn price(
        &self,
        worker: &str,
        rank: Option<u32>,
        adapter: AdapterId,
        now: u64,
    ) -> AdapterCost {
        let g = self.inner.lock();
        self.price_in(&g, worker, rank, adapter, now)
    }

    fn price_in(
        &self,
        g: &Inner,
        worker: &str,
        rank: Option<u32>,
        id: AdapterId,
        now: u64,
    ) -> AdapterCost {
        let empty = Slot::default();
        let Some(w) = g.workers.get(worker) else {
            return empty.cost(id, self.pool(&WorkerAdapters::default()), now);
        };
        let pool = self.pool(w);
        match rank {
            Some(r) => w
                .slots
                .get(r as usize)
                .unwrap_or(&empty)
                .cost(id, pool, now),
            None if w.slots.len() <= 1 => w.slots.first().unwrap_or(&empty).cost(id, pool, now),
            None => {
                // The engine's dispatcher picks the rank: the mean over its ranks.
                let mut mean = AdapterCost::RESIDENT;
                for c in w.slots.iter().map(|s| s.cost(id, pool, now)) {
                    mean.resident &= c.resident;
                    mean.evicts |= c.evicts;
                    mean.waits |= c.waits;
                    mean.load_s += c.load_s / w.slots.len() as f64;
                    mean.wait_s += c.wait_s / w.slots.len() as f64;
                }
                mean
            }
        }
    }

    /// The price of `adapter` on each of `targets`, in their order, into `out` (cleared first):
    /// one lock for the whole request.
    pub fn fill_costs(
        &self,
        targets: Candidates<'_>,
        adapter: AdapterId,
        now: u64,
        out: &mut Vec<AdapterCost>,
    ) {
        out.clear();
        let g = self.inner.lock();
        out.extend(targets.iter().map(|c| {
            let url = &targets.workers()[c.worker as usize].url;
            self.price_in(&g, url, c.rank, adapter, now)
        }));
    }

    /// The adapters believed resident on `worker`'s rank (least recently used first), by name.
    pub fn resident(&self, worker: &str, rank: u32, now: u64) -> Vec<String> {
        let g = self.inner.lock();
        let Some(slot) = g
            .workers
            .get(worker)
            .and_then(|w| w.slots.get(rank as usize))
        else {
            return Vec::new();
        };
        let name = |id: AdapterId| {
            g.names
                .iter()
                .find(|(_, v)| **v == id)
                .map(|(k, _)| k.to_string())
        };
        slot.live(now, self.cfg.horizon_ms)
            .filter_map(|e| name(e.id))
            .collect()
    }

    /// Forgets a worker (it left the fleet).
    pub fn forget(&self, worker: &str) {
        self.inner.lock().workers.remove(worker);
    }
}

fn worker_mut<'a>(
    workers: &'a mut HashMap<Box<str>, WorkerAdapters>,
    key: &str,
) -> &'a mut WorkerAdapters {
    if !workers.contains_key(key) {
        workers.insert(key.into(), WorkerAdapters::default());
    }
    workers.get_mut(key).expect("inserted above")
}

fn intern_in(names: &mut HashMap<Box<str>, AdapterId>, name: &str) -> Option<AdapterId> {
    if let Some(&id) = names.get(name) {
        return Some(id);
    }
    if names.len() >= MAX_ADAPTER_NAMES {
        return None;
    }
    let id = AdapterId(names.len() as u32);
    names.insert(name.into(), id);
    Some(id)
}

#[cfg(test)]
#[path = "adapters_tests.rs"]
mod tests;
