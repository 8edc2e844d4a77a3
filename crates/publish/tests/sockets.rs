//! The sinks on real sockets and files: frames as a libzmq SUB reads them, the advertisement equal
//! to what was bound, declines that bind and advertise nothing, and a publish path that never blocks.

use loadlink_publish::{
    Encoded, EngineSettings, InternalSink, PubSink, Publisher, PushSink, ShmSink, Sink,
    WriteOutcome, build_sinks, free_port_block,
};
use loadlink_testkit::{KvEvents, first_message, publish_until_received, snapshot_pub, sub};
use loadlink_wire::codec::{decode_payload, snapshot_bytes};
use loadlink_wire::{Generation, LoadSnapshot, Payload};
use std::time::Duration;

/// A free port for one socket.
fn port() -> u16 {
    free_port_block(1).unwrap()
}

fn snap(rank: i64, waiting: i64) -> LoadSnapshot {
    LoadSnapshot {
        timestamp: Some(1.5),
        dp_rank: rank,
        num_waiting_reqs: waiting,
        num_running_reqs: 3,
        ..Default::default()
    }
}

#[test]
fn generation_a_frames_and_sequence() {
    let ctx = zmq::Context::new();
    let pub_port = port();
    let mut p = snapshot_pub(&ctx, pub_port).unwrap();
    let s = sub(&ctx, &format!("tcp://127.0.0.1:{pub_port}"));
    let f = publish_until_received(&mut p, &s, &snap(0, 4));
    assert_eq!(f.len(), 3);
    assert_eq!(f[0], b"");
    assert_eq!(f[1].len(), 8);
    let first_seq = i64::from_be_bytes(f[1].clone().try_into().unwrap());
    assert_eq!(
        decode_payload(&f[2]).unwrap(),
        Payload::Snapshot(snap(0, 4))
    );
    let f2 = publish_until_received(&mut p, &s, &snap(0, 5));
    assert_eq!(
        i64::from_be_bytes(f2[1].clone().try_into().unwrap()),
        first_seq + 1,
        "seq counts up by one"
    );
}

#[test]
fn generation_b_sends_changes_at_once_and_unchanged_stats_only_on_heartbeat() {
    let ctx = zmq::Context::new();
    let pub_port = port();
    let mut p = PubSink::bind(
        &ctx,
        &format!("tcp://*:{pub_port}"),
        Generation::LoadStat,
        2,
        1,
    )
    .unwrap()
    .with_heartbeat(Duration::from_millis(300));
    let s = sub(&ctx, &format!("tcp://127.0.0.1:{pub_port}"));
    let f = publish_until_received(&mut p, &s, &snap(2, 4));
    assert_eq!(f[0], b"load");
    let Payload::Stat(st) = decode_payload(&f[2]).unwrap() else {
        panic!("expected a LoadStat")
    };
    assert_eq!((st.num_waiting_reqs, st.attn_dp_rank), (4, Some(2)));
    let same = snapshot_bytes(&snap(2, 4));
    let w = |p: &mut PubSink, sn: &LoadSnapshot, b: &[u8]| {
        p.write(Encoded {
            snapshot: sn,
            bytes: b,
        })
        .unwrap()
    };
    assert_eq!(
        w(&mut p, &snap(2, 4), &same),
        WriteOutcome::Skipped,
        "unchanged within the heartbeat"
    );
    let changed = snap(2, 9);
    assert_eq!(
        w(&mut p, &changed, &snapshot_bytes(&changed)),
        WriteOutcome::Sent,
        "a change goes out at once"
    );
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(
        w(&mut p, &changed, &snapshot_bytes(&changed)),
        WriteOutcome::Sent,
        "heartbeat re-sends"
    );
}

#[test]
fn pub_sink_refuses_a_concrete_host() {
    let ctx = zmq::Context::new();
    let e = PubSink::bind(&ctx, "tcp://127.0.0.1:41031", Generation::Snapshot, 0, 1)
        .err()
        .unwrap();
    assert!(e.to_string().contains("wildcard"), "{e}");
}

fn settings(kv: Option<&str>, mode: Option<&str>, dp: u32, g: Generation) -> EngineSettings {
    EngineSettings {
        kv_events_config: kv.map(Into::into),
        load_publish_endpoint: mode.map(Into::into),
        publish_interval: 1,
        dp_size: dp,
        generation: g,
        internal: InternalSink::None,
    }
}

