//! KV snapshots of a running engine over real sockets: a DEALER's `snapshot-v1` request on a
//! rank's replay socket returns exactly what `/cache_blocks` shows for that rank at the header's
//! barrier seq (traffic quiesced), with the epoch `/server_info` and `/cache_blocks` advertise;
//! and after a forced publisher overflow (a one-slot queue and a burst) a SUB sees the seq hole
//! while a later snapshot still equals `/cache_blocks`.

use loadlink_testkit::kv_snapshot::snapshot;
use loadlink_testkit::{
    KvEngine, complete_ok, get_json, kv_engine, kv_engine_then, scrape, wait_until,
};
use loadlink_wire::kv_snapshot::split_epoch_topic;
use serde_json::{Value, json};

/// `/cache_blocks` per rank: (sorted blocks, seq, epoch), once two reads in a row agree (the
/// engine has quiesced: no request left in flight changes the cache).
async fn quiet_cache(c: &reqwest::Client, e: &KvEngine) -> Vec<(Vec<i64>, i64, u64)> {
    let read = || async {
        let v = get_json(c, &format!("{}/cache_blocks", e.engine.url())).await;
        v["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .map(|r| {
                let mut b: Vec<i64> = serde_json::from_value(r["blocks"].clone()).unwrap();
                b.sort_unstable();
                (b, r["seq"].as_i64().unwrap(), r["epoch"].as_u64().unwrap())
            })
            .collect::<Vec<_>>()
    };
    wait_until("the cache to quiesce", 20, || async {
        let a = read().await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let b = read().await;
        if a == b && e.engine.open_requests() == 0 {
            Ok(b)
        } else {
            Err("the cache still changes".to_string())
        }
    })
    .await
}

/// Snapshots every rank (on the blocking pool: libzmq calls block).
async fn snapshots(e: &KvEngine, ranks: u16) -> Vec<loadlink_testkit::kv_snapshot::Snapshot> {
    let port = e.replay_port;
    tokio::task::spawn_blocking(move || {
        (0..ranks)
            .map(|r| snapshot(port + r).expect("a snapshot, not an error"))
            .collect()
    })
    .await
    .unwrap()
}

