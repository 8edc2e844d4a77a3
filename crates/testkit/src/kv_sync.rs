//! Helpers for the router's KV-index tests: an engine publishing KV events with replay, its own
//! cache as `/cache_blocks` reports it, a wait until a router's index equals it, and the two
//! tools that make a router miss batches on purpose — a TCP relay that can be cut, and a
//! `/server_info` front that sends the router's KV subscription through it.

use crate::engine::engine;
use crate::http::get_json;
use crate::kv::KvEvents;
use crate::wait::wait_until;
use loadlink_engine::{Engine, EngineConfig};
use loadlink_publish::free_port_block;
use loadlink_router::RouterHandle;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// An engine publishing KV events (PUB at `kv_port + rank`, replay at `replay_port + rank`).
pub struct KvEngine {
    pub engine: Engine,
    pub kv_port: u16,
    pub replay_port: u16,
}

/// Config for an engine whose KV events, load range and replay take the block at `base`
/// (`3 × dp_size` ports); used to restart an engine on the same ports.
pub fn kv_engine_config(cfg: &mut EngineConfig, base: u16) {
    let dp = u16::try_from(cfg.dp_size).expect("dp_size fits a port");
    cfg.kv_events_config = Some(KvEvents::zmq(base).replay(base + 2 * dp).json());
}

/// Starts an engine with KV events and replay on a free port block; `tweak` adjusts the config
/// first (dp_size included).
pub async fn kv_engine(tweak: impl Fn(&mut EngineConfig)) -> KvEngine {
    kv_engine_then(tweak, |_| {}).await
}

/// [`kv_engine`], with `after` adjusting the config once the KV-events settings are in. A block another test took between the probe and the engine's bind
/// leaves the engine without KV events (it declines them with a warning); that start is discarded
/// and another block tried.
pub async fn kv_engine_then(
    tweak: impl Fn(&mut EngineConfig),
    after: impl Fn(&mut EngineConfig),
) -> KvEngine {
    let c = reqwest::Client::new();
    for _ in 0..KV_BIND_ATTEMPTS {
        let mut ports = (0, 0);
        let engine = engine(|cfg| {
            tweak(cfg);
            let dp = u16::try_from(cfg.dp_size).expect("dp_size fits a port");
            let base = free_port_block(3 * dp).expect("a free port block");
            kv_engine_config(cfg, base);
            after(cfg);
            ports = (base, base + 2 * dp);
        })
        .await;
        if publishes_kv(&c, &engine.url()).await {
            return KvEngine {
                engine,
                kv_port: ports.0,
                replay_port: ports.1,
            };
        }
        engine.stop().await;
    }
    panic!("no free KV port block held until the engine bound it in {KV_BIND_ATTEMPTS} tries")
}

/// Starts of an engine [`kv_engine`] makes before giving up on free port blocks.
pub const KV_BIND_ATTEMPTS: usize = 5;

/// Whether every rank of the engine at `engine_url` publishes KV events (`/cache_blocks` gives
/// each a `seq`; null where the KV sockets could not be bound).
pub async fn publishes_kv(c: &reqwest::Client, engine_url: &str) -> bool {
    let v = get_json(c, &format!("{engine_url}/cache_blocks")).await;
    v["ranks"]
        .as_array()
        .is_some_and(|rs| !rs.is_empty() && rs.iter().all(|r| r["seq"].is_i64()))
}

/// The engine's own cache per rank (`GET /cache_blocks`), each sorted.
pub async fn engine_blocks(c: &reqwest::Client, engine_url: &str) -> Vec<Vec<i64>> {
    engine_cut(c, engine_url)
        .await
        .into_iter()
        .map(|(_, blocks)| blocks)
        .collect()
}

/// The engine's cache per rank with the last KV seq it reflects (one `GET /cache_blocks`, which
/// reads the two together under the rank's lock), blocks sorted.
pub async fn engine_cut(c: &reqwest::Client, engine_url: &str) -> Vec<(i64, Vec<i64>)> {
    let v = get_json(c, &format!("{engine_url}/cache_blocks")).await;
    v["ranks"]
        .as_array()
        .expect("a ranks array")
        .iter()
        .map(|r| {
            let mut b: Vec<i64> = r["blocks"]
                .as_array()
                .expect("a blocks array")
                .iter()
                .map(|h| h.as_i64().expect("an i64 hash"))
                .collect();
            b.sort_unstable();
            (r["seq"].as_i64().expect("a seq per rank"), b)
        })
        .collect()
}

