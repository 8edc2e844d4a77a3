//! The request path's model work: reading a body's `model`, `lora_path`, `cache_salt` and
//! `extra_key` ([`Asked::of`]), resolving them against a fleet's model table
//! ([`ModelTable::resolve`]) and pricing an adapter on every candidate
//! ([`AdapterBook::fill_costs`]). Fleet: 3 models on 12 workers, the third with 32 adapters.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use loadlink_router::adapters::AdapterBook;
use loadlink_router::book::Worker;
use loadlink_router::candidate::{CandidateList, RankField};
use loadlink_router::models::{Asked, ModelTable, ServedModels};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

fn fleet() -> (Vec<Arc<Worker>>, ModelTable) {
    let epoch = Instant::now();
    let workers: Vec<Arc<Worker>> = (0..12)
        .map(|i| Arc::new(Worker::new(format!("http://w{i}:8000"), 0, None, epoch)))
        .collect();
    let adapters: Vec<String> = (0..32).map(|a| format!("a{a:02}=/lora/a{a:02}")).collect();
    let mut served = HashMap::new();
    for (i, w) in workers.iter().enumerate() {
        let info = match i % 3 {
            0 => json!({"served_model_name": "big", "model_path": "/m/big"}),
            1 => json!({"served_model_name": "small"}),
            _ => json!({"served_model_name": "base", "lora_paths": adapters}),
        };
        let mut s = ServedModels::default();
        s.read_server_info(info.to_string().as_bytes()).unwrap();
        served.insert(w.url.clone(), Arc::new(s));
    }
    let list = CandidateList::of(&workers, RankField::Both);
    let table = ModelTable::build(&workers, &list, &served, &mut HashMap::new());
    (workers, table)
}

fn bench(c: &mut Criterion) {
    let (workers, table) = fleet();
    let body = json!({"model": "base:a17", "prompt": "x".repeat(2000), "max_tokens": 64,
        "cache_salt": "tenant-4", "stream": true})
    .to_string();
    c.bench_function("asked_of_2kB_body", |b| {
        b.iter(|| Asked::of(black_box(body.as_bytes())))
    });
    c.bench_function("resolve_base_colon_adapter", |b| {
        b.iter(|| {
            table
                .resolve(black_box(Some("base:a17")), None, None)
                .unwrap()
        })
    });
    c.bench_function("resolve_named_model", |b| {
        b.iter(|| {
            table
                .resolve(black_box(Some("/m/big")), None, None)
                .unwrap()
        })
    });
    let book = Arc::new(AdapterBook::default());
    let id = book.intern("a17").unwrap();
    let r = table.resolve(Some("base:a17"), None, None).unwrap();
    let list = CandidateList::of(&workers, RankField::Both);
    let all = loadlink_router::candidate::Candidates::whole(&workers);
    let targets = table.targets(r.set, all, &list.ranked, false);
    let mut costs = Vec::new();
    c.bench_function("adapter_costs_4_candidates", |b| {
        b.iter(|| book.fill_costs(black_box(targets), id, 1_000, &mut costs))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
