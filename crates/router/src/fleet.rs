//! The worker set: each worker added from its discovery ([`crate::discovery`], re-exported here),
//! with one subscription per worker (served by [`crate::ingest`]) or, for a worker without load
//! sockets, one load poller ([`crate::poll`]); add/remove at runtime. The request
//! path reads the set through an `ArcSwap` (no lock); changes build a new list and swap it in.
//!
//! The same discovery names each worker's KV-event streams; they are subscribed on the same
//! ingest thread as its load sockets and feed the fleet's [`CacheBook`], which gives each
//! (worker, rank) a slot at `add` and clears it at `remove`.

use crate::book::{LoadSignal, Worker};
use crate::cache::CacheBook;
use crate::ingest::kv::KvSubscription;
use crate::ingest::stats::IngestStats;
use crate::ingest::{Ingest, SubscriptionId};
use crate::policy::View;
use crate::poll::PollConfig;
use crate::subscribe::configure;
use crate::zctx::FleetContext;
use arc_swap::ArcSwap;
use axum::body::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use loadlink_wire::descriptor::LoadEndpoint;
use loadlink_wire::discovery::KvStreams;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;

pub use crate::discovery::{
    Discovery, FetchError, PROBE_TIMEOUT, discover, fetch_server_info, validate_url,
};

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the pooled upstream client (TCP_NODELAY: no Nagle stall on small SSE events).
pub fn http_client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(conn)
}

