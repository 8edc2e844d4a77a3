//! The admission rules, pure: no I/O, no clock, no state. The caller passes the loads (a
//! [`View`] whose `now` it has set) and, for the queue, how many already wait.
//!
//! They were written three times (the router's admission, the proxy's pick, the simulator) and
//! had begun to drift; now the live router (`admission::admit`, `proxy::pick`) and the
//! simulator (`loadlink-bench`'s `sim/admission.rs`) call these, so the overload evidence
//! measures the rules that run in `loadlink route`.

use crate::policy::{MinTtft, Policy, View};
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
    /// A worker over the caps still takes a request continuing a context it alone holds (a
    /// running session's next turn): the caps refuse new work, not the sessions already begun.
    pub spare_running: bool,
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
    /// With `spare_running`, the one worker that caches more of this request than any other.
    sole_holder: Option<usize>,
}

impl<'a, V: View> Capped<'a, V> {
    pub fn new(inner: &'a V, cfg: &'a AdmissionConfig) -> Self {
        Capped {
            inner,
            cfg,
            predictor: MinTtft::default(),
            sole_holder: cfg.spare_running.then(|| sole_holder(inner)).flatten(),
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
        (waiting_ok && kv_ok && wait_ok) || self.sole_holder == Some(i)
    }

    /// The least predicted TTFT (s) over available workers within the caps; `None`: none.
    pub fn best_ttft_s(&self) -> Option<f64> {
        (0..self.len())
            .filter(|&i| self.available(i))
            .map(|i| self.predictor.predicted_ttft_s(self.inner, i))
            .min_by(f64::total_cmp)
    }
}

/// The available worker that caches strictly more of the request than every other one, when what
/// it caches is the request's own context (no other request recently branched from it, so not a
/// system prompt or a group's prefix that happens to sit on one worker): the request is a running
/// session's next turn. `None` for anything else, which starts new work (a new session, a
/// family's next request, or a context lost to eviction everywhere and recomputed anyway).
fn sole_holder(v: &impl View) -> Option<usize> {
    let (mut best, mut second, mut at) = (0u64, 0u64, None);
    for i in (0..v.len()).filter(|&i| v.available(i)) {
        let c = v.cached_tokens(i);
        if c > best {
            (second, best, at) = (best, c, Some(i));
        } else if c > second {
            second = c;
        }
    }
    at.filter(|_| best > second && v.prefix_private(best))
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
    fn host_cached_tokens(&self, i: usize) -> u64 {
        self.inner.host_cached_tokens(i)
    }
    fn host_load_s_per_token(&self, i: usize) -> Option<f64> {
        self.inner.host_load_s_per_token(i)
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
    fn utilisation(&self, i: usize) -> Option<f64> {
        self.inner.utilisation(i)
    }
    fn free_pool_tokens(&self, i: usize) -> Option<u64> {
        self.inner.free_pool_tokens(i)
    }
    fn eviction_regret(&self, i: usize) -> f64 {
        self.inner.eviction_regret(i)
    }
    fn adapter_cost(&self, i: usize) -> crate::adapters::AdapterCost {
        self.inner.adapter_cost(i)
    }
    fn pending_transfers(&self, i: usize) -> Option<i64> {
        self.inner.pending_transfers(i)
    }
    fn prefix_key(&self, tokens: u64) -> Option<u64> {
        self.inner.prefix_key(tokens)
    }
    fn worker_key(&self, i: usize) -> u64 {
        self.inner.worker_key(i)
    }
    fn prefix_private(&self, deepest: u64) -> bool {
        self.inner.prefix_private(deepest)
    }
    fn tail_reused(&self, deepest: u64) -> bool {
        self.inner.tail_reused(deepest)
    }
    fn price(&self, i: usize) -> crate::policy::Price {
        self.inner.price(i)
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

/// What the rules say about a request on arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gate {
    /// Some worker may take it now: pick (with [`pick`]) and count the dispatch.
    Admit,
    /// Refused at once; the best predicted TTFT (s) within the caps, else over the whole fleet
    /// ([`fleet_best_ttft_s`]), for `Retry-After`.
    Refuse(Refusal, Option<f64>),
    /// Every worker is over a cap and the overload mode is `queue`: it may wait (if
    /// [`queue_has_room`]) until [`open`].
    Wait,
}

/// The decision on arrival for a request with TTFT `budget` over `view` (its `now` set).
pub fn gate(view: &impl View, cfg: &AdmissionConfig, budget: Option<Duration>) -> Gate {
    if let Some(limit) = budget {
        let best = Capped::new(view, cfg).best_ttft_s();
        if best.is_none_or(|s| s > limit.as_secs_f64()) {
            let hint = best.or_else(|| fleet_best_ttft_s(view));
            return Gate::Refuse(Refusal::SloUnreachable, hint);
        }
    }
    if open(view, cfg) {
        return Gate::Admit;
    }
    match cfg.overload {
        // No worker is within the caps: the hint is the fleet's.
        Overload::Reject => Gate::Refuse(Refusal::Overloaded, fleet_best_ttft_s(view)),
        Overload::Queue { .. } => Gate::Wait,
    }
}

/// A refusal's `Retry-After` hint when no worker is within the caps (an overload refusal always;
/// an unreachable budget sometimes): the least predicted TTFT over every available worker,
/// roughly when the soonest queue will have drained. (Taken within the caps, it was `None` on
/// every overload refusal, and every client was told to retry after one second.)
fn fleet_best_ttft_s(view: &impl View) -> Option<f64> {
    let predictor = MinTtft::default();
    (0..view.len())
        .filter(|&i| view.available(i))
        .map(|i| predictor.predicted_ttft_s(view, i))
        .min_by(f64::total_cmp)
}

/// Whether some worker of `view` is within the caps (always, without caps).
pub fn open(view: &impl View, cfg: &AdmissionConfig) -> bool {
    if !cfg.capped() {
        return true;
    }
    let c = Capped::new(view, cfg);
    (0..c.len()).any(|i| c.available(i))
}

/// Whether one more request may join a queue that `queued` requests already wait in.
pub fn queue_has_room(cfg: &AdmissionConfig, queued: usize) -> bool {
    matches!(cfg.overload, Overload::Queue { size, .. } if queued < size)
}

/// The policy's pick over the capped view, or over the whole view when it picks nobody there
/// (a retry, or a cap on a figure nobody knows).
pub fn pick(
    policy: &Policy,
    view: &impl View,
    cfg: &AdmissionConfig,
    entropy: u64,
) -> Option<usize> {
    let capped = cfg.capped().then(|| Capped::new(view, cfg));
    capped
        .and_then(|c| policy.pick(&c, entropy))
        .or_else(|| policy.pick(view, entropy))
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
        fn prefix_key(&self, tokens: u64) -> Option<u64> {
            Some(tokens + 7)
        }
        fn worker_key(&self, i: usize) -> u64 {
            100 + i as u64
        }
        fn tail_reused(&self, deepest: u64) -> bool {
            deepest == 3
        }
        fn pending_transfers(&self, i: usize) -> Option<i64> {
            Some(i as i64)
        }
        fn adapter_cost(&self, i: usize) -> crate::adapters::AdapterCost {
            crate::adapters::AdapterCost {
                load_s: i as f64,
                ..crate::adapters::AdapterCost::RESIDENT
            }
        }
    }

    #[test]
    fn a_capped_view_answers_what_the_policy_reads_as_its_inner_view_does() {
        // The home (prefix and worker keys, tail reuse) and adapter costs are priced under caps
        // as without them.
        let v = V(vec![(Some(1), 0.2, Some(0.1)); 2]);
        let cfg = cfg(Overload::Reject);
        let c = Capped::new(&v, &cfg);
        assert_eq!(c.prefix_key(5), Some(12));
        assert_eq!((c.worker_key(1), c.pending_transfers(1)), (101, Some(1)));
        assert!(c.tail_reused(3) && !c.tail_reused(4));
        assert_eq!(c.adapter_cost(1), v.adapter_cost(1));
    }

    fn cfg(overload: Overload) -> AdmissionConfig {
        AdmissionConfig {
            max_engine_requests: Some(10),
            max_kv_usage: Some(0.95),
            max_predicted_wait_ms: Some(2000),
            spare_running: false,
            overload,
        }
    }

    /// Workers as (tokens of the request each caches, KV usage), and whether the deepest cached
    /// prefix is the request's own context (no other request branched from it recently).
    struct Held(Vec<(u64, f64)>, bool);
    impl View for Held {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn load(&self, _: usize) -> i64 {
            0
        }
        fn available(&self, _: usize) -> bool {
            true
        }
        fn cached_tokens(&self, i: usize) -> u64 {
            self.0[i].0
        }
        fn kv_usage(&self, i: usize) -> f64 {
            self.0[i].1
        }
        fn prefix_private(&self, _: u64) -> bool {
            self.1
        }
    }

    #[test]
    fn sparing_running_sessions_lets_only_a_sole_holder_past_the_caps() {
        let cfg = AdmissionConfig {
            max_kv_usage: Some(0.5),
            spare_running: true,
            ..Default::default()
        };
        let within = |v: &Held, cfg: &AdmissionConfig| -> Vec<bool> {
            let c = Capped::new(v, cfg);
            (0..v.len()).map(|i| c.available(i)).collect()
        };
        // Worker 1 alone holds 3,000 tokens of this session: it takes the turn over the cap.
        let turn = Held(vec![(2048, 0.9), (3000, 0.9), (0, 0.9), (0, 0.2)], true);
        assert_eq!(within(&turn, &cfg), [false, true, false, true]);
        // A new session shares only the system prompt: nobody alone holds it, so it is refused
        // when every worker is over a cap.
        let new = Held(vec![(2048, 0.9), (2048, 0.9), (0, 0.9)], true);
        assert!(!open(&new, &cfg), "a new session on a full fleet");
        assert!(matches!(
            gate(&new, &cfg, None),
            Gate::Refuse(Refusal::Overloaded, _)
        ));
        let turn_on_full = Held(vec![(2048, 0.9), (3000, 0.9)], true);
        assert!(open(&turn_on_full, &cfg), "a running session's turn");
        // A group's prefix that sits on one worker only is not a session's context: others
        // branched from it, so its next question is new work and the caps apply.
        let group_on_one = Held(vec![(0, 0.9), (3000, 0.9)], false);
        assert!(
            !open(&group_on_one, &cfg),
            "a family's request on a full fleet"
        );
        let strict = AdmissionConfig {
            spare_running: false,
            ..cfg
        };
        assert!(
            !open(&turn_on_full, &strict),
            "without sparing, refused too"
        );
    }

    #[test]
    fn caps_hide_workers_over_them_and_fail_open_on_unknown_figures() {
        let v = V(vec![
            (Some(50), 0.2, Some(0.1)),
            (Some(2), 0.99, Some(0.1)),
            (Some(2), 0.2, Some(9.0)),
            (None, 0.0, None),
        ]);
        let cfg = cfg(Overload::Reject);
        let c = Capped::new(&v, &cfg);
        let ok: Vec<bool> = (0..4).map(|i| c.available(i)).collect();
        assert_eq!(
            ok,
            [false, false, false, true],
            "each cap, and an unknown worker passes"
        );
        assert!(!AdmissionConfig::default().capped() && cfg.capped());
        assert_eq!(pick(&Policy::LeastLoad, &v, &cfg, 0), Some(3));
    }

    #[test]
    fn the_gate_admits_refuses_or_queues() {
        let full = V(vec![(Some(50), 0.2, Some(0.1))]);
        let room = V(vec![(Some(1), 0.2, Some(0.1))]);
        let queue = Overload::Queue {
            size: 2,
            timeout_ms: 10,
        };
        assert_eq!(gate(&room, &cfg(queue), None), Gate::Admit);
        assert_eq!(gate(&full, &cfg(queue), None), Gate::Wait);
        // An overload refusal says when to retry: the fleet's best predicted TTFT, though no
        // worker is within the caps.
        let Gate::Refuse(Refusal::Overloaded, Some(hint)) =
            gate(&full, &cfg(Overload::Reject), None)
        else {
            panic!("a full fleet is refused with a retry hint");
        };
        let busy = V(vec![(Some(1), 0.2, Some(7.0)), (Some(1), 0.2, Some(4.0))]);
        let Gate::Refuse(Refusal::Overloaded, Some(slow)) =
            gate(&busy, &cfg(Overload::Reject), None)
        else {
            panic!("a fleet over the wait cap is refused with a retry hint");
        };
        assert!(
            (4.0..7.0).contains(&slow),
            "the soonest queue drains first: {slow}"
        );
        assert!(hint < slow && retry_after_s(Some(slow)) >= 4);
        assert!(matches!(
            gate(&room, &cfg(queue), Some(Duration::ZERO)),
            Gate::Refuse(Refusal::SloUnreachable, Some(_))
        ));
        assert_eq!(gate(&full, &AdmissionConfig::default(), None), Gate::Admit);
        assert!(queue_has_room(&cfg(queue), 1) && !queue_has_room(&cfg(queue), 2));
        assert!(!queue_has_room(&cfg(Overload::Reject), 0));
        // Over every cap, the pick falls back to the whole view (retries, unknown figures).
        assert_eq!(pick(&Policy::LeastLoad, &full, &cfg(queue), 0), Some(0));
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
