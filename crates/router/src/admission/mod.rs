//! Admission control: what the router does when no worker should take another request.
//!
//! * **Caps** (each optional, per worker): requests the engine holds (`--max-engine-requests`:
//!   its reported running + waiting, plus what this router dispatched since the snapshot; set it
//!   above the batch size to cap the queue), KV usage (`--max-kv-usage`) and predicted
//!   wait (`--max-predicted-wait-ms`, `min_ttft`'s prediction for this request). A worker over a cap
//!   is not a candidate; a cap on a figure the router does not know (stale or no load stream) does
//!   not apply: admission fails open, as SGLang's router does, rather than refusing a fleet it
//!   cannot see.
//! * **Sparing running sessions** (`--admission-spare-running`): a request continuing a context
//!   one worker alone holds (its deepest cached prefix, from which no other request branched
//!   recently) goes to that worker over the caps, so the caps refuse new work, not the next turns
//!   of sessions already begun (whose clients would lose the session at a 429).
//! * **A TTFT budget per request**: the `x-sgl-ttft-slo-ms` header (SGLang router's name). A request
//!   whose best predicted TTFT exceeds its budget is refused at once, not queued to miss it.
//! * **Overload answer** (`--admission reject|queue`): 429 with `Retry-After` at once, or a bounded
//!   FIFO (`--admission-queue-size`) whose head waits for a worker within the caps until its
//!   deadline (`--admission-queue-timeout-ms`), then 429.
//!
//! The rules are pure ([`rules`]: the gate, the capped pick, the queue's room; [`Capped`] hides
//! workers over a cap from any policy), shared with the simulator. This module holds the state
//! around them, and every count it takes is a guard: a queued place ([`Queued`]) and the head's
//! turn are released when the request's future is dropped, so a client that hangs up cannot
//! leave the queue looking full. Under caps, a decision and its dispatch count (the proxy's
//! in-flight guard) happen under one short gate, and the head hands its turn on only after its
//! dispatch is counted, so the queue cannot drain past the caps in bursts.
//!
//! [`View`]: crate::policy::View

pub mod rules;

pub use rules::{
    AdmissionConfig, Capped, Gate, Overload, Refusal, SLO_HEADER, retry_after_s, slo_budget,
};

use crate::fleet::FleetView;
use crate::state::{AppState, error_response};
use axum::http::StatusCode;
use axum::response::Response;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// The bounded FIFO, the decision gate and the counters `/metrics` shows.
#[derive(Debug, Default)]
pub struct AdmissionState {
    /// FIFO: the head holds the lock while it waits for a worker within the caps, and until its
    /// dispatch is counted.
    pub queue: tokio::sync::Mutex<()>,
    /// Held (briefly, never across an await) from a capped decision to its counted dispatch, so
    /// two decisions never both take the one slot left under a cap.
    gate: Mutex<()>,
    /// Requests in the queue now (each counted by a [`Queued`] guard).
    pub queued: AtomicUsize,
    pub admitted_after_wait: AtomicU64,
    pub refused: [AtomicU64; Refusal::ALL.len()],
    /// The bounded pool that runs request-path CPU work off the async executor.
    pub work: crate::request_work::RequestWork,
}

impl AdmissionState {
    /// The state with the request-path work budgets of `budgets`.
    pub fn new(budgets: &crate::budget::Budgets) -> Self {
        AdmissionState {
            work: crate::request_work::RequestWork::new(budgets),
            ..Default::default()
        }
    }

    pub fn refuse(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Relaxed);
    }

    /// Runs `decide` at a fresh `now` under the gate, and `dispatch` too when it says so: the
    /// decision and the dispatch count are one step for every other request.
    fn decide<'v, D, T>(
        &self,
        view: &mut FleetView<'v>,
        decide: impl FnOnce(&FleetView<'v>) -> D,
        dispatch: impl FnOnce(&FleetView<'v>, &D) -> Option<T>,
    ) -> (D, Option<T>) {
        let _gate = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        view.now_ms = view.workers().first().map_or(0, |w| w.now_ms());
        let d = decide(view);
        let t = dispatch(view, &d);
        (d, t)
    }
}

/// One request waiting in the queue; leaving it (admitted, refused, or the client gone and its
/// future dropped) is the guard's drop, so the count cannot leak.
struct Queued<'a>(&'a AdmissionState);

impl<'a> Queued<'a> {
    /// A place in the queue, or `None` when it is full.
    fn enter(state: &'a AdmissionState, cfg: &AdmissionConfig) -> Option<Self> {
        let before = state.queued.fetch_add(1, Relaxed);
        let guard = Queued(state);
        rules::queue_has_room(cfg, before).then_some(guard)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Relaxed);
    }
}

/// Admits the request described by `view` (and its TTFT `budget`) and dispatches it with
/// `dispatch` (which picks a worker and counts the dispatch, e.g. with an in-flight guard), or
/// answers the refusal: at once, or after waiting at the head of the admission FIFO.
///
/// `Ok(None)`: admitted, but `dispatch` found no available worker. Under caps, the decision and
/// the dispatch run under one gate, and the queue's head hands its turn on only after its
/// dispatch is counted, so the queue cannot drain past the caps. Every count taken here is a
/// guard: a client that hangs up while queued releases its place.
pub async fn admit<'v, T>(
    st: &AppState,
    view: &mut FleetView<'v>,
    budget: Option<Duration>,
    mut dispatch: impl FnMut(&FleetView<'v>) -> Option<T>,
) -> Result<Option<T>, Response> {
    let cfg = &st.cfg.admission;
    if !cfg.capped() && budget.is_none() {
        return Ok(dispatch(view));
    }
    let state = &st.admission;
    let (gate, admitted) = state.decide(
        view,
        |v| rules::gate(v, cfg, budget),
        |v, g| (*g == Gate::Admit).then(|| dispatch(v)).flatten(),
    );
    match gate {
        Gate::Admit => return Ok(admitted),
        Gate::Refuse(why, best) => return Err(refusal(state, why, best)),
        Gate::Wait => {}
    }
    let Overload::Queue { timeout_ms, .. } = cfg.overload else {
        return Err(refusal(state, Refusal::Overloaded, None));
    };
    let Some(_queued) = Queued::enter(state, cfg) else {
        return Err(refusal(state, Refusal::QueueFull, None));
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    let waited = tokio::time::timeout_at(deadline, async {
        let _head = state.queue.lock().await;
        loop {
            let (open, admitted) = state.decide(
                view,
                |v| rules::open(v, cfg),
                |v, open| open.then(|| dispatch(v)).flatten(),
            );
            if open {
                return admitted;
            }
            tokio::time::sleep(QUEUE_POLL).await;
        }
    })
    .await;
    match waited {
        Ok(admitted) => {
            state.admitted_after_wait.fetch_add(1, Relaxed);
            Ok(admitted)
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
