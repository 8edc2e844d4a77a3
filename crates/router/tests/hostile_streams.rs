//! What a hostile publisher can do through the router's ZeroMQ subscriptions, on loopback with
//! real libzmq and the testkit's [`HostilePub`]: oversized messages are refused by libzmq before
//! they are queued, a flooding stream does not starve the other streams of its ingest thread, a
//! removed worker's stream never writes into a reused cache slot, concurrent adds of one URL leave
//! one subscription, and a worker cannot point the router at a KV publisher on another host.

use loadlink_publish::free_port_block;
use loadlink_router::budget::{Budgets, Refusal};
use loadlink_router::cache::CacheBook;
use loadlink_router::fleet::{Discovery, Fleet};
use loadlink_router::{LoadSignal, Source, Worker};
use loadlink_testkit::hostile_pub::{HostilePub, kv_batches, oversized, snapshots};
use loadlink_testkit::wait::wait_for_sync;
use loadlink_wire::Generation;
use loadlink_wire::descriptor::{KvStreamEndpoint, LoadEndpoint};
use loadlink_wire::discovery::KvStreams;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

fn load_discovery(port: u16) -> Discovery {
    Discovery {
        models: Err(String::from("not read").into()),
        endpoints: vec![LoadEndpoint {
            rank: 0,
            endpoint: format!("tcp://127.0.0.1:{port}"),
            generation: Generation::Snapshot,
        }],
        no_load_reason: None,
        kv: Err("no KV events".into()),
        poll: None,
        pd: None,
    }
}

fn kv_discovery(port: u16) -> Discovery {
    Discovery {
        models: Err(String::from("not read").into()),
        endpoints: Vec::new(),
        no_load_reason: Some("a bare KV-event publisher".into()),
        kv: Ok(KvStreams {
            block_size: 16,
            topic: String::new(),
            endpoints: vec![KvStreamEndpoint {
                rank: 0,
                endpoint: format!("tcp://127.0.0.1:{port}"),
                replay_endpoint: None,
            }],
            advertised: None,
            host_load_tokens_per_s: None,
        }),
        poll: None,
        pd: None,
    }
}

fn priced_on_engine(w: &Worker) -> bool {
    w.load(LoadSignal::Engine, 3000).source == Source::Engine
}

/// Distinct hashes `from..from + n`.
fn hashes(from: i64, n: i64) -> Vec<i64> {
    (from..from + n).collect()
}

/// libzmq refuses a message over `ZMQ_MAXMSGSIZE` by dropping the connection (a protocol error,
/// after which this libzmq does not redial), before allocating it.
#[test]
fn an_oversized_load_message_drops_the_connection_and_is_never_queued() {
    let port = free_port_block(1).unwrap();
    // Over the 64 KiB load budget, under libzmq's old 1 MiB limit.
    let hostile = HostilePub::start(
        &format!("tcp://127.0.0.1:{port}"),
        Duration::from_millis(5),
        oversized(100 << 10),
    );
    let fleet = Fleet::new(1);
    let w = fleet.add("http://127.0.0.1:1", load_discovery(port));
    wait_for_sync("the router's connection", 20, || hostile.accepted() >= 1);
    let at = hostile.sent();
    wait_for_sync("a hundred oversized messages sent since", 20, || {
        hostile.sent() >= at + 100
    });
    assert_eq!(
        hostile.accepted(),
        1,
        "libzmq does not redial after the refusal"
    );
    let stats = fleet.ingest_stats().expect("ingest running");
    assert_eq!(
        stats.messages.load(Relaxed),
        0,
        "no oversized message reached the ingest thread"
    );
    assert!(w.dropped.iter().all(|d| d.load(Relaxed) == 0));
    // The router redials a silent rank, watching that connection: its drop is counted.
    wait_for_sync("the refusal counted", 30, || {
        w.refusals.counts().get(Refusal::LoadMessageTooLarge) >= 1
    });
    assert!(hostile.accepted() >= 2, "redialled");
    assert_eq!(
        fleet.refusals.get(Refusal::LoadMessageTooLarge),
        w.refusals.counts().get(Refusal::LoadMessageTooLarge)
    );
    assert_eq!(stats.messages.load(Relaxed), 0, "still nothing queued");
}