#[test]
fn advertised_base_is_the_bound_base_for_dp_1_2_8_in_both_generations() {
    let ctx = zmq::Context::new();
    for g in [Generation::Snapshot, Generation::LoadStat] {
        for dp in [1u32, 2, 8] {
            // The KV port itself is not bound here; the load range follows it.
            let kv_port = free_port_block(2 * dp as u16).unwrap();
            let kv = KvEvents::zmq(kv_port).json();
            let st = settings(Some(&kv), Some("auto"), dp, g);
            let desc = st.advertise(16).expect("an active KV config is advertised");
            let base = desc
                .load_endpoint_port_base
                .expect("a resolved range is advertised");
            assert_eq!(desc.load_topic.is_some(), g == Generation::LoadStat);
            for (rank, ep) in desc.load_endpoints("127.0.0.1").into_iter().enumerate() {
                let built = build_sinks(&ctx, &st, rank as u32);
                assert_eq!(built.range.as_ref().map(|r| r.base), Some(base));
                assert_eq!(
                    built.sinks.len(),
                    1,
                    "the PUB sink was built: {:?}",
                    built.pub_declined
                );
                let mut sinks = built.sinks;
                let s = sub(&ctx, &ep.endpoint);
                let f = publish_until_received(sinks[0].as_mut(), &s, &snap(rank as i64, 1));
                assert_eq!(
                    f[0],
                    g.topic(),
                    "rank {rank} answers on the advertised port {}",
                    ep.endpoint
                );
            }
        }
    }
}

#[test]
fn every_decline_binds_nothing_and_advertises_no_range() {
    let ctx = zmq::Context::new();
    let cases = [
        (None, None, Generation::Snapshot),
        (
            Some(KvEvents::zmq(43000).publisher("null").json()),
            None,
            Generation::Snapshot,
        ),
        (
            Some(KvEvents::zmq(43010).json()),
            Some("off"),
            Generation::Snapshot,
        ),
        (
            Some(KvEvents::zmq(43020).json()),
            None,
            Generation::LoadStat,
        ),
        (
            Some(KvEvents::endpoint("tcp://127.0.0.1:43030").json()),
            None,
            Generation::Snapshot,
        ),
        (
            Some(KvEvents::endpoint("ipc:///tmp/kv").json()),
            Some("auto"),
            Generation::LoadStat,
        ),
        (
            Some(KvEvents::zmq(65534).json()),
            None,
            Generation::Snapshot,
        ),
        (
            Some(KvEvents::zmq(43040).replay(43041).json()),
            None,
            Generation::Snapshot,
        ),
        (
            Some(KvEvents::zmq(43050).json()),
            Some("tcp://10.0.0.1:7000"),
            Generation::LoadStat,
        ),
        (Some("{not json".into()), Some("auto"), Generation::Snapshot),
    ];
    for (kv, mode, g) in cases {
        let st = settings(kv.as_deref(), mode, 4, g);
        let built = build_sinks(&ctx, &st, 0);
        assert!(
            built.sinks.is_empty() && built.range.is_none(),
            "{kv:?} {mode:?}: bound {:?}",
            built.range
        );
        let adv = st.advertise(16);
        assert_eq!(
            adv.and_then(|d| d.load_endpoint_port_base),
            None,
            "{kv:?} {mode:?}"
        );
    }
}

#[test]
fn a_bad_router_endpoint_costs_only_the_pub_sink() {
    let ctx = zmq::Context::new();
    let dir = tempfile::tempdir().unwrap();
    let kv = KvEvents::zmq(free_port_block(2).unwrap()).json();
    let mut st = settings(
        Some(&kv),
        Some("tcp://10.1.1.1:7000"),
        1,
        Generation::Snapshot,
    );
    st.internal = InternalSink::Shm(dir.path().join("loads.shm"));
    let built = build_sinks(&ctx, &st, 0);
    assert_eq!(built.sinks.len(), 1);
    assert!(built.sinks[0].internal());
    assert!(built.pub_declined.unwrap().contains("not a bindable"));
    // Internal sink first even when both exist.
    st.load_publish_endpoint = None;
    let built = build_sinks(&ctx, &st, 0);
    assert_eq!(
        built.sinks.iter().map(|s| s.name()).collect::<Vec<_>>(),
        ["shm", "pub"]
    );
}

