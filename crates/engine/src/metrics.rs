//! `GET /metrics`: SGLang's scheduler gauges per `dp_rank` (read from the SHM slots, as the
//! dispatcher reads them), the engine's request counters and the publisher's per-sink outcomes,
//! written through the one Prometheus writer (`loadlink_wire::prom`), one family at a time.

use crate::rank::CacheCounters;
use crate::state::{AppState, RankFrom};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::prom::{Exposition, MetricType, Number};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

loadlink_wire::label_set! {
    /// The labels of SGLang's per-rank gauges.
    struct RankLabels<'a> { dp_rank: i64, model_name: &'a str }
}

loadlink_wire::label_set! {
    /// The labels of `loadlink_publish_total`.
    struct PublishLabels<'a> { rank: u32, sink: &'a str, outcome: &'a str }
}

type Gauge = (&'static str, &'static str, fn(&LoadSnapshot) -> f64);

loadlink_wire::label_set! {
    /// The `rank` label of the per-rank cache families.
    struct Rank { rank: u32 }
}

loadlink_wire::label_set! {
    /// The labels of `loadlink_engine_rank_requests_total`.
    struct RankFromLabels { dp_rank: u32, rank_from: &'static str }
}

/// `loadlink_engine_rank_requests_total{dp_rank,rank_from}`: where requests ran, and whether
/// their client routed them there or the dispatcher picked the rank.
fn rank_requests_family(page: &mut Exposition, st: &AppState) {
    let mut family = page.family(
        "loadlink_engine_rank_requests_total",
        MetricType::Counter,
        "Generation requests accepted per DP rank, by how the rank was chosen (routed: the \
         client named it; dispatcher: the engine picked it)",
    );
    for (rank, counts) in st.rank_requests.iter().enumerate() {
        for from in RankFrom::ALL {
            let labels = RankFromLabels {
                dp_rank: rank as u32,
                rank_from: from.label(),
            };
            family.sample(&labels, counts[from as usize].load(Ordering::Relaxed));
        }
    }
}

loadlink_wire::label_set! {
    /// The `model` label of `loadlink_engine_model_requests_total`.
    struct ModelLabel<'a> { model: &'a str }
}

/// What each model and adapter was asked for (`loadlink_engine_model_requests_total{model}`: each
/// served name, each adapter, and `<unserved>` for requests naming anything else, whether served
/// by the base model anyway (SGLang) or refused), and the adapters' loads and residency per rank.
/// Both flavours serve them.
pub(crate) fn model_families(page: &mut Exposition, st: &AppState) {
    let mut family = page.family(
        "loadlink_engine_model_requests_total",
        MetricType::Counter,
        "Generation requests by the model or adapter they asked for (<unserved>: one this engine \
         does not serve)",
    );
    for (model, n) in st.served.labels().zip(&st.model_requests) {
        family.sample(&ModelLabel { model }, n.load(Ordering::Relaxed));
    }
    drop(family);
    for (name, ty, help, read) in LORA_FAMILIES {
        let mut family = page.family(name, ty, help);
        for r in &st.ranks {
            family.sample(
                &Rank { rank: r.rank },
                read(&r.cache).load(Ordering::Relaxed),
            );
        }
    }
}

const LORA_FAMILIES: [(&str, MetricType, &str, CacheReading); 2] = [
    (
        "loadlink_engine_lora_loads_total",
        MetricType::Counter,
        "LoRA adapter loads (each paused its rank's batch for the load time)",
        |c| &c.lora_loads,
    ),
    (
        "loadlink_engine_lora_resident",
        MetricType::Gauge,
        "LoRA adapters resident now",
        |c| &c.lora_resident,
    ),
];

type CacheReading = fn(&CacheCounters) -> &AtomicU64;

/// The prefix cache per rank: lifetime hit and prompt tokens (their ratio is the hit rate since
/// start; `sglang:cache_hit_rate` is SGLang's 15 s window) and what the cache holds now.
const CACHE_FAMILIES: [(&str, MetricType, &str, CacheReading); 3] = [
    (
        "loadlink_engine_cache_hit_tokens_total",
        MetricType::Counter,
        "Prompt tokens served from the prefix cache",
        |c| &c.hit_tokens,
    ),
    (
        "loadlink_engine_prompt_tokens_total",
        MetricType::Counter,
        "Prompt tokens admitted (cached or computed)",
        |c| &c.prompt_tokens,
    ),
    (
        "loadlink_engine_cached_tokens",
        MetricType::Gauge,
        "Tokens held by the prefix cache",
        |c| &c.cached_tokens,
    ),
];

fn cache_families(page: &mut Exposition, st: &AppState) {
    for (name, ty, help, read) in CACHE_FAMILIES {
        let mut family = page.family(name, ty, help);
        for r in &st.ranks {
            family.sample(
                &Rank { rank: r.rank },
                read(&r.cache).load(Ordering::Relaxed),
            );
        }
    }
}

/// SGLang's gauge names, read from each rank's snapshot.
const RANK_GAUGES: [Gauge; 8] = [
    ("sglang:num_running_reqs", "Running requests", |s| {
        s.num_running_reqs as f64
    }),
    ("sglang:num_queue_reqs", "Waiting requests", |s| {
        s.num_waiting_reqs as f64
    }),
    ("sglang:num_used_tokens", "KV tokens in use", |s| {
        s.num_used_tokens as f64
    }),
    (
        "sglang:token_usage",
        "KV pool usage (0-1)",
        LoadSnapshot::token_usage,
    ),
    (
        "sglang:gen_throughput",
        "Generated tokens per second",
        LoadSnapshot::gen_throughput,
    ),
    (
        "sglang:cache_hit_rate",
        "Prefix cache hit rate",
        LoadSnapshot::cache_hit_rate,
    ),
    (
        "sglang:utilization",
        "Busy fraction",
        LoadSnapshot::utilization,
    ),
    ("sglang:max_total_num_tokens", "KV pool size", |s| {
        s.max_total_num_tokens as f64
    }),
];

