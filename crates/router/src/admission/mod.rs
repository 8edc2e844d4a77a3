//! Admission control: what the router does when no worker should take another request.
//!
//! * **Caps** (each optional, per worker): requests the engine holds (`--max-engine-requests`:
//!   its reported running + waiting, plus what this router dispatched since the snapshot; set it
//!   above the batch size to cap the queue), KV usage (`--max-kv-usage`) and predicted
//!   wait (`--max-predicted-wait-ms`, `min_ttft`'s prediction for this request). A worker over a cap
//!   is not a candidate; a cap on a figure the router does not know (stale or no load stream) does
//!   not apply: admission fails open, as SGLang's router does, rather than refusing a fleet it
//!   cannot see.
//! * **A TTFT budget per request**: the `x-sgl-ttft-slo-ms` header (SGLang router's name). A request
//!   whose best predicted TTFT exceeds its budget is refused at once, not queued to miss it.
//! * **Overload answer** (`--admission reject|queue`): 429 with `Retry-After` at once, or a bounded
//!   FIFO (`--admission-queue-size`) whose head waits for a worker within the caps until its
//!   deadline (`--admission-queue-timeout-ms`), then 429.
//!
//! The decision is pure over a [`View`] ([`Capped`] hides workers over a cap from any policy); the
//! queue is the only state, and the proxy owns when to wait on it.

use crate::fleet::FleetView;
use crate::policy::{MinTtft, View};
use crate::state::{AppState, error_response};
use axum::http::StatusCode;
use axum::response::Response;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// The request header carrying a TTFT budget in milliseconds.
pub const SLO_HEADER: &str = "x-sgl-ttft-slo-ms";

/// What to do when no worker is within the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overload {
    /// 429 with `Retry-After` at once.
    #[default]
    Reject,
    /// Hold in a FIFO of `size` for at most `timeout_ms`, then 429.
    Queue { size: usize, timeout_ms: u64 },
}

impl Overload {
    pub fn parse(mode: &str, size: usize, timeout_ms: u64) -> Result<Self, String> {
        match mode {
            "reject" => Ok(Overload::Reject),
            "queue" => Ok(Overload::Queue { size, timeout_ms }),
            o => Err(format!("--admission {o:?}: expected reject or queue")),
        }
    }
}

/// The caps (all off by default: the router forwards everything, as before).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AdmissionConfig {
    pub max_engine_requests: Option<i64>,
    pub max_kv_usage: Option<f64>,
    pub max_predicted_wait_ms: Option<u64>,
    pub overload: Overload,
}

impl AdmissionConfig {
    /// Whether any cap is set (no cap: no worker is ever hidden).
    pub fn capped(&self) -> bool {
        self.max_engine_requests.is_some()
            || self.max_kv_usage.is_some()
            || self.max_predicted_wait_ms.is_some()
    }
}

/// A view whose workers over a cap are unavailable.
pub struct Capped<'a, V> {
    pub inner: &'a V,
    pub cfg: &'a AdmissionConfig,
    pub predictor: MinTtft,
}

impl<'a, V: View> Capped<'a, V> {
    pub fn new(inner: &'a V, cfg: &'a AdmissionConfig) -> Self {
        Capped {
            inner,
            cfg,
            predictor: MinTtft::default(),
        }
    }

    /// Whether worker `i` is within every cap whose figure is known.
    pub fn within(&self, i: usize) -> bool {
        let c = self.cfg;
        let waiting_ok = match (c.max_engine_requests, self.inner.engine_requests(i)) {
            (Some(max), Some(queued)) => queued <= max,
            _ => true,
        };
        let kv_ok = c
            .max_kv_usage
            .is_none_or(|max| self.inner.kv_usage(i) <= max);
        let wait_ok = c.max_predicted_wait_ms.is_none_or(|max| {
            self.inner.queued_prefill_s(i).is_none()
                || self.predictor.predicted_ttft_s(self.inner, i) * 1e3 <= max as f64
        });
        waiting_ok && kv_ok && wait_ok
    }