/// After an oversized message libzmq does not redial; the router does, so a publisher that sent
/// one is heard again.
#[test]
fn a_load_publisher_that_sent_one_oversized_message_is_heard_again() {
    let port = free_port_block(1).unwrap();
    let mut small = snapshots(2);
    let hostile = HostilePub::start(
        &format!("tcp://127.0.0.1:{port}"),
        Duration::from_millis(20),
        Box::new(move |n| {
            let mut m = small(n);
            if n < 50 {
                m[2] = vec![0xa5; 100 << 10];
            }
            m
        }),
    );
    let fleet = Fleet::new(1);
    let w = fleet.add("http://127.0.0.1:1", load_discovery(port));
    wait_for_sync("the oversized messages sent", 20, || hostile.sent() >= 50);
    wait_for_sync("the worker priced on engine load again", 30, || {
        priced_on_engine(&w)
    });
    assert!(fleet.ingest_stats().unwrap().redials.load(Relaxed) >= 1);
}

#[test]
fn a_flooding_kv_stream_does_not_starve_a_quiet_load_stream_on_its_thread() {
    let base = free_port_block(2).unwrap();
    let flood = HostilePub::start(
        &format!("tcp://127.0.0.1:{base}"),
        Duration::ZERO,
        kv_batches(hashes(1, 1500)),
    );
    let book = Arc::new(CacheBook::default());
    let fleet = Fleet::with_cache(1, book.clone());
    fleet.add("http://127.0.0.1:1", kv_discovery(base));
    wait_for_sync("the flood to be applied", 20, || {
        book.counters.batches.load(Relaxed) >= 50
    });
    let quiet = HostilePub::start(
        &format!("tcp://127.0.0.1:{}", base + 1),
        Duration::from_millis(20),
        snapshots(3),
    );
    let w = fleet.add("http://127.0.0.1:2", load_discovery(base + 1));
    wait_for_sync(
        "the quiet stream, on the flooded thread, priced on engine load",
        20,
        || priced_on_engine(&w),
    );
    let before = book.counters.batches.load(Relaxed);
    let seen = fleet.ingest_stats().unwrap().messages.load(Relaxed);
    wait_for_sync("the quiet stream's messages to keep arriving", 20, || {
        fleet.ingest_stats().unwrap().messages.load(Relaxed) >= seen + 20
    });
    assert!(
        book.counters.batches.load(Relaxed) > before,
        "the flood is still served too"
    );
    assert!(flood.sent() > 0 && quiet.sent() > 0);
}

