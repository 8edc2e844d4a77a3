//! Fleet membership from DNS and from a watched file, against a real authoritative DNS server on
//! loopback (hickory-server with an in-memory zone whose records the test changes) and real
//! engines, while traffic flows: workers join and leave and no request fails because of it.
//!
//! A source owns only what it added (a static worker it also lists stays when it drops it); an
//! empty answer (NXDOMAIN) removes its workers after the configured count; a name that fails
//! does not freeze the others; and removals do not wait behind a record whose worker stalls.

use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType, RrKey};
use hickory_server::ServerFuture;
use hickory_server::authority::{Catalog, ZoneType};
use hickory_server::store::in_memory::InMemoryAuthority;
use loadlink_engine::Engine;
use loadlink_router::LoadSignal;
use loadlink_router::membership::DnsTarget;
use loadlink_testkit::{router, wait_for, workers};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// An authoritative server for `fleet.test.` on a loopback UDP port.
struct Dns {
    zone: Arc<InMemoryAuthority>,
    addr: SocketAddr,
    serial: u32,
}

impl Dns {
    async fn start() -> Dns {
        let origin = Name::from_ascii("fleet.test.").unwrap();
        let mut zone = InMemoryAuthority::empty(origin.clone(), ZoneType::Primary, false);
        let soa = SOA::new(origin.clone(), origin.clone(), 1, 60, 60, 60, 0);
        zone.upsert_mut(Record::from_rdata(origin.clone(), 0, RData::SOA(soa)), 1);
        let zone = Arc::new(zone);
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&origin), Box::new(zone.clone()));
        let mut server = ServerFuture::new(catalog);
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        server.register_socket(socket);
        tokio::spawn(async move { server.block_until_done().await });
        Dns {
            zone,
            addr,
            serial: 1,
        }
    }

    /// Makes `engines.fleet.test.` resolve to exactly `ips`.
    async fn set(&mut self, ips: &[Ipv4Addr]) {
        self.set_name("engines", ips).await
    }

    /// Makes `{label}.fleet.test.` resolve to exactly `ips` (none: NXDOMAIN).
    async fn set_name(&mut self, label: &str, ips: &[Ipv4Addr]) {
        let name = Name::from_ascii(format!("{label}.fleet.test.")).unwrap();
        self.serial += 1;
        self.zone
            .records_mut()
            .await
            .remove(&RrKey::new(LowerName::new(&name), RecordType::A));
        for ip in ips {
            let rec = Record::from_rdata(name.clone(), 0, RData::A(A(*ip)));
            assert!(self.zone.upsert(rec, self.serial).await);
        }
    }
}

/// An engine on `127.0.0.N:port` (every loopback address is local on Linux), so that one DNS name
/// with one port names several engines, as a headless Service does.
async fn engine_at(n: u8, port: u16) -> Engine {
    loadlink_testkit::engine(|c| {
        c.host = format!("127.0.0.{n}");
        c.port = port;
        c.time_scale = 20.0;
    })
    .await
}

fn port_free_on(port: u16, hosts: &[u8]) -> bool {
    hosts
        .iter()
        .all(|n| std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, *n), port)).is_ok())
}

