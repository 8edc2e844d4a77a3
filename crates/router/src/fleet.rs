//! The worker set: each worker added from its discovery ([`crate::discovery`], re-exported here),
//! with one subscription per worker (served by [`crate::ingest`]) or, for a worker without load
//! sockets, one load poller ([`crate::poll`]); add/remove at runtime. The request
//! path reads the set through an `ArcSwap` (no lock); changes build a new list and swap it in.
//!
//! The same discovery names each worker's KV-event streams; they are subscribed on the same
//! ingest thread as its load sockets and feed the fleet's [`CacheBook`], which gives each
//! (worker, rank) a slot at `add` and clears it at `remove` (on the ingest thread, once the
//! streams are closed: see [`crate::ingest`]).
//!
//! Limits grow with the fleet: every add reserves the file descriptors its subscriptions need
//! ([`crate::fdlimit`]), raising the soft `RLIMIT_NOFILE` up to the hard limit when the fleet
//! outgrows it, always keeping [`crate::fdlimit::FD_RESERVE`] for the HTTP listener and clients.
//! When the limit cannot grow, the new worker's subscriptions are refused
//! ([`Refusal::SocketLimit`], with the figure in its reason) and it is priced on in-flight. The
//! libzmq context is sized at libzmq's own maximum when it is made: `ZMQ_MAX_SOCKETS` is read
//! once, before the first socket, and a larger table costs only a pointer per socket.
//!
//! Adds and removes of one URL are serialised where it matters: the commit (which worker the URL
//! names, which subscription and poller it holds) runs under one short lock with no I/O, so two
//! concurrent adds of a URL leave exactly one worker, and the loser's subscription and cache slots
//! are released like any replaced worker's. Sockets are opened before, outside the lock.

use crate::book::Worker;
use crate::budget::{Budgets, Refusal};
use crate::cache::CacheBook;
use crate::candidate::RankField;
pub use crate::candidate::Roster;
use crate::ingest::stats::IngestStats;
use crate::ingest::{Ingest, Release, SubscriptionId};
use crate::poll::PollConfig;
use crate::subscribe::{SocketBounds, configure_with};
use crate::zctx::FleetContext;
use arc_swap::ArcSwap;
use loadlink_wire::descriptor::LoadEndpoint;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;

mod kv_streams;
mod served;
use served::refuse_models;

pub use crate::discovery::{
    Discovery, FetchError, PROBE_TIMEOUT, discover, fetch_server_info, validate_url,
};

pub use crate::fleet_view::FleetView;
pub use crate::peer_http::{HttpClient, http_client};

/// How long `remove` waits for the ingest thread to confirm it closed the sockets. Only for the
/// caller's bookkeeping: the slots are freed by that thread whenever it gets there.
const REMOVE_WAIT: Duration = Duration::from_secs(2);

/// libzmq sockets kept free beyond the fleet's own (socket monitors of silent ranks, `watch`, tests).
const SOCKET_RESERVE: usize = 256;

/// What a worker's subscriptions hold: for the limit arithmetic and for its removal.
#[derive(Debug, Clone, Copy, Default)]
struct Held {
    sub: Option<SubscriptionId>,
    load_ranks: usize,
    kv_ranks: usize,
}

/// The subscriptions of every worker, granted or being opened (see [`Fleet::grant`]).
#[derive(Debug, Default)]
struct Holding {
    workers: usize,
    load_ranks: usize,
    kv_ranks: usize,
    /// The soft descriptor limit last seen in force.
    soft: u64,
}