#[test]
fn a_removed_workers_stream_never_writes_into_a_reused_slot() {
    let base = free_port_block(2).unwrap();
    let _flood = HostilePub::start(
        &format!("tcp://127.0.0.1:{base}"),
        Duration::ZERO,
        kv_batches(hashes(1, 1500)),
    );
    let book = Arc::new(CacheBook::default());
    let fleet = Fleet::with_cache(1, book.clone());
    let a = "http://127.0.0.1:1";
    fleet.add(a, kv_discovery(base));
    wait_for_sync("the flood to be applied", 20, || {
        book.counters.batches.load(Relaxed) >= 50
    });
    assert!(fleet.remove(a));
    let _quiet = HostilePub::start(
        &format!("tcp://127.0.0.1:{}", base + 1),
        Duration::from_millis(20),
        kv_batches(hashes(1_000_000, 4)),
    );
    let c = "http://127.0.0.1:2";
    fleet.add(c, kv_discovery(base + 1));
    wait_for_sync("the new worker's blocks indexed", 20, || {
        book.rank_blocks(c, 0).is_some_and(|b| !b.is_empty())
    });
    // The flood keeps going for a while: give a late writer every chance to show.
    for _ in 0..20 {
        let mut blocks = book.rank_blocks(c, 0).unwrap();
        blocks.sort();
        assert_eq!(
            blocks,
            hashes(1_000_000, 4),
            "only the new worker's own blocks"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn concurrent_adds_of_one_url_leave_one_subscription() {
    let base = free_port_block(2).unwrap();
    let _kv = HostilePub::start(
        &format!("tcp://127.0.0.1:{base}"),
        Duration::from_millis(20),
        kv_batches(hashes(7, 2)),
    );
    let _load = HostilePub::start(
        &format!("tcp://127.0.0.1:{}", base + 1),
        Duration::from_millis(20),
        snapshots(1),
    );
    let book = Arc::new(CacheBook::default());
    let fleet = Arc::new(Fleet::with_cache(2, book.clone()));
    let url = "http://127.0.0.1:1";
    let discovery = move || {
        let mut d = kv_discovery(base);
        d.endpoints = load_discovery(base + 1).endpoints;
        d.no_load_reason = None;
        d
    };
    for _round in 0..5 {
        let adds: Vec<_> = (0..8)
            .map(|_| {
                let (fleet, d) = (fleet.clone(), discovery());
                std::thread::spawn(move || {
                    fleet.add(url, d);
                })
            })
            .collect();
        adds.into_iter().for_each(|t| t.join().unwrap());
    }
    assert_eq!(fleet.workers().len(), 1);
    let stats = fleet.ingest_stats().unwrap();
    wait_for_sync("replaced subscriptions closed", 10, || {
        stats.subscriptions.load(Relaxed) == 1 && book.counters.streams.load(Relaxed) == 1
    });
    // The listed worker is the subscribed one: its load stream is read.
    let listed = fleet.workers()[0].clone();
    wait_for_sync("the listed worker priced on engine load", 10, || {
        priced_on_engine(&listed)
    });
    assert!(fleet.remove(url));
    wait_for_sync("every subscription closed and no slot left", 10, || {
        stats.subscriptions.load(Relaxed) == 0
            && book.counters.streams.load(Relaxed) == 0
            && book.rank_blocks(url, 0).is_none()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_host_advertised_by_a_worker_is_not_dialled_unless_trusted() {
    // The worker is 127.0.0.1; it advertises its KV events on 127.0.0.2, where another publisher
    // (someone else's cache) listens on the same port.
    let port = free_port_block(1).unwrap();
    let _own = HostilePub::start(
        &format!("tcp://127.0.0.1:{port}"),
        Duration::from_millis(20),
        kv_batches(hashes(100, 3)),
    );
    let _other = HostilePub::start(
        &format!("tcp://127.0.0.2:{port}"),
        Duration::from_millis(20),
        kv_batches(hashes(900, 3)),
    );
    let info = serde_json::json!({
        "kv_events": {
            "publisher": "zmq", "endpoint_host": "127.0.0.2", "endpoint_port_base": port,
            "topic": "", "block_size": 16, "dp_size": 1
        }
    });
    let url =
        loadlink_testkit::router::serve_loopback(loadlink_testkit::router::server_info_app(info))
            .await;
    let client = loadlink_router::fleet::http_client();
    let d = loadlink_router::fleet::discover(
        &client,
        &url,
        &loadlink_router::discovery::DiscoveryLimits::new(3, &Default::default()),
    )
    .await;
    let book = Arc::new(CacheBook::default());
    let fleet = Fleet::with_cache(1, book.clone());
    let w = fleet.add(&url, d);
    let (b, u) = (book.clone(), url.clone());
    tokio::task::spawn_blocking(move || {
        wait_for_sync("the worker's blocks indexed", 20, || {
            b.rank_blocks(&u, 0).is_some_and(|b| !b.is_empty())
        })
    })
    .await
    .unwrap();
    let mut blocks = book.rank_blocks(&url, 0).unwrap();
    blocks.sort();
    assert_eq!(blocks, hashes(100, 3), "read from the worker URL's host");
    assert_eq!(w.refusals.counts().get(Refusal::UntrustedHost), 1);
    let last = w.refusals.last().unwrap();
    assert!(last.contains("127.0.0.2"), "{last}");

    // Trusted, but loopback: still not dialled. The operator's trust covers routable hosts only.
    let trusting = Fleet::with_cache(1, Arc::new(CacheBook::default())).with_budgets(Budgets {
        trust_advertised_hosts: true,
        ..Budgets::default()
    });
    let d = loadlink_router::fleet::discover(
        &client,
        &url,
        &loadlink_router::discovery::DiscoveryLimits::new(3, &Default::default()),
    )
    .await;
    let w = trusting.add(&url, d);
    assert_eq!(w.refusals.counts().get(Refusal::UntrustedHost), 1);
    assert!(w.refusals.last().unwrap().contains("not routable"));
}