async fn urls(c: &reqwest::Client, router_url: &str) -> Vec<String> {
    let mut u: Vec<String> = workers(c, router_url)
        .await
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_string())
        .collect();
    u.sort();
    u
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_records_add_and_remove_workers_while_traffic_flows() {
    let port = loop {
        let p = loadlink_publish::free_port_block(1).unwrap();
        if port_free_on(p, &[2, 3, 4]) {
            break p;
        }
    };
    let (e2, e3, e4) = (
        engine_at(2, port).await,
        engine_at(3, port).await,
        engine_at(4, port).await,
    );
    let url = |n: u8| format!("http://127.0.0.{n}:{port}");
    let mut dns = Dns::start().await;
    dns.set(&[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)])
        .await;
    let r = router(vec![], LoadSignal::Inflight, |cfg| {
        cfg.membership.dns = vec![DnsTarget::parse(&format!("engines.fleet.test:{port}")).unwrap()];
        cfg.membership.dns_server = Some(dns.addr);
        cfg.membership.dns_interval_ms = 200;
    })
    .await;
    let c = reqwest::Client::new();
    wait_for("both records become workers", 20, || async {
        urls(&c, &r.url()).await == [url(2), url(3)]
    })
    .await;

    // Clients send without pause through every change.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (c, base) = (c.clone(), r.url());
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Relaxed) {
                    let resp = c
                        .post(format!("{base}/v1/completions"))
                        .json(&json!({"prompt": "hi", "max_tokens": 20}))
                        .send()
                        .await;
                    let done = match resp {
                        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                        _ => false,
                    };
                    if done { &ok } else { &failed }.fetch_add(1, Relaxed);
                }
            })
        })
        .collect();

    dns.set(&[
        Ipv4Addr::new(127, 0, 0, 2),
        Ipv4Addr::new(127, 0, 0, 3),
        Ipv4Addr::new(127, 0, 0, 4),
    ])
    .await;
    wait_for("a new record joins", 20, || async {
        urls(&c, &r.url()).await.len() == 3
    })
    .await;
    wait_for("the new worker takes traffic", 20, || async {
        let page = loadlink_testkit::scrape(&c, &e4.url()).await;
        page.value("loadlink_engine_requests_total", &[])
            .unwrap_or(0.0)
            > 0.0
    })
    .await;
    dns.set(&[Ipv4Addr::new(127, 0, 0, 3), Ipv4Addr::new(127, 0, 0, 4)])
        .await;
    wait_for("a removed record leaves", 20, || async {
        urls(&c, &r.url()).await == [url(3), url(4)]
    })
    .await;
    let before = ok.load(Relaxed);
    wait_for("traffic goes on", 20, || async {
        ok.load(Relaxed) > before + 20
    })
    .await;
    stop.store(true, Relaxed);
    for t in clients {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Relaxed),
        0,
        "no request failed because of a change"
    );
    assert_eq!(
        e2.open_requests(),
        0,
        "the removed worker's requests finished"
    );
    let st = &r.state.membership;
    assert!(st.added.load(Relaxed) == 3 && st.removed.load(Relaxed) == 1);
    r.stop().await;
    for e in [e2, e3, e4] {
        e.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_adds_and_removes_workers() {
    let (a, b) = (
        loadlink_testkit::engine(|_| {}).await,
        loadlink_testkit::engine(|_| {}).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workers.txt");
    std::fs::write(&file, format!("# the fleet\n{}\n", a.url())).unwrap();
    let r = router(vec![], LoadSignal::Inflight, |cfg| {
        cfg.membership.urls_file = Some(file.clone());
    })
    .await;
    let c = reqwest::Client::new();
    wait_for("the file's worker joins", 20, || async {
        urls(&c, &r.url()).await == [a.url()]
    })
    .await;
    std::fs::write(&file, format!("{}\n", b.url())).unwrap();
    wait_for("the edit replaces it", 20, || async {
        urls(&c, &r.url()).await == [b.url()]
    })
    .await;
    std::fs::write(&file, "not a url\n").unwrap();
    wait_for("a broken file is counted", 20, || async {
        r.state.membership.errors.load(Relaxed) > 0
    })
    .await;
    assert_eq!(urls(&c, &r.url()).await, [b.url()], "and changes nothing");
    r.stop().await;
    a.stop().await;
    b.stop().await;
}

fn loopback(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

/// A port free on every `127.0.0.N` of `hosts`.
fn port_on(hosts: &[u8]) -> u16 {
    loop {
        let p = loadlink_publish::free_port_block(1).unwrap();
        if port_free_on(p, hosts) {
            return p;
        }
    }
}

/// Waits until the DNS source has refreshed `n` more times than now.
async fn refreshes(r: &loadlink_router::RouterHandle, n: u64) {
    let from = r.state.membership.refreshes.load(Relaxed);
    wait_for("DNS refreshes", 20, || async {
        r.state.membership.refreshes.load(Relaxed) >= from + n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_source_never_removes_a_worker_it_did_not_add() {
    let port = port_on(&[5, 6]);
    let (e5, e6) = (engine_at(5, port).await, engine_at(6, port).await);
    let mut dns = Dns::start().await;
    dns.set(&[loopback(5), loopback(6)]).await;
    // 127.0.0.5 is a static worker; the DNS name lists it too.
    let r = router(vec![e5.url()], LoadSignal::Inflight, |cfg| {
        cfg.membership.dns = vec![DnsTarget::parse(&format!("engines.fleet.test:{port}")).unwrap()];
        cfg.membership.dns_server = Some(dns.addr);
        cfg.membership.dns_interval_ms = 100;
    })
    .await;
    let c = reqwest::Client::new();
    wait_for("the DNS worker joins the static one", 20, || async {
        urls(&c, &r.url()).await == [e5.url(), e6.url()]
    })
    .await;
    dns.set(&[loopback(6)]).await;
    refreshes(&r, 3).await;
    assert_eq!(
        urls(&c, &r.url()).await,
        [e5.url(), e6.url()],
        "the static worker stays when the name drops it"
    );
    assert_eq!(r.state.membership.removed.load(Relaxed), 0);
    r.stop().await;
    e5.stop().await;
    e6.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nxdomain_removes_the_names_workers_after_the_configured_count() {
    let port = port_on(&[7]);
    let e7 = engine_at(7, port).await;
    let mut dns = Dns::start().await;
    dns.set(&[loopback(7)]).await;
    let r = router(vec![], LoadSignal::Inflight, |cfg| {
        cfg.membership.dns = vec![DnsTarget::parse(&format!("engines.fleet.test:{port}")).unwrap()];
        cfg.membership.dns_server = Some(dns.addr);
        cfg.membership.dns_interval_ms = 100;
        cfg.budgets.membership_empty_answers = 2;
    })
    .await;
    let c = reqwest::Client::new();
    wait_for("the record's worker joins", 20, || async {
        urls(&c, &r.url()).await == [e7.url()]
    })
    .await;
    // The Service is scaled to zero: the name has no records left (NXDOMAIN).
    dns.set(&[]).await;
    wait_for("its worker leaves", 20, || async {
        urls(&c, &r.url()).await.is_empty()
    })
    .await;
    assert_eq!(r.state.membership.errors.load(Relaxed), 0, "not a failure");
    r.stop().await;
    e7.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_name_does_not_freeze_the_others() {
    let port = port_on(&[8]);
    let e8 = engine_at(8, port).await;
    let mut dns = Dns::start().await;
    dns.set(&[loopback(8)]).await;
    let r = router(vec![], LoadSignal::Inflight, |cfg| {
        cfg.membership.dns = vec![
            // Outside the server's zone: it refuses to answer, every time.
            DnsTarget::parse(&format!("engines.elsewhere.test:{port}")).unwrap(),
            DnsTarget::parse(&format!("engines.fleet.test:{port}")).unwrap(),
        ];
        cfg.membership.dns_server = Some(dns.addr);
        cfg.membership.dns_interval_ms = 100;
    })
    .await;
    let c = reqwest::Client::new();
    wait_for("the answering name's worker joins", 20, || async {
        urls(&c, &r.url()).await == [e8.url()]
    })
    .await;
    assert!(
        r.state.membership.errors.load(Relaxed) > 0,
        "the other fails"
    );
    r.stop().await;
    e8.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_do_not_wait_behind_a_stalled_record() {
    let port = port_on(&[9, 10]);
    let e9 = engine_at(9, port).await;
    let stalled =
        loadlink_testkit::hostile_http::HostileWorker::start_at(&format!("127.0.0.10:{port}"))
            .await;
    stalled.on(
        "/server_info",
        loadlink_testkit::hostile_http::Reply::StallAfterHeaders { declared: 4096 },
    );
    let mut dns = Dns::start().await;
    dns.set(&[loopback(9)]).await;
    let r = router(vec![], LoadSignal::Inflight, |cfg| {
        cfg.membership.dns = vec![DnsTarget::parse(&format!("engines.fleet.test:{port}")).unwrap()];
        cfg.membership.dns_server = Some(dns.addr);
        cfg.membership.dns_interval_ms = 100;
        // The stalled record's discovery outlasts the test: 5 attempts of 30 s.
        cfg.budgets.discovery_timeout = std::time::Duration::from_secs(30);
    })
    .await;
    let c = reqwest::Client::new();
    wait_for("the engine joins", 20, || async {
        urls(&c, &r.url()).await == [e9.url()]
    })
    .await;
    dns.set(&[loopback(9), loopback(10)]).await;
    wait_for("the stalled record is being discovered", 20, || async {
        stalled.hits("/server_info") > 0
    })
    .await;
    dns.set(&[loopback(10)]).await;
    wait_for(
        "the dropped engine leaves while the stalled add runs",
        10,
        || async { urls(&c, &r.url()).await.is_empty() },
    )
    .await;
    r.stop().await;
    e9.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_never_removes_a_worker_it_did_not_add() {
    let (a, b, c2) = (
        loadlink_testkit::engine(|_| {}).await,
        loadlink_testkit::engine(|_| {}).await,
        loadlink_testkit::engine(|_| {}).await,
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("workers.txt");
    // `a` is a static worker that the file lists too.
    std::fs::write(&file, format!("{}\n{}\n", a.url(), b.url())).unwrap();
    let r = router(vec![a.url()], LoadSignal::Inflight, |cfg| {
        cfg.membership.urls_file = Some(file.clone());
    })
    .await;
    let c = reqwest::Client::new();
    let mut both = [a.url(), b.url()];
    both.sort();
    wait_for("the file's worker joins the static one", 20, || async {
        urls(&c, &r.url()).await == both
    })
    .await;
    std::fs::write(&file, format!("{}\n", c2.url())).unwrap();
    let mut after = [a.url(), c2.url()];
    after.sort();
    wait_for(
        "the file's own worker is replaced and the static one stays",
        20,
        || async { urls(&c, &r.url()).await == after },
    )
    .await;
    r.stop().await;
    for e in [a, b, c2] {
        e.stop().await;
    }
}