    /// The least predicted TTFT (s) over available workers within the caps; `None`: none.
    pub fn best_ttft_s(&self) -> Option<f64> {
        (0..self.len())
            .filter(|&i| self.available(i))
            .map(|i| self.predictor.predicted_ttft_s(self.inner, i))
            .min_by(f64::total_cmp)
    }
}

impl<V: View> View for Capped<'_, V> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn load(&self, i: usize) -> i64 {
        self.inner.load(i)
    }
    fn available(&self, i: usize) -> bool {
        self.inner.available(i) && self.within(i)
    }
    fn prompt_tokens(&self) -> u64 {
        self.inner.prompt_tokens()
    }
    fn cached_tokens(&self, i: usize) -> u64 {
        self.inner.cached_tokens(i)
    }
    fn cache_size(&self, i: usize) -> u64 {
        self.inner.cache_size(i)
    }
    fn queued_prefill_s(&self, i: usize) -> Option<f64> {
        self.inner.queued_prefill_s(i)
    }
    fn engine_requests(&self, i: usize) -> Option<i64> {
        self.inner.engine_requests(i)
    }
    fn prefill_s_per_token(&self, i: usize) -> f64 {
        self.inner.prefill_s_per_token(i)
    }
    fn kv_usage(&self, i: usize) -> f64 {
        self.inner.kv_usage(i)
    }
    fn inflight(&self, i: usize) -> i64 {
        self.inner.inflight(i)
    }
}

/// Why a request was refused (a label in `/metrics` and the 429's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every worker is over a cap and the overload mode is `reject`.
    Overloaded,
    /// The queue is full.
    QueueFull,
    /// It waited in the queue until its deadline.
    QueueTimeout,
    /// Its TTFT budget cannot be met.
    SloUnreachable,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::Overloaded,
        Refusal::QueueFull,
        Refusal::QueueTimeout,
        Refusal::SloUnreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Overloaded => "overloaded",
            Refusal::QueueFull => "queue_full",
            Refusal::QueueTimeout => "queue_timeout",
            Refusal::SloUnreachable => "slo_unreachable",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Overloaded => "every worker is over the router's admission caps; retry later",
            Refusal::QueueFull => "the admission queue is full; retry later",
            Refusal::QueueTimeout => {
                "no worker came within the admission caps before the queue deadline"
            }
            Refusal::SloUnreachable => {
                "the x-sgl-ttft-slo-ms budget cannot be met by any worker now"
            }
        }
    }
}

/// `Retry-After` seconds for a refusal when the best worker's predicted TTFT is `best_s`: at least
/// one second, else roughly when that worker's queue will have drained.
pub fn retry_after_s(best_s: Option<f64>) -> u64 {
    best_s.map_or(1, |s| s.ceil().clamp(1.0, 60.0) as u64)
}

/// The TTFT budget a request carries, if any (a malformed header is the client's error).
pub fn slo_budget(value: Option<&str>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| format!("{SLO_HEADER}: expected milliseconds as an integer, got {v:?}")),
    }
}

/// The bounded FIFO and the counters `/metrics` shows.
#[derive(Debug, Default)]
pub struct AdmissionState {
    /// FIFO: the head holds the lock while it waits for a worker within the caps.
    pub queue: tokio::sync::Mutex<()>,
    pub queued: AtomicUsize,
    pub admitted_after_wait: AtomicU64,
    pub refused: [AtomicU64; Refusal::ALL.len()],
}

impl AdmissionState {
    pub fn refuse(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Relaxed);
    }
}

