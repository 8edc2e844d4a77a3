//! Snapshots, seq holes and the replay thread of the KV-event publisher, on real libzmq sockets:
//! a DEALER's snapshot request gets the source's cut (ordered, chunked, with the publisher's
//! epoch), a publisher without a source answers `error`, a snapshot stalled inside its source does
//! not hold back live batches, a batch dropped on a full queue is a seq hole a SUB sees, and
//! malformed or oversized requests are counted (or cut off) without stopping the socket.

use loadlink_publish::{CacheCut, CutPage, KvEventPublisher, KvPublisherConfig, free_port_block};
use loadlink_testkit::first_message;
use loadlink_testkit::kv_snapshot::{ask_snapshot, read_snapshot, snapshot, snapshot_dealer};
use loadlink_wire::kv_events::{KvEvent, KvEventBatch};
use loadlink_wire::kv_snapshot::split_epoch_topic;
use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

fn batch() -> KvEventBatch {
    KvEventBatch {
        ts: 1.0,
        events: vec![KvEvent::AllCleared],
        attn_dp_rank: Some(0),
    }
}

/// A publisher with replay on a free port block; returns it with its (PUB, ROUTER) ports.
fn publisher(tweak: impl FnOnce(&mut KvPublisherConfig)) -> (KvEventPublisher, u16, u16) {
    let base = free_port_block(2).unwrap();
    let mut cfg = KvPublisherConfig::new(format!("tcp://*:{base}"));
    cfg.replay_endpoint = Some(format!("tcp://*:{}", base + 1));
    tweak(&mut cfg);
    let p = KvEventPublisher::bind(&zmq::Context::new(), cfg).unwrap();
    (p, base, base + 1)
}

/// A SUB that keeps every message (no receive HWM), joined (it has received one batch).
fn joined_sub(ctx: &zmq::Context, p: &KvEventPublisher, port: u16) -> zmq::Socket {
    let s = ctx.socket(zmq::SUB).unwrap();
    s.set_rcvhwm(0).unwrap();
    s.set_subscribe(b"").unwrap();
    s.set_rcvtimeo(50).unwrap();
    s.connect(&format!("tcp://127.0.0.1:{port}")).unwrap();
    first_message(&s, || {
        p.publish(batch());
    });
    s.set_rcvtimeo(5000).unwrap();
    s
}

fn seq_of(frames: &[Vec<u8>]) -> i64 {
    i64::from_be_bytes(frames[1][..].try_into().unwrap())
}

/// A tree of `n` pages: a chain, with every tenth page also starting a side branch of two, and
/// a host-tier page below the last one.
fn tree(n: i64) -> Vec<CutPage> {
    let mut pages = Vec::new();
    for i in 0..n {
        pages.push(CutPage {
            hash: i,
            parent: (i > 0).then(|| i - 1),
            medium: None,
        });
        if i % 10 == 0 {
            pages.push(CutPage {
                hash: 1_000_000 + i,
                parent: Some(i),
                medium: None,
            });
            pages.push(CutPage {
                hash: 2_000_000 + i,
                parent: Some(1_000_000 + i),
                medium: None,
            });
        }
    }
    pages.push(CutPage {
        hash: -7,
        parent: Some(n - 1),
        medium: Some("CPU_PINNED"),
    });
    pages.reverse(); // the cache lists pages in no order
    pages
}

#[test]
fn a_snapshot_is_the_sources_cut_ordered_and_chunked() {
    let (p, _, replay) = publisher(|_| {});
    let pages = tree(9000); // 9,000 + 1,800 + 1 pages: three chunks at least
    let cut = CacheCut {
        replica_rank: 3,
        barrier_seq: 41,
        page_size: 16,
        pages: pages.clone(),
    };
    assert!(p.set_snapshot_source(Arc::new(move || Some(cut.clone()))));
    let snap = snapshot(replay).expect("a snapshot, not an error");
    let h = snap.header;
    assert_eq!(
        (
            h.version,
            h.epoch,
            h.replica_rank,
            h.barrier_seq,
            h.resume_seq
        ),
        (1, p.epoch(), 3, 41, 42)
    );
    assert_eq!((h.page_size, h.hash_schema_version), (Some(16), Some(1)));
    let mut want: Vec<i64> = pages.iter().map(|c| c.hash).collect();
    want.sort_unstable();
    assert_eq!(snap.blocks(), want);
    let host: Vec<_> = snap.records.iter().filter(|r| r.medium.is_some()).collect();
    assert_eq!(host.len(), 1);
    assert_eq!(
        (host[0].blocks.as_slice(), host[0].medium.as_deref()),
        (&[-7][..], Some("CPU_PINNED"))
    );
    assert_eq!(p.stats().snapshots.load(Ordering::Relaxed), 1);
    // A second request gets a new barrier id.
    assert_ne!(snapshot(replay).unwrap().header.barrier_id, h.barrier_id);
}

#[test]
fn without_a_source_the_answer_is_an_error_and_replay_still_works() {
    let (p, _, replay) = publisher(|_| {});
    let reason = snapshot(replay).unwrap_err();
    assert!(reason.contains("snapshot source"), "{reason}");
    assert_eq!(p.stats().snapshot_errors.load(Ordering::Relaxed), 1);
    assert_eq!(p.stats().snapshots.load(Ordering::Relaxed), 0);
    // A source that fails answers an error too.
    assert!(p.set_snapshot_source(Arc::new(|| None)));
    assert!(snapshot(replay).unwrap_err().contains("could not"));
    // The same socket still answers replays (an empty buffer: just the end marker).
    assert!(loadlink_testkit::replay(replay, 0).is_empty());
}