/// The router's index for `worker_url`, per rank, each sorted (`None` for a rank it lacks).
pub fn router_blocks(r: &RouterHandle, worker_url: &str, ranks: usize) -> Vec<Option<Vec<i64>>> {
    (0..ranks as u32)
        .map(|rank| {
            let mut b = r.state.cache.rank_blocks(worker_url, rank)?;
            b.sort_unstable();
            Some(b)
        })
        .collect()
}

/// Waits (bounded) until the router's index for `worker_url` equals the engine's own cache on
/// every rank, exactly; returns the blocks per rank.
pub async fn wait_index_matches(
    c: &reqwest::Client,
    r: &RouterHandle,
    worker_url: &str,
    engine_url: &str,
) -> Vec<Vec<i64>> {
    wait_until(
        "the router's KV index to equal the engine's cache",
        20,
        || async {
            let engine = engine_blocks(c, engine_url).await;
            let router = router_blocks(r, worker_url, engine.len());
            let same = engine
                .iter()
                .zip(&router)
                .all(|(e, r)| r.as_ref() == Some(e));
            if same {
                Ok(engine)
            } else {
                let sizes: Vec<_> = router.iter().map(|b| b.as_ref().map(Vec::len)).collect();
                let want: Vec<_> = engine.iter().map(Vec::len).collect();
                Err(format!("engine blocks per rank {want:?}, router {sizes:?}"))
            }
        },
    )
    .await
}

/// A TCP relay from a free local port to `127.0.0.1:target` that can be cut (every connection
/// closed and new ones refused) and restored.
pub struct TcpRelay {
    pub port: u16,
    open: Arc<AtomicBool>,
    cut: Arc<Notify>,
}

impl TcpRelay {
    pub async fn start(target: u16) -> TcpRelay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay port");
        let port = listener.local_addr().expect("relay address").port();
        let open = Arc::new(AtomicBool::new(true));
        let cut = Arc::new(Notify::new());
        let (o, k) = (open.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue; // dropped: refused while cut
                }
                let k = k.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (mut a, mut b) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = k.notified() => {}
                    }
                });
            }
        });
        TcpRelay { port, open, cut }
    }

    /// Closes every relayed connection and refuses new ones until [`TcpRelay::restore`].
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// A worker front for a router: `/server_info` is the engine's, with the KV PUB port replaced by
/// `kv_port` (a relay), so the router's KV subscription goes through it while its replay requests
/// go straight to the engine. Returns the front's URL (the worker URL to give the router).
pub async fn server_info_front(c: &reqwest::Client, engine_url: &str, kv_port: u16) -> String {
    let mut info: Value = get_json(c, &format!("{engine_url}/server_info")).await;
    info["kv_events"]["endpoint_port_base"] = kv_port.into();
    crate::router::serve_loopback(crate::router::server_info_app(info)).await
}

/// A fleet with its cache book, and the discovery of a worker that is nothing but a KV-event
/// publisher on `base` (replay on `base + 1`) with `block_size`-token pages: for tests and
/// benchmarks that play the engine with a real `KvEventPublisher`. Add it with
/// `fleet.add(url, discovery)`.
pub fn bare_kv_fleet(
    base: u16,
    block_size: u64,
) -> (
    Arc<loadlink_router::cache::CacheBook>,
    loadlink_router::fleet::Fleet,
    loadlink_router::fleet::Discovery,
) {
    use loadlink_wire::descriptor::KvStreamEndpoint;
    use loadlink_wire::discovery::KvStreams;
    let book = Arc::new(loadlink_router::cache::CacheBook::default());
    let fleet = loadlink_router::fleet::Fleet::with_cache(1, book.clone());
    let kv = KvStreams {
        block_size,
        topic: String::new(),
        endpoints: vec![KvStreamEndpoint {
            rank: 0,
            endpoint: format!("tcp://127.0.0.1:{base}"),
            replay_endpoint: Some(format!("tcp://127.0.0.1:{}", base + 1)),
        }],
        advertised: None,
        host_load_tokens_per_s: None,
    };
    let d = loadlink_router::fleet::Discovery {
        models: Err(String::from("not read").into()),
        endpoints: Vec::new(),
        no_load_reason: Some("a bare KV-event publisher".into()),
        kv: Ok(kv),
        poll: None,
        pd: None,
    };
    (book, fleet, d)
}