/// The live worker set.
pub struct Fleet {
    roster: ArcSwap<Roster>,
    /// How chosen ranks travel (which workers' ranks are candidates: [`Worker::rank_targets`]).
    rank_field: RankField,
    /// Bumped when a polled worker reports a rank it had not reported before (shared with every
    /// worker); the roster's candidate list is rebuilt on the next request.
    rank_epoch: Arc<std::sync::atomic::AtomicU64>,
    subs: Mutex<HashMap<String, Held>>,
    /// Serialises the commit of adds and removes (see the module docs).
    changes: Mutex<()>,
    holding: Mutex<Holding>,
    /// The ingest threads and the libzmq context they use, made at the first subscription.
    ingest: OnceLock<Result<(Ingest, Arc<FleetContext>), String>>,
    budgets: Budgets,
    ingest_threads: usize,
    epoch: Instant,
    cache: Arc<CacheBook>,
    /// What each worker serves ([`crate::models`]).
    pub models: crate::models::registry::Registry,
    /// Which LoRA adapters each worker holds, as believed ([`crate::adapters`]).
    pub adapters: Arc<crate::adapters::AdapterBook>,
    /// Refusals of every worker this fleet has held, by reason ([`crate::budget`]).
    pub refusals: Arc<crate::budget::RefusalCounts>,
    /// One load poller per polled worker, by URL ([`crate::poll`]).
    pollers: Mutex<HashMap<String, AbortHandle>>,
    polling: PollConfig,
    poll_client: HttpClient,
    /// `--pd`: the command line's roles and bootstrap ports, which win over discovery's.
    pd: Option<crate::pd::PdConfig>,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet::new(1)
    }
}

impl Fleet {
    /// An empty fleet whose subscriptions will be served by `ingest_threads` threads.
    pub fn new(ingest_threads: usize) -> Self {
        Fleet::with_cache(ingest_threads, Arc::default())
    }

    /// Like [`Fleet::new`], feeding the workers' KV-event streams into `cache`.
    pub fn with_cache(ingest_threads: usize, cache: Arc<CacheBook>) -> Self {
        Fleet {
            cache,
            models: Default::default(),
            adapters: Arc::default(),
            refusals: Arc::default(),
            roster: ArcSwap::from_pointee(Roster::default()),
            rank_field: RankField::default(),
            rank_epoch: Arc::default(),
            subs: Mutex::default(),
            changes: Mutex::default(),
            holding: Mutex::default(),
            ingest: OnceLock::new(),
            budgets: Budgets::default(),
            ingest_threads: ingest_threads.max(1),
            epoch: Instant::now(),
            pollers: Mutex::default(),
            polling: PollConfig::default(),
            poll_client: crate::poll::poll_client(),
            pd: None,
        }
    }