pub(crate) async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let snaps = st.dispatcher.snapshots();
    let mut page = Exposition::new();
    for (name, help, read) in RANK_GAUGES {
        let mut family = page.family(name, MetricType::Gauge, help);
        for s in &snaps {
            let labels = RankLabels {
                dp_rank: s.dp_rank,
                model_name: &st.cfg.model_name,
            };
            family.sample(&labels, read(s));
        }
    }
    let counters = [
        (
            "loadlink_engine_requests_total",
            MetricType::Counter,
            "Generation requests accepted",
            Number::from(st.requests_total.load(Ordering::Relaxed)),
        ),
        (
            "loadlink_engine_aborted_total",
            MetricType::Counter,
            "Requests aborted by client disconnect",
            Number::from(st.aborted_total.load(Ordering::Relaxed)),
        ),
        (
            "loadlink_engine_open_requests",
            MetricType::Gauge,
            "Requests accepted and not yet finished",
            Number::from(st.open_requests.load(Ordering::Relaxed)),
        ),
    ];
    for (name, ty, help, v) in counters {
        page.single(name, ty, help, v);
    }
    rank_requests_family(&mut page, &st);
    cache_families(&mut page, &st);
    model_families(&mut page, &st);
    publish_family(&mut page, &st);
    pd_families(&mut page, &st);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        page.finish(),
    )
        .into_response()
}

loadlink_wire::label_set! {
    /// The labels of `loadlink_engine_pd_rooms_total`.
    struct RoomLabels { role: &'static str, outcome: &'static str }
}

loadlink_wire::label_set! {
    /// The label of `loadlink_engine_pd_bootstrap_refused_total`.
    struct Reason { reason: &'static str }
}

loadlink_wire::label_set! {
    /// The label of `loadlink_engine_pd_rooms_waiting`.
    struct Role { role: &'static str }
}

/// Disaggregation (PD engines only): rooms ended per outcome, and rooms waiting now (prefill:
/// requests whose KV is not sent yet; decode: requests waiting for their KV).
fn pd_families(page: &mut Exposition, st: &AppState) {
    let mode = st.cfg.pd.mode;
    if mode == crate::pd::PdMode::Null {
        return;
    }
    let role = mode.as_str();
    let mut family = page.family(
        "loadlink_engine_pd_rooms_total",
        MetricType::Counter,
        "Disaggregated requests (rooms) ended on this engine, by outcome: transferred (the KV was \
         sent, prefill, or arrived, decode), failed (the peer failed it or its connection was \
         lost), timeout (--disaggregation-timeout)",
    );
    for o in crate::pd::Outcome::ALL {
        let labels = RoomLabels {
            role,
            outcome: o.label(),
        };
        family.sample(&labels, st.pd.outcomes[o as usize].load(Ordering::Relaxed));
    }
    drop(family);
    let mut family = page.family(
        "loadlink_engine_pd_rooms_waiting",
        MetricType::Gauge,
        "Disaggregated requests waiting now (prefill: KV not sent yet; decode: KV not arrived yet)",
    );
    family.sample(&Role { role }, st.pd.waiting());
    drop(family);
    if mode != crate::pd::PdMode::Prefill {
        return;
    }
    let mut family = page.family(
        "loadlink_engine_pd_bootstrap_refused_total",
        MetricType::Counter,
        "Decode peers the bootstrap server refused, by reason: connections (over the connection \
         budget, closed on accept), frame (malformed, over-budget or unexpected frame; connection \
         closed), register (a registration refused: room taken or the room table full)",
    );
    for why in crate::pd::rooms::Refusal::ALL {
        let reason = Reason {
            reason: why.label(),
        };
        family.sample(&reason, st.pd.rooms.refused(why));
    }
}

/// `loadlink_publish_total{rank,sink,outcome}`: every sink's outcomes, KV events included.
fn publish_family(page: &mut Exposition, st: &AppState) {
    let mut publish = page.family(
        "loadlink_publish_total",
        MetricType::Counter,
        "Publications per rank, sink and outcome: the load sinks' snapshots, and the kv_events \
         sink's batches (dropped: its queue was full, a seq hole subscribers see; replays: replay \
         requests served; snapshots: snapshot answers served; snapshot_errors: snapshot requests \
         answered with an error)",
    );
    for r in &st.ranks {
        let mut sinks: Vec<(&str, Vec<(&str, &AtomicU64)>)> = r
            .sink_stats
            .iter()
            .map(|(sink, s)| {
                let outcomes = vec![
                    ("published", &s.published),
                    ("dropped", &s.dropped),
                    ("skipped", &s.skipped),
                    ("failed", &s.failed),
                ];
                (*sink, outcomes)
            })
            .collect();
        if let Some(k) = &r.kv_events {
            let outcomes = vec![
                ("published", &k.published),
                ("dropped", &k.dropped),
                ("failed", &k.errors),
                ("replays", &k.replays),
                ("snapshots", &k.snapshots),
                ("snapshot_errors", &k.snapshot_errors),
            ];
            sinks.push(("kv_events", outcomes));
        }
        for (sink, outcomes) in sinks {
            for (outcome, v) in outcomes {
                let labels = PublishLabels {
                    rank: r.rank,
                    sink,
                    outcome,
                };
                publish.sample(&labels, v.load(Ordering::Relaxed));
            }
        }
    }
}
