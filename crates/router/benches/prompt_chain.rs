//! Hashing a request's chain per block size: a 20k-token prompt at page size 1 (SGLang's default:
//! one SHA-256 per token, the floor), and at sizes 1, 16 and 64 together, as one request is
//! hashed for a fleet mixing the three. The issue's bound: the three cost at most 2x the one.
//! And the chat-template render a `--tokenizer` router adds per chat request.
//! Also prints whether this CPU has the SHA extensions the `sha2` crate uses at run time, and
//! times the reference chain (`loadlink_wire::kv_events::page_hashes`) at size 1 for comparison.

use criterion::{BatchSize, Criterion, Throughput, black_box, criterion_group, criterion_main};
use loadlink_router::cache::{PromptChain, RouterTokenizer, prompt_ids};
use std::path::Path;

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

/// A chat request's render through a published template (Llama 3.1's, with two tools and ten
/// turns), the work `--tokenizer` adds per chat request before hashing. The tokenizer is a small
/// word-level one, so the figure is mostly the template's.
fn render(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let model = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab([("<unk>".to_string(), 0u32)].into_iter().collect())
        .unk_token("<unk>".into())
        .build()
        .expect("a word-level model");
    let mut tok = tokenizers::Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::Whitespace {}));
    tok.save(dir.path().join("tokenizer.json"), false)
        .expect("saved");
    let template = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/interop/templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
    std::fs::copy(template, dir.path().join("chat_template.jinja")).expect("the template");
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}"#,
    )
    .expect("the config");
    let tok = RouterTokenizer::load(Some(dir.path())).expect("the tokenizer loads");
    let tool = |name: &str| {
        serde_json::json!({"type": "function", "function": {"name": name, "description": "Looks things up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "the query"},
            "limit": {"type": "integer", "default": 10}}, "required": ["q"]}}})
    };
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 0..10 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": format!("turn {i}: {}", "words ".repeat(40))}));
    }
    let body = serde_json::json!({"messages": messages, "tools": [tool("search"), tool("fetch")]})
        .to_string();
    assert!(prompt_ids("/v1/chat/completions", body.as_bytes(), &tok).is_ok());
    c.bench_function("chat_render_llama31_10_turns_2_tools", |b| {
        b.iter(|| black_box(prompt_ids("/v1/chat/completions", body.as_bytes(), &tok)))
    });
}

criterion_group!(benches, bench, render);
criterion_main!(benches);
