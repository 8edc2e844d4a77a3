//! Which real engine's HTTP surface `loadlink engine` presents (`--flavor`).
//!
//! Routers meet two kinds of engine: SGLang, which serves its load on `/v1/loads` and
//! `/server_info` (and, when asked, on a load socket), and vLLM, which has no load stream and no
//! discovery document, only Prometheus gauges on `/metrics`. The vLLM flavour lets every load
//! source of the router (push, `/v1/loads` polling, `/metrics` scraping, in-flight) be tested on
//! loopback: it serves vLLM's metric names and `/v1/models` shape, and 404 on SGLang's routes,
//! as vLLM does. The scheduler model underneath is the same.

use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use loadlink_wire::prom::{Exposition, MetricType};
use serde_json::json;
use std::sync::Arc;

/// The HTTP surface an engine presents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Flavor {
    /// SGLang's routes and gauge names, load socket when configured (the default).
    #[default]
    Sglang,
    /// vLLM's: `/metrics` with `vllm:*` gauges by `engine`, vLLM's `/v1/models`; no load socket,
    /// no KV events, no `/server_info`, `/get_server_info` or `/v1/loads`.
    Vllm,
}

impl Flavor {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "sglang" => Ok(Flavor::Sglang),
            "vllm" => Ok(Flavor::Vllm),
            o => Err(format!("unknown flavor {o:?}; expected sglang or vllm")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::Sglang => "sglang",
            Flavor::Vllm => "vllm",
        }
    }
}

loadlink_wire::label_set! {
    /// vLLM V1's labels on its scheduler gauges: the served model and the engine (DP) index.
    struct VllmLabels<'a> { engine: i64, model_name: &'a str }
}

type VllmGauge = (
    &'static str,
    &'static str,
    fn(&loadlink_wire::LoadSnapshot) -> f64,
);

/// vLLM's scheduler gauges (docs.vllm.ai, "Production Metrics"), read from each rank's snapshot.
const VLLM_GAUGES: [VllmGauge; 3] = [
    (
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        |s| s.num_running_reqs as f64,
    ),
    (
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        |s| s.num_waiting_reqs as f64,
    ),
    (
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        |s| s.token_usage(),
    ),
];

/// `GET /metrics` in the vLLM flavour.
pub(crate) async fn vllm_metrics(State(st): State<Arc<AppState>>) -> Response {
    let snaps = st.dispatcher.snapshots();
    let mut page = Exposition::new();
    for (name, help, read) in VLLM_GAUGES {
        let mut family = page.family(name, MetricType::Gauge, help);
        for s in &snaps {
            let labels = VllmLabels {
                engine: s.dp_rank,
                model_name: &st.cfg.model_name,
            };
            family.sample(&labels, read(s));
        }
    }
    crate::metrics::model_families(&mut page, &st);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        page.finish(),
    )
        .into_response()
}

/// `GET /v1/models` in the vLLM flavour (its `ModelCard`s: served names, then adapters).
pub(crate) async fn vllm_models(State(st): State<Arc<AppState>>) -> Response {
    let base = json!({
        "max_model_len": st.cfg.model.max_total_tokens,
        "permission": [],
    });
    let data = crate::discovery::model_cards(&st, "vllm", &base);
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}