/// The live worker set.
pub struct Fleet {
    workers: ArcSwap<Vec<Arc<Worker>>>,
    subs: Mutex<HashMap<String, SubscriptionId>>,
    /// The ingest threads and the libzmq context they use, made at the first subscription so
    /// the context's socket limit can be sized from the discovered fleet ([`Fleet::reserve`]).
    ingest: OnceLock<Result<(Ingest, Arc<FleetContext>), String>>,
    reserved_sockets: AtomicUsize,
    ingest_threads: usize,
    epoch: Instant,
    cache: Arc<CacheBook>,
    /// Refusals of every worker this fleet has held, by reason ([`crate::budget`]).
    pub refusals: Arc<crate::budget::RefusalCounts>,
    /// One load poller per polled worker, by URL ([`crate::poll`]).
    pollers: Mutex<HashMap<String, AbortHandle>>,
    polling: PollConfig,
    poll_client: HttpClient,
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
            refusals: Arc::default(),
            workers: ArcSwap::from_pointee(Vec::new()),
            subs: Mutex::default(),
            ingest: OnceLock::new(),
            reserved_sockets: AtomicUsize::new(0),
            ingest_threads: ingest_threads.max(1),
            epoch: Instant::now(),
            pollers: Mutex::default(),
            polling: PollConfig::default(),
            poll_client: crate::poll::poll_client(),
        }
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

    /// Sizes the libzmq context for `sockets` rank subscriptions (twice that, plus room for
    /// workers added later). Effective only before the first subscription.
    pub fn reserve(&self, sockets: usize) {
        self.reserved_sockets.fetch_max(sockets, Relaxed);
    }

    fn ingest(&self) -> Result<&(Ingest, Arc<FleetContext>), &str> {
        self.ingest
            .get_or_init(|| {
                let want = 2 * self.reserved_sockets.load(Relaxed) + 1024;
                let ctx = Arc::new(
                    FleetContext::new(want, 1).map_err(|e| format!("libzmq context: {e}"))?,
                );
                let ingest = Ingest::start(self.ingest_threads, ctx.clone())
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
        self.workers.load_full()
    }

    pub fn contains(&self, url: &str) -> bool {
        self.workers.load().iter().any(|w| w.url == url)
    }

    /// One connected SUB per endpoint, or why not (the worker then shows that reason).
    fn open_sockets(
        &self,
        endpoints: &[LoadEndpoint],
    ) -> Result<Vec<(usize, zmq::Socket)>, String> {
        let (_, ctx) = self
            .ingest()
            .map_err(|e| format!("cannot subscribe: {e}"))?;
        endpoints
            .iter()
            .map(|ep| {
                let s = ctx
                    .sub_socket()
                    .and_then(|s| configure(&s, &ep.endpoint, ep.generation.topic()).map(|()| s));
                s.map(|s| (ep.rank as usize, s)).map_err(|e| {
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

    /// Adds (or replaces) a worker from its discovery result and subscribes to its ranks (load,
    /// and KV events when it has them), or, without load sockets, polls its HTTP load source
    /// (unless polling is off). A worker whose load sockets cannot be opened is kept,
    /// priced on in-flight, with the reason; one without KV streams is simply not indexed.
    pub fn add(&self, url: &str, d: Discovery) -> Arc<Worker> {
        let polled = d
            .poll
            .filter(|_| d.endpoints.is_empty() && !self.polling.interval.is_zero());
        let (sockets, reason) = if let Some(p) = polled {
            tracing::info!(worker = url, "no load socket: polling {}", p.kind.as_str());
            (Vec::new(), None)
        } else if d.endpoints.is_empty() {
            (Vec::new(), d.no_load_reason)
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
        let worker = Arc::new(worker);
        let polled = worker.load_source.kind.polled();
        self.set_poller(url, polled.then_some(&worker));
        let kv = self.kv_subscription(&worker, d.kv);
        let sub = match self.ingest() {
            Ok((ingest, _)) if !sockets.is_empty() || kv.is_some() => {
                Some(ingest.add(worker.clone(), sockets, kv))
            }
            _ => None,
        };
        let old_worker = self.workers.load().iter().find(|w| w.url == url).cloned();
        let old = {
            let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
            let old = subs.remove(url);
            if let Some(s) = sub {
                subs.insert(url.to_string(), s);
            }
            old
        };
        self.unsubscribe(old);
        if let Some(o) = old_worker {
            self.cache.unregister(&o);
        }
        self.workers.rcu(|ws| {
            let mut v: Vec<Arc<Worker>> = ws.iter().filter(|w| w.url != url).cloned().collect();
            v.push(worker.clone());
            v
        });
        worker
    }

    /// Slots and connected SUBs for `worker`'s KV streams, or `None` (with the reason recorded in
    /// the cache book).
    fn kv_subscription(
        &self,
        worker: &Arc<Worker>,
        kv: Result<KvStreams, String>,
    ) -> Option<KvSubscription> {
        let opened = kv.and_then(|streams| {
            let (_, ctx) = self
                .ingest()
                .map_err(|e| format!("cannot subscribe: {e}"))?;
            crate::ingest::kv::subscribe(&self.cache, ctx, worker, &streams)
        });
        match opened {
            Ok(sub) => Some(sub),
            Err(why) => {
                tracing::debug!(worker = %worker.url, "no KV-event stream: {why}");
                self.cache.no_stream(&worker.url, why);
                None
            }
        }
    }

    fn unsubscribe(&self, sub: Option<SubscriptionId>) {
        if let (Some(sub), Some(Ok((ingest, _)))) = (sub, self.ingest.get()) {
            ingest.remove(sub);
        }
    }

    /// Removes a worker; in-flight requests on it finish normally. Returns whether it existed.
    /// Waits (bounded) until its sockets are closed.
    pub fn remove(&self, url: &str) -> bool {
        let old_worker = self.workers.load().iter().find(|w| w.url == url).cloned();
        let existed = old_worker.is_some();
        self.workers.rcu(|ws| {
            ws.iter()
                .filter(|w| w.url != url)
                .cloned()
                .collect::<Vec<_>>()
        });
        let sub = self
            .subs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(url);
        self.unsubscribe(sub);
        self.set_poller(url, None);
        if let Some(o) = old_worker {
            self.cache.unregister(&o);
        }
        self.cache.forget(url);
        existed
    }
}

impl Drop for Fleet {
    /// Pollers hold their worker, not the fleet: they stop with it.
    fn drop(&mut self) {
        self.stop_polling();
    }
}

/// The policy's view of a worker list.
pub struct FleetView<'a> {
    pub workers: &'a [Arc<Worker>],
    pub signal: LoadSignal,
    pub freshness_ms: u64,
    /// Bitmask of workers already tried for this request (first 64).
    pub tried: u64,
    /// The request's `now` ([`Worker::now_ms`]), read once per pick.
    pub now_ms: u64,
    /// The request's prompt tokens (0: unknown).
    pub prompt_tokens: u64,
    /// Per worker (same order as `workers`), the request's tokens cached there; empty: unknown.
    pub cached: &'a [u64],
    /// Per worker, the tokens the router believes cached there in all; empty: unknown.
    pub cache_sizes: &'a [u64],
}

impl<'a> FleetView<'a> {
    pub fn new(workers: &'a [Arc<Worker>], signal: LoadSignal, freshness_ms: u64) -> Self {
        let now_ms = workers.first().map_or(0, |w| w.now_ms());
        FleetView {
            workers,
            signal,
            freshness_ms,
            tried: 0,
            now_ms,
            prompt_tokens: 0,
            cached: &[],
            cache_sizes: &[],
        }
    }

    /// The view for a request of `prompt_tokens` whose cached prefix on worker i is `cached[i]`.
    pub fn with_prefix(mut self, prompt_tokens: u64, cached: &'a [u64]) -> Self {
        self.prompt_tokens = prompt_tokens;
        self.cached = cached;
        self
    }

    /// The view with the router's belief of each worker's whole cache size, in tokens.
    pub fn with_cache_sizes(mut self, cache_sizes: &'a [u64]) -> Self {
        self.cache_sizes = cache_sizes;
        self
    }

    /// Worker `i`'s pricing inputs at this view's `now`.
    #[inline]
    fn pricing(&self, i: usize) -> crate::book::Pricing {
        self.workers[i].pricing_at(self.signal, self.freshness_ms, self.now_ms)
    }

    /// Leaves worker `i` out of the next picks of this request (it was tried and failed).
    pub fn exclude(&mut self, i: usize) {
        if i < 64 {
            self.tried |= 1 << i;
        }
    }
}

impl View for FleetView<'_> {
    fn len(&self) -> usize {
        self.workers.len()
    }
    #[inline]
    fn load(&self, i: usize) -> i64 {
        self.workers[i]
            .load_at(self.signal, self.freshness_ms, self.now_ms)
            .score
    }
    #[inline]
    fn available(&self, i: usize) -> bool {
        (i >= 64 || self.tried & (1 << i) == 0) && self.workers[i].available_at(self.now_ms)
    }
    fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }
    #[inline]
    fn cached_tokens(&self, i: usize) -> u64 {
        self.cached.get(i).copied().unwrap_or(0)
    }
    fn cache_size(&self, i: usize) -> u64 {
        self.cache_sizes.get(i).copied().unwrap_or(0)
    }
    #[inline]
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        let p = self.pricing(i);
        p.queued_tokens.map(|q| q as f64 * p.us_per_token / 1e6)
    }
    #[inline]
    fn engine_requests(&self, i: usize) -> Option<i64> {
        let l = self.workers[i].load_at(LoadSignal::Engine, self.freshness_ms, self.now_ms);
        (self.signal != LoadSignal::Inflight && l.source == crate::book::Source::Engine)
            .then_some(l.requests)
    }
    #[inline]
    fn prefill_s_per_token(&self, i: usize) -> f64 {
        self.pricing(i).us_per_token / 1e6
    }
    fn kv_usage(&self, i: usize) -> f64 {
        self.pricing(i).kv_usage
    }
    fn inflight(&self, i: usize) -> i64 {
        self.workers[i].inflight()
    }
}
