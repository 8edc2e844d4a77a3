//! A snapshot that fails on a stream that then stays quiet is asked again after its backoff: no
//! live batch will ever reveal the hole, so without the retry the view would stay
//! `snapshot_failed` for good. A real `KvEventPublisher` plays the engine; its snapshot source
//! fails the first cut (the engine answers `error`) and serves the model cache after that.

use loadlink_publish::{CacheCut, CutPage, KvEventPublisher, KvPublisherConfig};
use loadlink_testkit::wait_until;
use loadlink_wire::kv_events::{BlockStored, KvEvent, KvEventBatch};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Blocks in the model cache: a chain, one per batch, far more than the replay buffer holds.
const BLOCKS: i64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_snapshot_is_asked_again_on_a_quiet_stream() {
    let base = loadlink_publish::free_port_block(2).expect("free ports");
    let mut cfg = KvPublisherConfig::new(format!("tcp://*:{base}"));
    cfg.replay_endpoint = Some(format!("tcp://*:{}", base + 1));
    cfg.buffer_steps = 4;
    let publisher = KvEventPublisher::bind(&zmq::Context::new(), cfg).expect("bind");
    let cuts = Arc::new(AtomicU32::new(0));
    let (seq, calls) = (publisher.seq(), cuts.clone());
    publisher.set_snapshot_source(Arc::new(move || {
        if calls.fetch_add(1, Relaxed) == 0 {
            return None; // the first cut fails: answered `error`
        }
        Some(CacheCut {
            replica_rank: 0,
            barrier_seq: seq.last_assigned(),
            page_size: 4,
            pages: (0..BLOCKS)
                .map(|hash| CutPage {
                    hash,
                    parent: (hash > 0).then(|| hash - 1),
                    medium: None,
                })
                .collect(),
        })
    }));
    for hash in 0..BLOCKS {
        publisher.publish(KvEventBatch {
            ts: hash as f64,
            events: vec![KvEvent::Stored(BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: (hash > 0).then(|| hash - 1),
                block_size: 4,
                ..Default::default()
            })],
            attn_dp_rank: Some(0),
        });
    }
    // The router joins the stream after it went quiet: nothing is published from here on.
    let (book, fleet, d) = loadlink_testkit::bare_kv_fleet(base, 4);
    let url = "http://127.0.0.1:9";
    fleet.add(url, d);
    let worker = fleet.workers()[0].clone();
    wait_until(
        "the view to be complete after the retried snapshot",
        30,
        || {
            let kv = book.worker_json(&worker).0;
            let mut mine = book.rank_blocks(url, 0).unwrap_or_default();
            mine.sort_unstable();
            let failed = book.counters.snapshots_failed.load(Relaxed);
            async move {
                let whole = mine == (0..BLOCKS).collect::<Vec<_>>();
                if whole && kv["views"][0] == "complete" {
                    Ok(())
                } else {
                    Err(format!(
                        "{failed} snapshots failed; {} blocks; {kv}",
                        mine.len()
                    ))
                }
            }
        },
    )
    .await;
    assert!(
        book.counters.snapshots_failed.load(Relaxed) >= 1,
        "the first cut failed"
    );
    assert!(book.counters.snapshots_loaded.load(Relaxed) >= 1);
    assert!(cuts.load(Relaxed) >= 2, "the router asked again");
    tokio::task::spawn_blocking(move || fleet.remove(url))
        .await
        .expect("remove");
}