/// Prompts that share prefixes (so the cache is a tree), spread over the ranks.
async fn traffic(c: &reqwest::Client, url: &str, n: u32, ranks: u32) {
    let mut pending = Vec::new();
    for i in 0..n {
        let shared: Vec<u32> = (0..32).map(|t| 100 + (i % 4) * 1000 + t).collect();
        let own: Vec<u32> = (0..16 + (i % 3) * 16)
            .map(|t| 50_000 + i * 100 + t)
            .collect();
        let body = json!({
            "input_ids": ([shared, own].concat()),
            "max_tokens": 3,
            "routed_dp_rank": i % ranks,
        });
        let (c, url) = (c.clone(), url.to_string());
        pending.push(tokio::spawn(
            async move { complete_ok(&c, &url, &body).await },
        ));
    }
    for p in pending {
        p.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_equals_cache_blocks_at_its_barrier_seq() {
    let e = kv_engine(|cfg| {
        cfg.dp_size = 2;
        cfg.time_scale = 50.0;
    })
    .await;
    let c = reqwest::Client::new();
    traffic(&c, &e.engine.url(), 40, 2).await;
    let cache = quiet_cache(&c, &e).await;
    let snaps = snapshots(&e, 2).await;
    let info = get_json(&c, &format!("{}/server_info", e.engine.url())).await;
    assert_eq!(info["kv_events"]["snapshot"], "snapshot-v1");
    for (rank, ((blocks, seq, epoch), snap)) in cache.iter().zip(&snaps).enumerate() {
        assert!(!blocks.is_empty(), "rank {rank} cached nothing");
        assert!(*seq >= 0, "rank {rank} published no batch");
        let h = &snap.header;
        assert_eq!(
            snap.blocks(),
            *blocks,
            "rank {rank}: snapshot vs /cache_blocks"
        );
        assert_eq!(
            (h.barrier_seq, h.resume_seq),
            (*seq, seq + 1),
            "rank {rank}"
        );
        assert_eq!(h.epoch, *epoch);
        assert_eq!(info["kv_events"]["epochs"][rank].as_u64(), Some(*epoch));
        assert_eq!((h.replica_rank, h.page_size), (rank as u32, Some(16)));
        assert!(
            snap.records.iter().all(|r| r.medium.is_none()),
            "device pages only"
        );
        // Shared prefixes: fewer records than blocks (chains were gathered).
        assert!(snap.records.len() < blocks.len());
    }
    assert_ne!(
        cache[0].2, cache[1].2,
        "each rank's publisher has its own epoch"
    );
    let m = scrape(&c, &e.engine.url()).await;
    let served = |rank: &str| {
        m.value(
            "loadlink_publish_total",
            &[
                ("rank", rank),
                ("sink", "kv_events"),
                ("outcome", "snapshots"),
            ],
        )
    };
    assert_eq!((served("0"), served("1")), (Some(1.0), Some(1.0)));
    e.engine.stop().await;
}

/// The `dropped` count of rank 0's KV publisher, from `/metrics`.
async fn dropped(c: &reqwest::Client, url: &str) -> f64 {
    scrape(c, url)
        .await
        .value(
            "loadlink_publish_total",
            &[("rank", "0"), ("sink", "kv_events"), ("outcome", "dropped")],
        )
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_forced_overflow_a_sub_sees_the_hole_and_a_snapshot_still_matches() {
    // KV events with replay and a one-slot queue (`max_queue_size: 1`), on ports the engine
    // bound (kv_engine retries a block another test took meanwhile).
    let e = kv_engine_then(
        |cfg| {
            // Steps as fast as the rank thread can go, and a pool for every prompt at once.
            cfg.time_scale = 1e6;
            cfg.model.max_total_tokens = 4_000_000;
            cfg.model.max_running_requests = 64;
        },
        |cfg| {
            let mut kv: Value =
                serde_json::from_str(cfg.kv_events_config.as_deref().unwrap_or("{}")).unwrap();
            kv["max_queue_size"] = json!(1);
            cfg.kv_events_config = Some(kv.to_string());
        },
    )
    .await;
    let url = e.engine.url();
    let c = reqwest::Client::new();
    // A SUB with no receive HWM, joined on the first batch a request causes.
    let sub = {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::SUB).unwrap();
        s.set_rcvhwm(0).unwrap();
        s.set_subscribe(b"").unwrap();
        s.connect(&format!("tcp://127.0.0.1:{}", e.kv_port))
            .unwrap();
        s
    };
    let mut i = 0u32;
    wait_until("the SUB to join", 20, || {
        i += 1;
        let ids: Vec<u32> = (0..32).map(|t| 3_000_000_000 + i * 100 + t).collect();
        let body = json!({"input_ids": ids, "max_tokens": 1});
        let (c, url) = (c.clone(), url.clone());
        let joined = sub.poll(zmq::POLLIN, 0).unwrap() > 0;
        async move {
            if joined {
                return Ok(());
            }
            complete_ok(&c, &url, &body).await;
            Err("no batch yet")
        }
    })
    .await;
    // Bursts of long prompts whose outputs end one decode step apart: every step then hands over
    // a large `BlockStored` (32k token ids), which takes the publishing thread longer to encode
    // and send than the rank takes to step. Until the one-slot queue overflowed (bounded).
    for burst in 0..10u32 {
        let mut pending = Vec::new();
        for j in 0..48u32 {
            let ids: Vec<u32> = (0..32_768).map(|t| (burst * 48 + j) * 40_000 + t).collect();
            let body = json!({"input_ids": ids, "max_tokens": 1 + j});
            let (c, url) = (c.clone(), url.clone());
            pending.push(tokio::spawn(
                async move { complete_ok(&c, &url, &body).await },
            ));
        }
        for p in pending {
            p.await.unwrap();
        }
        if dropped(&c, &url).await > 0.0 {
            break;
        }
    }
    let lost = dropped(&c, &url).await;
    assert!(lost > 0.0, "the one-slot queue never overflowed");
    let cache = quiet_cache(&c, &e).await;
    let (blocks, seq, epoch) = &cache[0];
    // The SUB saw every published batch in order, and the drops as holes up to `seq`.
    let seqs = tokio::task::spawn_blocking(move || {
        let mut seqs = Vec::new();
        while sub.poll(zmq::POLLIN, 500).unwrap() > 0 {
            let f = sub.recv_multipart(0).unwrap();
            seqs.push((
                i64::from_be_bytes(f[1][..].try_into().unwrap()),
                f[0].clone(),
            ));
        }
        seqs
    })
    .await
    .unwrap();
    assert!(seqs.windows(2).all(|w| w[0].0 < w[1].0), "in order");
    assert!(
        seqs.iter()
            .all(|(_, t)| split_epoch_topic(t) == (&b""[..], Some(*epoch)))
    );
    let (first, last) = (seqs[0].0, seqs.last().unwrap().0);
    assert_eq!(last, *seq, "the last batch seen is the last assigned");
    let holes = (last - first + 1) as usize - seqs.len();
    assert!(
        holes > 0,
        "no seq hole although {lost} batches were dropped"
    );
    // A later snapshot: the cache, at the last assigned seq (holes included).
    let snap = &snapshots(&e, 1).await[0];
    assert_eq!(snap.blocks(), *blocks);
    assert_eq!(snap.header.barrier_seq, *seq);
    e.engine.stop().await;
}