/// Admits the request described by `view` (and its TTFT `budget`), or answers the refusal: at
/// once, or after waiting at the head of the admission FIFO.
pub async fn admit(
    st: &AppState,
    view: &mut FleetView<'_>,
    budget: Option<Duration>,
) -> Result<(), Response> {
    let cfg = &st.cfg.admission;
    if !cfg.capped() && budget.is_none() {
        return Ok(());
    }
    let state = &st.admission;
    view.now_ms = view.workers.first().map_or(0, |w| w.now_ms());
    if let Some(limit) = budget {
        let best = Capped::new(&*view, cfg).best_ttft_s();
        if best.is_none_or(|s| s > limit.as_secs_f64()) {
            return Err(refusal(state, Refusal::SloUnreachable, best));
        }
    }
    let open = |v: &FleetView<'_>| {
        let c = Capped::new(v, cfg);
        (0..c.len()).any(|i| c.available(i))
    };
    if !cfg.capped() || open(view) {
        return Ok(());
    }
    let Overload::Queue { size, timeout_ms } = cfg.overload else {
        return Err(refusal(
            state,
            Refusal::Overloaded,
            Capped::new(&*view, cfg).best_ttft_s(),
        ));
    };
    if state.queued.fetch_add(1, Relaxed) >= size {
        state.queued.fetch_sub(1, Relaxed);
        return Err(refusal(state, Refusal::QueueFull, None));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    let waited = tokio::time::timeout_at(deadline, async {
        let _head = state.queue.lock().await;
        loop {
            view.now_ms = view.workers.first().map_or(0, |w| w.now_ms());
            if open(view) {
                return;
            }
            tokio::time::sleep(QUEUE_POLL).await;
        }
    })
    .await;
    state.queued.fetch_sub(1, Relaxed);
    match waited {
        Ok(()) => {
            state.admitted_after_wait.fetch_add(1, Relaxed);
            Ok(())
        }
        Err(_) => Err(refusal(state, Refusal::QueueTimeout, None)),
    }
}

/// How often the head of the queue looks for a worker within the caps (loads change at the
/// engines' publish rate, a few ms).
const QUEUE_POLL: Duration = Duration::from_millis(5);

/// The 429 for `why`, counted, with `Retry-After` from the best predicted TTFT.
fn refusal(state: &AdmissionState, why: Refusal, best_s: Option<f64>) -> Response {
    state.refuse(why);
    let mut r = error_response(StatusCode::TOO_MANY_REQUESTS, why.message());
    r.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(retry_after_s(best_s)),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers as (engine requests or None, kv usage, queued prefill s or None).
    struct V(Vec<(Option<i64>, f64, Option<f64>)>);
    impl View for V {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn load(&self, _: usize) -> i64 {
            0
        }
        fn available(&self, _: usize) -> bool {
            true
        }
        fn engine_requests(&self, i: usize) -> Option<i64> {
            self.0[i].0
        }
        fn kv_usage(&self, i: usize) -> f64 {
            self.0[i].1
        }
        fn queued_prefill_s(&self, i: usize) -> Option<f64> {
            self.0[i].2
        }
    }

    #[test]
    fn caps_hide_workers_over_them_and_fail_open_on_unknown_figures() {
        let v = V(vec![
            (Some(50), 0.2, Some(0.1)),
            (Some(2), 0.99, Some(0.1)),
            (Some(2), 0.2, Some(9.0)),
            (None, 0.0, None),
        ]);
        let cfg = AdmissionConfig {
            max_engine_requests: Some(10),
            max_kv_usage: Some(0.95),
            max_predicted_wait_ms: Some(2000),
            overload: Overload::Reject,
        };
        let c = Capped {
            inner: &v,
            cfg: &cfg,
            predictor: MinTtft::default(),
        };
        let ok: Vec<bool> = (0..4).map(|i| c.available(i)).collect();
        assert_eq!(
            ok,
            [false, false, false, true],
            "each cap, and an unknown worker passes"
        );
        assert!(!AdmissionConfig::default().capped() && cfg.capped());
    }

    #[test]
    fn budgets_and_retry_after() {
        assert_eq!(slo_budget(None), Ok(None));
        assert_eq!(
            slo_budget(Some(" 250")),
            Ok(Some(Duration::from_millis(250)))
        );
        assert!(slo_budget(Some("fast")).unwrap_err().contains(SLO_HEADER));
        assert_eq!(retry_after_s(None), 1);
        assert_eq!(retry_after_s(Some(0.2)), 1);
        assert_eq!(retry_after_s(Some(7.1)), 8);
        assert_eq!(retry_after_s(Some(1e9)), 60);
        assert!(
            Overload::parse("drop", 1, 1)
                .unwrap_err()
                .contains("reject or queue")
        );
    }
}
