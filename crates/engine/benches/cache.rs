//! The prefix cache's cost on the scheduler's path: hashing an 8k-token prompt into pages, the
//! match/lock/insert of that prompt against a cache full of other prompts, a scheduler step with
//! a full pool (eviction included) next to the step's simulated duration, and encoding a step's
//! KV-event batch.

use criterion::{BatchSize, Criterion, black_box, criterion_group, criterion_main};
use loadlink_engine::model::{ModelConfig, Scheduler, Submit};
use loadlink_engine::radix::{PageChain, PrefixCache};
use loadlink_wire::kv_events::{BlockRemoved, BlockStored, KvEvent, KvEventBatch, encode_kv_batch};
use std::sync::Arc;

const PAGE: usize = 16;
const PROMPT: u32 = 8192;

fn prompt(salt: u32) -> Vec<u32> {
    (0..PROMPT)
        .map(|i| i.wrapping_mul(2654435761) ^ salt)
        .collect()
}

/// A cache holding `n` distinct 8k prompts.
fn full_cache(n: u32) -> PrefixCache {
    let mut c = PrefixCache::new(PAGE, false);
    for s in 0..n {
        let p = prompt(s + 1);
        c.insert(&p, &PageChain::of(&p, PAGE));
    }
    c
}

fn bench(c: &mut Criterion) {
    let p = prompt(7);
    c.bench_function("page_chain_8k_tokens", |b| {
        b.iter(|| PageChain::of(black_box(&p), PAGE))
    });
    let chain = PageChain::of(&p, PAGE);
    let mut cache = full_cache(64);
    cache.insert(&p, &chain);
    c.bench_function("match_lock_unlock_8k_in_64_prompt_cache", |b| {
        b.iter(|| {
            let (lock, hit) = cache.lock(black_box(&chain));
            cache.unlock(lock);
            hit
        })
    });
    c.bench_function("insert_cached_8k_in_64_prompt_cache", |b| {
        b.iter(|| cache.insert(black_box(&p), &chain))
    });
    c.bench_function("insert_new_8k_then_evict_it", |b| {
        b.iter_batched(
            || full_cache(8),
            |mut c| {
                c.insert(&p, &chain);
                c.evict(PROMPT as u64)
            },
            BatchSize::LargeInput,
        )
    });
    step_with_full_pool(c);
    let batch = KvEventBatch {
        ts: 1.7e9,
        events: vec![
            KvEvent::Stored(BlockStored {
                block_hashes: chain.hashes.clone(),
                parent_block_hash: None,
                token_ids: p.iter().map(|&t| i64::from(t)).collect(),
                block_size: PAGE as i64,
                lora_id: None,
                medium: Some("GPU".into()),
                ..Default::default()
            }),
            KvEvent::Removed(BlockRemoved {
                block_hashes: chain.hashes[..64].to_vec(),
                medium: Some("GPU".into()),
            }),
        ],
        attn_dp_rank: Some(0),
    };
    let mut buf = Vec::with_capacity(64 << 10);
    c.bench_function("encode_kv_batch_512_pages_stored_64_removed", |b| {
        b.iter(|| {
            buf.clear();
            encode_kv_batch(black_box(&batch), &mut buf);
            buf.len()
        })
    });
}

/// One prefill step of an 8k prompt on a rank whose 200k-token pool is full of cached pages, so
/// admission evicts: the wall cost of `step` against the step's own simulated duration.
fn step_with_full_pool(c: &mut Criterion) {
    let cfg = ModelConfig::default();
    let mut warm = Scheduler::new(cfg);
    let mut now = 0.0;
    for s in 0..(cfg.max_total_tokens / PROMPT as u64) as u32 {
        warm.submit(Submit::tokens(s as u64, prompt(100 + s).into(), 1));
        loop {
            let st = warm.step(now);
            now += st.duration;
            if warm.is_idle() {
                break;
            }
        }
    }
    let fresh: Arc<[u32]> = prompt(9999).into();
    let mut simulated = 0.0;
    c.bench_function("prefill_step_8k_with_full_cache_evicting", |b| {
        b.iter_batched(
            || {
                let mut s = warm.clone();
                s.submit(Submit::tokens(1 << 40, fresh.clone(), 1));
                s
            },
            |mut s| {
                let st = s.step(now);
                simulated = st.duration;
                st.events.len()
            },
            BatchSize::LargeInput,
        )
    });
    eprintln!("simulated duration of that step: {simulated:.4} s");
}

criterion_group!(benches, bench);
criterion_main!(benches);
