//! The KV-event publisher on real libzmq sockets: live frames in order, replay from a seq with the
//! end marker, and a full queue that drops (counted, a seq hole) instead of blocking.

use loadlink_publish::{KvEventPublisher, KvPublisherConfig, free_port_block};
use loadlink_testkit::{first_message, replay, sub};
use loadlink_wire::kv_events::{BlockRemoved, KvEvent, KvEventBatch, decode_kv_batch};
use loadlink_wire::kv_snapshot::split_epoch_topic;
use std::sync::atomic::Ordering;

fn batch(i: i64) -> KvEventBatch {
    KvEventBatch {
        ts: i as f64,
        events: vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![i],
            medium: None,
        })],
        attn_dp_rank: Some(0),
    }
}

/// A SUB on `port`, returned once it has received one of the `AllCleared` heartbeats published
/// while it joins (slow joiner), with the join heartbeats drained and a 5 s receive timeout.
fn joined(ctx: &zmq::Context, p: &KvEventPublisher, port: u16) -> zmq::Socket {
    let s = sub(ctx, &format!("tcp://127.0.0.1:{port}"));
    let heartbeat = || KvEventBatch {
        ts: -1.0,
        events: vec![KvEvent::AllCleared],
        attn_dp_rank: None,
    };
    first_message(&s, || {
        p.publish(heartbeat());
    });
    // Drain the join heartbeats: the stream is quiet for 100 ms.
    while s.poll(zmq::POLLIN, 100).unwrap() > 0 {
        s.recv_multipart(0).unwrap();
    }
    s.set_rcvtimeo(5000).unwrap();
    s
}

#[test]
fn live_frames_in_order_and_replay_from_a_seq() {
    let base = free_port_block(2).unwrap();
    let ports = [base, base + 1];
    let ctx = zmq::Context::new();
    let mut cfg = KvPublisherConfig::new(format!("tcp://*:{}", ports[0]));
    cfg.replay_endpoint = Some(format!("tcp://*:{}", ports[1]));
    cfg.topic = "kv".into();
    cfg.buffer_steps = 4;
    let p = KvEventPublisher::bind(&ctx, cfg).unwrap();
    let sub = joined(&ctx, &p, ports[0]);
    for i in 0..6 {
        assert!(p.publish(batch(i)));
    }
    let mut live = Vec::new();
    while live.len() < 6 {
        let f = sub.recv_multipart(0).unwrap();
        assert_eq!(f.len(), 3);
        // The topic frame carries this publisher's epoch (on by default).
        assert_eq!(split_epoch_topic(&f[0]), (&b"kv"[..], Some(p.epoch())));
        let seq = i64::from_be_bytes(f[1][..].try_into().unwrap());
        live.push((seq, decode_kv_batch(&f[2]).unwrap()));
    }
    let first = live[0].0;
    assert!(live.windows(2).all(|w| w[1].0 == w[0].0 + 1));
    assert_eq!(
        live.iter().map(|(_, b)| b.clone()).collect::<Vec<_>>(),
        (0..6).map(batch).collect::<Vec<_>>()
    );

    // Replay from the seq of batch 3: the buffer (4 steps) still holds 2..5.
    let replayed: Vec<_> = replay(ports[1], first + 3)
        .into_iter()
        .map(|r| {
            assert_eq!(split_epoch_topic(&r.topic), (&b"kv"[..], Some(p.epoch())));
            (r.seq, decode_kv_batch(&r.payload).unwrap())
        })
        .collect();
    assert_eq!(replayed, live[3..].to_vec());
    assert_eq!(p.stats().replays.load(Ordering::Relaxed), 1);
}

#[test]
fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let ports = [free_port_block(1).unwrap()];
    let ctx = zmq::Context::new();
    let mut cfg = KvPublisherConfig::new(format!("tcp://*:{}", ports[0]));
    cfg.max_queue_size = 1;
    let mut p = KvEventPublisher::bind(&ctx, cfg).unwrap();
    let n = 20_000;
    let accepted = (0..n).filter(|&i| p.publish(batch(i))).count() as u64;
    p.close();
    let s = p.stats();
    assert_eq!(s.dropped.load(Ordering::Relaxed), n as u64 - accepted);
    assert_eq!(s.published.load(Ordering::Relaxed), accepted);
    assert!(accepted >= 1);
    // Every batch was given a seq, dropped or not: the drops are holes, not a shorter stream.
    assert_eq!(p.seq().last_assigned(), n - 1);
}