    /// The same fleet enforcing `budgets` on what workers send (message sizes, socket queues, work
    /// per wakeup, advertised hosts). Before the first worker is added.
    pub fn with_budgets(mut self, budgets: Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// The same fleet pricing adapters with `cfg`, before the first worker is added.
    pub fn with_adapters(mut self, cfg: crate::adapters::AdapterBookConfig) -> Self {
        self.adapters = Arc::new(crate::adapters::AdapterBook::new(cfg));
        self
    }

    /// The same fleet polling HTTP load sources with `cfg`.
    pub fn with_polling(mut self, cfg: PollConfig) -> Self {
        self.polling = cfg;
        self
    }

    /// Starts (or, with `None`, stops) the load poller of `url`, stopping the one it replaces.
    fn set_poller(&self, url: &str, worker: Option<&Arc<Worker>>) {
        let new = worker.and_then(|w| {
            let handle = crate::poll::spawn(w.clone(), self.poll_client.clone(), self.polling);
            if handle.is_none() {
                let why = "not polled: the worker was added outside an async runtime";
                w.load_source.failed(why.into(), false);
            }
            handle
        });
        let mut pollers = self.pollers.lock().unwrap_or_else(|p| p.into_inner());
        let old = match new {
            Some(h) => pollers.insert(url.to_string(), h),
            None => pollers.remove(url),
        };
        if let Some(old) = old {
            old.abort();
        }
    }

    /// Stops every load poller (the router is stopping).
    pub fn stop_polling(&self) {
        let mut pollers = self.pollers.lock().unwrap_or_else(|p| p.into_inner());
        pollers.drain().for_each(|(_, h)| h.abort());
    }

    fn ingest(&self) -> Result<&(Ingest, Arc<FleetContext>), &str> {
        self.ingest
            .get_or_init(|| {
                let ctx = Arc::new(
                    FleetContext::new(usize::MAX, 1).map_err(|e| format!("libzmq context: {e}"))?,
                );
                let wakeup = self.budgets.wakeup_messages;
                let ingest = Ingest::start(self.ingest_threads, ctx.clone(), wakeup)
                    .map_err(|e| format!("starting the ingest threads: {e}"))?;
                Ok((ingest, ctx))
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The book the workers' KV-event streams feed.
    pub fn cache(&self) -> &Arc<CacheBook> {
        &self.cache
    }

    /// The ingest counters (`None` before the first subscription).
    pub fn ingest_stats(&self) -> Option<&IngestStats> {
        self.ingest.get()?.as_ref().ok().map(|(i, _)| &**i.stats())
    }

    /// The current workers (a cheap snapshot of the list).
    pub fn workers(&self) -> Arc<Vec<Arc<Worker>>> {
        self.roster.load().workers.clone()
    }

    /// The current workers with their candidate list (rebuilt first if a polled worker reported a
    /// new rank since it was built: one atomic load per request otherwise).
    pub fn roster(&self) -> Arc<Roster> {
        let r = self.roster.load_full();
        let epoch = self.rank_epoch.load(std::sync::atomic::Ordering::Acquire);
        if r.epoch() == epoch {
            return r;
        }
        let _commit = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        self.roster
            .rcu(|r| Roster::of(r.workers.to_vec(), self.rank_field, epoch, &self.models));
        self.roster.load_full()
    }

    /// The same fleet giving workers the roles and ports of `pd` (`--pd`), before any worker.
    pub fn with_pd(mut self, pd: Option<crate::pd::PdConfig>) -> Self {
        self.pd = pd;
        self
    }

    /// The same fleet sending chosen ranks as `field` (`--dp-rank-field`), before any worker.
    pub fn with_rank_field(mut self, field: RankField) -> Self {
        self.rank_field = field;
        self
    }

    fn rebuilt(&self, workers: Vec<Arc<Worker>>) -> Roster {
        let epoch = self.rank_epoch.load(std::sync::atomic::Ordering::Acquire);
        Roster::of(workers, self.rank_field, epoch, &self.models)
    }

    pub fn contains(&self, url: &str) -> bool {
        self.find(url).is_some()
    }

    /// The worker at `url`.
    fn find(&self, url: &str) -> Option<Arc<Worker>> {
        let r = self.roster.load();
        r.workers.iter().find(|w| w.url == url).cloned()
    }

    /// One connected SUB per endpoint, or why not (the worker then shows that reason).
    fn open_sockets(
        &self,
        endpoints: &[LoadEndpoint],
    ) -> Result<Vec<(usize, String, zmq::Socket)>, String> {
        let (_, ctx) = self
            .ingest()
            .map_err(|e| format!("cannot subscribe: {e}"))?;
        let bounds = SocketBounds::load(&self.budgets);
        endpoints
            .iter()
            .map(|ep| {
                let s = ctx.sub_socket().and_then(|s| {
                    configure_with(&s, &ep.endpoint, ep.generation.topic(), bounds).map(|()| s)
                });
                s.map(|s| (ep.rank as usize, ep.endpoint.clone(), s)).map_err(|e| {
                    let hint = if e == zmq::Error::EMFILE {
                        let nofile = crate::fdlimit::current().map_or(0, |(soft, _)| soft);
                        format!(
                            " (limits: {} libzmq sockets, {nofile} file descriptors; each rank needs a socket and {} descriptors, see docs/router.md)",
                            ctx.max_sockets(),
                            crate::fdlimit::FDS_PER_RANK
                        )
                    } else {
                        String::new()
                    };
                    format!("cannot subscribe to rank {}'s load socket {}: {e}{hint}", ep.rank, ep.endpoint)
                })
            })
            .collect()
    }

    /// Reserves the file descriptors and libzmq sockets of a worker's `load_ranks` load and
    /// `kv_ranks` KV-event subscriptions, raising the soft descriptor limit when the fleet needs
    /// more; or says why they cannot be had (see the module docs).
    fn grant(&self, load_ranks: usize, kv_ranks: usize) -> Result<(), String> {
        if load_ranks + kv_ranks == 0 {
            return Ok(());
        }
        let mut h = self.holding();
        let (workers, load, kv) = (
            h.workers + 1,
            h.load_ranks + load_ranks,
            h.kv_ranks + kv_ranks,
        );
        let needed = crate::fdlimit::descriptors_needed_with_kv(workers, load, kv);
        let soft = crate::fdlimit::ensure(needed).map_err(|e| e.to_string())?;
        if let Ok((_, ctx)) = self.ingest() {
            let sockets = load + 2 * kv;
            if sockets + SOCKET_RESERVE > ctx.max_sockets() {
                return Err(format!(
                    "the fleet would need {sockets} libzmq sockets (1 per load rank, 2 per KV-event rank) and libzmq allows {} (less {SOCKET_RESERVE} kept free)",
                    ctx.max_sockets()
                ));
            }
        }
        if soft > h.soft {
            tracing::info!(
                "{workers} workers, {load} load and {kv} KV-event subscriptions: {needed} file descriptors needed, soft limit {soft}"
            );
        }
        *h = Holding {
            workers,
            load_ranks: load,
            kv_ranks: kv,
            soft,
        };
        Ok(())
    }

    fn holding(&self) -> MutexGuard<'_, Holding> {
        self.holding.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds (or replaces) a worker from its discovery result and subscribes to its ranks (load,
    /// and KV events when it has them), or, without load sockets, polls its HTTP load source
    /// (unless polling is off). A worker whose load sockets cannot be opened (or whose
    /// subscriptions the descriptor limit cannot hold) is kept, priced on in-flight, with the
    /// reason; one without KV streams is simply not indexed.
    pub fn add(&self, url: &str, d: Discovery) -> Arc<Worker> {
        let models = d.models.clone();
        let polled = d
            .poll
            .filter(|_| d.endpoints.is_empty() && !self.polling.interval.is_zero());
        let load_ranks = if polled.is_some() {
            0
        } else {
            d.endpoints.len()
        };
        let kv_ranks = d.kv.as_ref().map_or(0, |k| k.endpoints.len());
        let granted = self.grant(load_ranks, kv_ranks);
        let held = Held {
            sub: None,
            load_ranks: if granted.is_ok() { load_ranks } else { 0 },
            kv_ranks: if granted.is_ok() { kv_ranks } else { 0 },
        };
        let refused = granted.err().map(|e| format!("not subscribed: {e}"));
        let (sockets, reason) = if let Some(p) = polled {
            tracing::info!(worker = url, "no load socket: polling {}", p.kind.as_str());
            (Vec::new(), None)
        } else if d.endpoints.is_empty() {
            (Vec::new(), d.no_load_reason)
        } else if let Some(why) = &refused {
            (Vec::new(), Some(why.clone()))
        } else {
            match self.open_sockets(&d.endpoints) {
                Ok(s) => (s, None),
                Err(why) => (Vec::new(), Some(why)),
            }
        };
        if let Some(r) = &reason {
            tracing::warn!(worker = url, "routing on in-flight only: {r}");
        }
        let worker = match polled {
            // Ranks get slots as they report, up to the advertised dp_size or --max-ranks.
            Some(p) => {
                let dp_size = d.kv.as_ref().ok().map(|k| k.endpoints.len());
                let bound = self.polling.rank_bound(dp_size);
                Worker::sparse(url.to_string(), bound, self.epoch).with_load_source(p.kind)
            }
            None => Worker::new(url.to_string(), d.endpoints.len(), reason, self.epoch),
        };
        worker.refusals.attach(self.refusals.clone());
        let (role, port) = crate::pd::role_of(self.pd.as_ref(), url, d.pd);
        worker.pd.set(role, port);
        refuse_models(&worker, &models);
        self.adapters.forget(url);
        if let Ok(served) = &models {
            self.adapters.apply_served(url, served, worker.now_ms());
        }
        worker.ranks.notify_claims(self.rank_epoch.clone());
        worker.set_host_load(d.kv.as_ref().ok().and_then(|k| k.host_load_tokens_per_s));
        let worker = Arc::new(worker);
        let kv = match &refused {
            Some(why) => {
                worker.refusals.refuse(Refusal::SocketLimit, || why.clone());
                d.kv.and_then(|_| Err(why.clone()))
            }
            None => d.kv,
        };
        let kv = self.kv_subscription(&worker, kv);
        let sub = match self.ingest() {
            Ok((ingest, _)) if !sockets.is_empty() || kv.is_some() => {
                Some(ingest.add(worker.clone(), sockets, kv))
            }
            _ => None,
        };
        let (old_worker, old) = {
            let _commit = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            let old_worker = self.find(url);
            self.models.forget(url);
            self.models.record(url, models);
            let old = self.subs().insert(url.to_string(), Held { sub, ..held });
            let polled = worker.load_source.kind.polled();
            self.set_poller(url, polled.then_some(&worker));
            self.roster.rcu(|r| {
                let mut v: Vec<Arc<Worker>> =
                    r.workers.iter().filter(|w| w.url != url).cloned().collect();
                v.push(worker.clone());
                self.rebuilt(v)
            });
            (old_worker, old)
        };
        self.release(old_worker, old);
        worker
    }

    fn subs(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives back what a replaced or removed worker held: its descriptors in the arithmetic, its
    /// sockets, and its cache-book slots (freed by the ingest thread after the sockets close).
    fn release(&self, worker: Option<Arc<Worker>>, held: Option<Held>) {
        let held = held.unwrap_or_default();
        if held.load_ranks + held.kv_ranks > 0 {
            let mut h = self.holding();
            h.workers = h.workers.saturating_sub(1);
            h.load_ranks = h.load_ranks.saturating_sub(held.load_ranks);
            h.kv_ranks = h.kv_ranks.saturating_sub(held.kv_ranks);
        }
        let ingest = self.ingest.get().and_then(|i| i.as_ref().ok());
        match (held.sub, ingest, worker) {
            (Some(sub), Some((ingest, _)), worker) => {
                let release = worker.map(|worker| Release {
                    book: self.cache.clone(),
                    worker,
                });
                if !ingest.remove(sub, release, REMOVE_WAIT) {
                    tracing::warn!(
                        "an ingest thread took over {REMOVE_WAIT:?} to close a removed worker's sockets; its cache slots are freed when it does"
                    );
                }
            }
            (_, _, Some(worker)) => self.cache.unregister(&worker),
            _ => {}
        }
    }

    /// Removes a worker; in-flight requests on it finish normally. Returns whether it existed.
    /// Waits (bounded) until its sockets are closed.
    pub fn remove(&self, url: &str) -> bool {
        let (old_worker, held) = {
            let _commit = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            let old_worker = self.find(url);
            self.roster.rcu(|r| {
                self.rebuilt(r.workers.iter().filter(|w| w.url != url).cloned().collect())
            });
            let held = self.subs().remove(url);
            self.set_poller(url, None);
            self.cache.forget(url);
            self.models.forget(url);
            self.adapters.forget(url);
            (old_worker, held)
        };
        let existed = old_worker.is_some();
        self.release(old_worker, held);
        existed
    }
}

impl Drop for Fleet {
    /// Pollers hold their worker, not the fleet: they stop with it.
    fn drop(&mut self) {
        self.stop_polling();
    }
}
