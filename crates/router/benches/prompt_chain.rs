//! Hashing a request's chain per block size: a 20k-token prompt at page size 1 (SGLang's default:
//! one SHA-256 per token, the floor), and at sizes 1, 16 and 64 together, as one request is
//! hashed for a fleet mixing the three. The bound: the three cost at most 2x the one.
//! Also prints whether this CPU has the SHA extensions the `sha2` crate uses at run time, and
//! times the reference chain (`loadlink_wire::kv_events::page_hashes`) at size 1 for comparison.

use criterion::{BatchSize, Criterion, Throughput, black_box, criterion_group, criterion_main};
use loadlink_router::cache::PromptChain;

const TOKENS: u32 = 20_000;

fn ids() -> Vec<u32> {
    (0..TOKENS)
        .map(|i| i.wrapping_mul(2_654_435_761) % 151_000)
        .collect()
}

fn bench(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    println!(
        "x86_64 SHA extensions (sha_ni): {}",
        std::arch::is_x86_feature_detected!("sha")
    );
    let mut g = c.benchmark_group("prompt_chain_20k");
    g.throughput(Throughput::Elements(u64::from(TOKENS)));
    for sizes in [&[1u64][..], &[16], &[64], &[1, 16, 64]] {
        let name = format!("sizes_{sizes:?}");
        g.bench_function(name, |b| {
            b.iter_batched(
                || PromptChain::of_ids(ids()),
                |mut p| {
                    for &s in sizes {
                        black_box(p.chain(s).len());
                    }
                    p
                },
                BatchSize::LargeInput,
            )
        });
    }
    // The reference chain through the streaming `Digest` API, for comparison at size 1.
    let tokens = ids();
    g.bench_function("reference_page_hashes_size_1", |b| {
        b.iter(|| black_box(loadlink_wire::kv_events::page_hashes(&tokens, 1).len()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