#[test]
fn publish_never_blocks_without_subscribers_or_with_a_stalled_one() {
    let ctx = zmq::Context::new();
    let pub_port = port();
    let p = snapshot_pub(&ctx, pub_port).unwrap();
    let stalled = ctx.socket(zmq::SUB).unwrap();
    stalled.set_rcvhwm(1).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled
        .connect(&format!("tcp://127.0.0.1:{pub_port}"))
        .unwrap();
    // A PUSH with no PULL peer at all: a blocking send would hang here forever.
    let push = PushSink::connect(&ctx, &format!("tcp://127.0.0.1:{}", port()), 0, 1).unwrap();
    let mut publisher = Publisher::new(
        || Ok(snap(0, 7)),
        vec![Box::new(push) as Box<dyn Sink>, Box::new(p)],
    );
    for _ in 0..20_000 {
        publisher.publish(false);
    }
    let stats = publisher.stats();
    let pushed = &stats[0].1;
    let published = &stats[1].1;
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        published.published.load(Relaxed),
        20_000,
        "PUB sheds at HWM silently, never fails"
    );
    assert_eq!(
        pushed.published.load(Relaxed) + pushed.dropped.load(Relaxed),
        20_000
    );
    // With CONFLATE the PUSH pipe keeps only the newest snapshot: older ones are overwritten, so
    // nothing is ever refused (EAGAIN) and the sender never waits for a peer.
    drop(stalled);
}

#[test]
fn push_sink_feeds_a_pull_owner_and_shm_rejects_a_foreign_rank() {
    let ctx = zmq::Context::new();
    let pull = ctx.socket(zmq::PULL).unwrap();
    let pull_port = port();
    pull.bind(&format!("tcp://127.0.0.1:{pull_port}")).unwrap();
    pull.set_rcvtimeo(50).unwrap();
    let mut push = PushSink::connect(&ctx, &format!("tcp://127.0.0.1:{pull_port}"), 1, 1).unwrap();
    let s = snap(1, 6);
    let b = snapshot_bytes(&s);
    let got = first_message(&pull, || {
        push.write(Encoded {
            snapshot: &s,
            bytes: &b,
        })
        .unwrap();
    });
    assert_eq!(got, [b]);
    let dir = tempfile::tempdir().unwrap();
    let mut shm = ShmSink::open(&dir.path().join("x.shm"), 2, 0, 1).unwrap();
    let other = snap(1, 1);
    let e = shm
        .write(Encoded {
            snapshot: &other,
            bytes: &snapshot_bytes(&other),
        })
        .unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    assert!(ShmSink::open(&dir.path().join("y.shm"), 2, 2, 1).is_err());
}

#[test]
fn shm_sink_round_trips_and_seeds_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loads.shm");
    let mut a = ShmSink::open(&path, 2, 0, 1).unwrap();
    let _b = ShmSink::open(&path, 2, 1, 1).unwrap();
    let slots = loadlink_publish::read_slots(&path).unwrap();
    assert_eq!(
        decode_payload(slots[1].as_ref().unwrap()).unwrap(),
        Payload::Snapshot(LoadSnapshot {
            dp_rank: 1,
            ..Default::default()
        })
    );
    let big = LoadSnapshot {
        decode_moments: Some(vec![1.0; 100]),
        ..snap(0, 3)
    };
    a.write(Encoded {
        snapshot: &big,
        bytes: &snapshot_bytes(&big),
    })
    .unwrap();
    let small = snap(0, 2);
    a.write(Encoded {
        snapshot: &small,
        bytes: &snapshot_bytes(&small),
    })
    .unwrap();
    let slots = loadlink_publish::read_slots(&path).unwrap();
    assert_eq!(
        decode_payload(slots[0].as_ref().unwrap()).unwrap(),
        Payload::Snapshot(small)
    );
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn churning_subscribers_neither_block_publish_nor_grow_memory() {
    let ctx = zmq::Context::new();
    let pub_port = port();
    let p = snapshot_pub(&ctx, pub_port).unwrap();
    let mut publisher = Publisher::new(|| Ok(snap(0, 1)), vec![Box::new(p) as Box<dyn Sink>]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ctx2, stop2) = (ctx.clone(), stop.clone());
    let churn = std::thread::spawn(move || {
        let mut n = 0;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            let s = ctx2.socket(zmq::SUB).unwrap();
            s.set_subscribe(b"").unwrap();
            s.set_linger(0).unwrap();
            s.connect(&format!("tcp://127.0.0.1:{pub_port}")).unwrap();
            std::thread::sleep(Duration::from_millis(2));
            drop(s);
            n += 1;
        }
        n
    });
    for _ in 0..20_000 {
        publisher.publish(false);
    }
    let warm = rss_kib();
    for _ in 0..100_000 {
        publisher.publish(false);
    }
    let after = rss_kib();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cycles = churn.join().unwrap();
    assert!(
        cycles > 10,
        "the subscriber really churned ({cycles} connects)"
    );
    assert_eq!(
        publisher.stats()[0]
            .1
            .published
            .load(std::sync::atomic::Ordering::Relaxed),
        120_000
    );
    assert!(
        after < warm + 16 * 1024,
        "RSS grew from {warm} KiB to {after} KiB over 100,000 publishes"
    );
}
