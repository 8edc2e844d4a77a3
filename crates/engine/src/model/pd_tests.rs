//! Disaggregation in the scheduler model: a prefill request holds its KV until its transfer
//! finishes; a decode request holds none until its KV arrives, then decodes without a prefill.

use super::*;

fn cfg() -> ModelConfig {
    ModelConfig {
        max_running_requests: 4,
        max_total_tokens: 1_000,
        ..ModelConfig::default()
    }
}

fn pd_req(id: u64, prompt: u64, out: u64, d: Disagg) -> Submit {
    Submit::counted(id, prompt, out).with_disagg(d)
}

#[test]
fn a_prefilled_request_holds_its_kv_until_its_transfer_finishes() {
    let mut s = Scheduler::new(cfg());
    s.set_disaggregation(PdMode::Prefill, 25.0);
    s.submit(pd_req(1, 100, 50, Disagg::Prefill));
    let m = s.disaggregation_metrics().unwrap();
    assert_eq!(
        (m.mode.as_str(), m.prefill_bootstrap_queue_reqs),
        ("prefill", 1)
    );
    let step = s.step(0.0);
    assert_eq!(step.kind, StepKind::Prefill);
    assert_eq!(step.events, vec![Event::FirstToken { id: 1 }]);
    assert!(s.is_transferring(1));
    assert_eq!(
        s.used_tokens(),
        100,
        "the prompt's KV is held for the transfer"
    );
    assert_eq!(s.num_running(), 0, "it does not decode here");
    assert!(s.is_idle(), "nothing to compute while it waits");
    assert!(s.peer_registered(1));
    let m = s.disaggregation_metrics().unwrap();
    assert_eq!(
        (
            m.prefill_bootstrap_queue_reqs,
            m.prefill_inflight_queue_reqs
        ),
        (0, 1)
    );
    let done = s.finish_transfer(1, 0.004);
    assert_eq!(
        done,
        Some(Event::Finished {
            id: 1,
            prompt_tokens: 100,
            completion_tokens: 1
        })
    );
    assert_eq!(s.used_tokens(), 0);
    assert_eq!(
        s.disaggregation_metrics().unwrap().kv_transfer_latency_ms,
        4.0
    );
    assert_eq!(s.finish_transfer(1, 0.0), None, "only once");
}

#[test]
fn a_decode_request_waits_without_kv_then_decodes_without_prefill() {
    let mut s = Scheduler::new(cfg());
    s.set_disaggregation(PdMode::Decode, 25.0);
    s.submit(pd_req(7, 200, 3, Disagg::Decode));
    assert_eq!(s.used_tokens(), 0, "no KV before it arrives");
    assert_eq!(
        s.step(0.0).kind,
        StepKind::Idle,
        "nothing to do until the KV arrives"
    );
    assert_eq!(
        s.disaggregation_metrics()
            .unwrap()
            .decode_transfer_queue_reqs,
        1
    );
    assert!(s.kv_arrived(7, 0.01));
    assert!(!s.kv_arrived(7, 0.01), "only once");
    let first = s.step(0.0);
    assert_eq!(
        first.kind,
        StepKind::Decode,
        "admitted straight into decode"
    );
    assert_eq!(
        first.events,
        vec![Event::FirstToken { id: 7 }, Event::Token { id: 7 }]
    );
    assert!(s.used_tokens() >= 200, "its prompt counts in KV usage");
    let last = s.step(first.duration);
    assert_eq!(
        last.events,
        vec![Event::Finished {
            id: 7,
            prompt_tokens: 200,
            completion_tokens: 3
        }]
    );
    assert_eq!(
        s.snapshot(0, 0.0).total_prefill_uncached_tokens,
        0,
        "no prefill compute"
    );
}

#[test]
fn arrived_requests_wait_for_batch_room_and_abort_anywhere() {
    let mut s = Scheduler::new(ModelConfig {
        max_running_requests: 1,
        ..cfg()
    });
    s.set_disaggregation(PdMode::Decode, 25.0);
    for id in [1, 2, 3] {
        s.submit(pd_req(id, 10, 5, Disagg::Decode));
        s.kv_arrived(id, 0.0);
    }
    s.step(0.0);
    let m = s.disaggregation_metrics().unwrap();
    assert_eq!((s.num_running(), m.decode_prealloc_queue_reqs), (1, 2));
    assert!(s.abort(3));
    assert_eq!(
        s.disaggregation_metrics()
            .unwrap()
            .decode_prealloc_queue_reqs,
        1
    );
    // A one-token request finishes at admission: the step that admits it carries its events.
    let mut t = Scheduler::new(cfg());
    t.submit(pd_req(9, 10, 1, Disagg::Decode));
    t.kv_arrived(9, 0.0);
    let step = t.step(0.0);
    assert_eq!(step.kind, StepKind::Decode);
    assert_eq!(step.events.len(), 2);
    assert!(t.is_idle());
    assert_eq!(
        t.disaggregation_metrics(),
        None,
        "not disaggregated: no section"
    );
}
