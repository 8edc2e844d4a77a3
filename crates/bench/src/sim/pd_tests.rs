//! A PD request's timeline on one prefill and one decode engine: prefill, then the transfer of
//! exactly the configured time (queued behind the pair's previous transfer), then decode without
//! prefill compute; and what the fleet's figures count.

use super::*;
use crate::scenario::{MIN_TTFT, Scenario, by_name, sim_config};
use crate::sim::{CacheView, SimRouter, first_decode_step, isolated_ttft, simulate};
use crate::workload::Arrival;

const PROMPT: u64 = 2000;
const OUTPUT: u64 = 8;
/// 2000 tokens × 1 MB ÷ 4 GB/s = 0.5 s per transfer.
const LINK: KvLink = KvLink {
    bytes_per_token: 1_000_000,
    gb_s: 4.0,
};

fn one_pair() -> SimConfig {
    let s = Scenario {
        routers: 1,
        ..by_name("s3").unwrap()
    };
    let router = crate::scenario::Variant {
        label: "min_ttft",
        router: SimRouter::Policy(MIN_TTFT),
        signal: LoadSignal::Backlog,
        cache: CacheView::Blind,
    };
    let mut cfg = sim_config(&s, &router, None);
    cfg.engines = vec![s.model, s.model];
    cfg.pd = Some(PdFleet {
        prefill: 1,
        decode_policy: DecodePolicy::DecodeLoad,
        link: LINK,
    });
    cfg
}

fn routed(t: f64) -> Arrival {
    Arrival {
        t,
        prompt_tokens: PROMPT,
        output_tokens: OUTPUT,
        stream: true,
        direct: false,
        prompt: None,
        turn: None,
        model: None,
    }
}

#[test]
fn a_pd_request_is_prefilled_then_transferred_for_the_configured_time_then_decoded() {
    assert!((LINK.transfer_s(PROMPT) - 0.5).abs() < 1e-12);
    let cfg = one_pair();
    // Two requests at once: the first starts the idle prefill engine's step, the second is
    // prefilled after it; its transfer then waits for the first's on the pair's link.
    let out = simulate(&cfg, &[routed(0.0), routed(0.0)], 60.0);
    assert_eq!((out.completed, out.pd.len()), (2, 2));
    let mut lines = out.pd.clone();
    lines.sort_by(|a, b| a.transferred.total_cmp(&b.transferred));
    let prefill = isolated_ttft(cfg.engines[0], PROMPT);
    let decode_step = first_decode_step(cfg.engines[1], PROMPT);
    assert!(decode_step > 0.0 && decode_step < 0.05, "{decode_step}");
    assert!(
        (lines[0].prefilled - prefill).abs() < 1e-9,
        "{:?} vs {prefill}",
        lines[0]
    );
    let mut link_free = 0.0f64;
    for l in &lines {
        assert!(
            l.arrived < l.prefilled
                && l.prefilled < l.transferred
                && l.transferred < l.first
                && l.first < l.done,
            "prefill → transfer → decode: {l:?}"
        );
        assert_eq!((l.prefill_engine, l.decode_engine), (0, 1));
        // The transfer starts when both the prefill and the link are done, and takes 0.5 s.
        let expected = l.prefilled.max(link_free) + 0.5;
        assert!(
            (l.transferred - expected).abs() < 1e-9,
            "{l:?}, link free at {link_free}"
        );
        link_free = l.transferred;
        // The decode engine computes no prompt: its first token comes a decode step after the KV
        // (a prefill of 2000 tokens takes 0.2 s on this hardware).
        assert!(l.first - l.transferred <= decode_step + 1e-9, "{l:?}");
    }
    assert!(
        lines[1].transferred - lines[1].prefilled > 0.5 + 0.1,
        "the second transfer queued: {:?}",
        lines[1]
    );
    assert!((lines[0].first - lines[0].transferred - decode_step).abs() < 1e-9);
    let mut ttft = out.ttft.clone();
    ttft.sort_by(f64::total_cmp);
    assert!(
        (ttft[0] - lines[0].first).abs() < 1e-9,
        "TTFT ends at the decode engine's first token"
    );
    assert_eq!(out.transfer_waits().len(), 2);
    // Only the prefill engine's admissions count toward the hit rate (the decode engine computes
    // no prompt); both prompts were unique.
    assert_eq!(out.cache_tokens, Some((0, 2 * PROMPT)));
    assert_eq!(out.tpot.len(), 2);
}

#[test]
fn transfers_of_a_prefill_engine_to_two_decode_engines_do_not_queue_on_one_link() {
    let mut cfg = one_pair();
    let s = by_name("s3").unwrap();
    cfg.engines = vec![s.model, s.model, s.model];
    cfg.pd = Some(PdFleet {
        decode_policy: DecodePolicy::Policy(Policy::RoundRobin, LoadSignal::Inflight),
        ..cfg.pd.unwrap()
    });
    let out = simulate(&cfg, &[routed(0.0), routed(0.0)], 60.0);
    let decode: Vec<usize> = out.pd.iter().map(|l| l.decode_engine).collect();
    assert!(
        decode.contains(&1) && decode.contains(&2),
        "round robin: {decode:?}"
    );
    for l in &out.pd {
        assert!(
            (l.transferred - l.prefilled - 0.5).abs() < 1e-9,
            "own link: {l:?}"
        );
    }
}