#[test]
fn a_snapshot_stalled_in_its_source_does_not_hold_back_live_batches() {
    let (p, pub_port, replay) = publisher(|c| c.topic = "kv".into());
    // The source signals that it was entered, then waits until the test lets it go.
    let (entered_tx, entered) = sync_channel::<()>(1);
    let (release, release_rx) = sync_channel::<()>(1);
    let release_rx = Mutex::new(release_rx);
    p.set_snapshot_source(Arc::new(move || {
        let _ = entered_tx.send(());
        let _ = release_rx.lock().unwrap().recv();
        Some(CacheCut::default())
    }));
    let ctx = zmq::Context::new();
    let s = joined_sub(&ctx, &p, pub_port);
    while s.poll(zmq::POLLIN, 100).unwrap() > 0 {
        s.recv_multipart(0).unwrap(); // the join batches
    }
    let dealer = snapshot_dealer(&ctx, replay);
    ask_snapshot(&dealer);
    entered.recv().unwrap(); // the replay thread is now inside the source
    let first = p.seq().last_assigned() + 1;
    for _ in 0..200 {
        assert!(p.publish(batch()));
    }
    // Every live batch arrives while the snapshot is still stalled.
    for i in 0..200 {
        let f = s
            .recv_multipart(0)
            .expect("a live batch during the stalled snapshot");
        assert_eq!(seq_of(&f), first + i);
        assert_eq!(split_epoch_topic(&f[0]), (&b"kv"[..], Some(p.epoch())));
    }
    assert_eq!(
        dealer.poll(zmq::POLLIN, 0).unwrap(),
        0,
        "no answer before the cut"
    );
    release.send(()).unwrap();
    let snap = read_snapshot(&dealer).expect("the snapshot once released");
    assert!(snap.records.is_empty());
    assert_eq!(
        snap.header.barrier_seq, 0,
        "the cut's own barrier (a default cut)"
    );
    assert_eq!(
        snap.header.page_size, None,
        "an unknown page size is left out"
    );
}

#[test]
fn a_dropped_batch_is_a_seq_hole_a_subscriber_sees() {
    let (mut p, pub_port, _) = publisher(|c| c.max_queue_size = 1);
    let ctx = zmq::Context::new();
    let s = joined_sub(&ctx, &p, pub_port);
    while s.poll(zmq::POLLIN, 100).unwrap() > 0 {
        s.recv_multipart(0).unwrap();
    }
    let first = p.seq().last_assigned() + 1;
    let dropped_before = p.stats().dropped.load(Ordering::Relaxed);
    // Bursts until the one-slot queue has overflowed at least once (bounded).
    let mut n = 0i64;
    for _ in 0..50 {
        for _ in 0..2000 {
            p.publish(batch());
            n += 1;
        }
        if p.stats().dropped.load(Ordering::Relaxed) > dropped_before {
            break;
        }
    }
    // Only `publish` drops, so the count is final; everything else reaches the socket. Read it
    // before closing: a closed PUB (linger 0) discards what its I/O thread has not sent yet.
    let dropped = p.stats().dropped.load(Ordering::Relaxed) - dropped_before;
    assert!(
        dropped > 0,
        "a one-slot queue never overflowed in {n} batches"
    );
    let published = n - dropped as i64;
    let mut seqs = Vec::new();
    while seqs.len() < published as usize {
        seqs.push(seq_of(&s.recv_multipart(0).expect("every published batch")));
    }
    // In order, within the burst's seqs, and the missing ones are exactly the drops.
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert!(seqs.iter().all(|&q| (first..first + n).contains(&q)));
    let holes = (first..first + n).count() - seqs.len();
    assert_eq!(holes as u64, dropped);
    assert_eq!(p.seq().last_assigned(), first + n - 1);
    p.close();
}

#[test]
fn hostile_requests_are_counted_and_the_socket_still_answers() {
    let (p, _, replay) = publisher(|_| {});
    let ctx = zmq::Context::new();
    // A peer sending an oversized frame is cut off by the socket (never buffered).
    let big = snapshot_dealer(&ctx, replay);
    big.send_multipart([&b""[..], &vec![b'x'; 1 << 20]], 0)
        .unwrap();
    // Malformed requests on one connection, then a snapshot request: answered in order.
    let d = snapshot_dealer(&ctx, replay);
    d.send_multipart([&b""[..], b"snapshot-v2"], 0).unwrap();
    d.send_multipart([&b""[..], b"a", b"b"], 0).unwrap();
    d.send_multipart([&b""[..], &[0u8; 7][..]], 0).unwrap();
    ask_snapshot(&d);
    assert!(read_snapshot(&d).unwrap_err().contains("snapshot source"));
    assert_eq!(p.stats().errors.load(Ordering::Relaxed), 3);
    assert_eq!(p.stats().snapshot_errors.load(Ordering::Relaxed), 1);
    // No answer to any of them but the snapshot request.
    assert_eq!(d.poll(zmq::POLLIN, 0).unwrap(), 0);
}
