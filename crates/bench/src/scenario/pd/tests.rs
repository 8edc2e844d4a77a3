//! S6 on short runs: its arrivals are S3's, fixed by the seed; both fleets finish everything, and
//! only the PD rows transfer KV.

use super::*;
use crate::scenario::by_name;

fn short_s6(duration_s: f64) -> Scenario {
    Scenario {
        duration_s,
        ..by_name("S6").unwrap()
    }
}

#[test]
fn s6_arrivals_are_s3s_and_fixed_by_the_seed() {
    let s = short_s6(30.0);
    let key = |a: &[Arrival]| -> Vec<_> {
        a.iter()
            .map(|x| (x.t.to_bits(), x.prompt.clone(), x.output_tokens, x.direct))
            .collect()
    };
    let one = key(&arrivals(&s, 1, s.load));
    assert!(one.len() > 500, "{} arrivals", one.len());
    assert_eq!(
        one,
        key(&arrivals(&s, 1, s.load)),
        "same seed, same arrivals"
    );
    assert_ne!(
        one,
        key(&arrivals(&s, 2, s.load)),
        "another seed, other arrivals"
    );
    let s3 = Scenario {
        duration_s: 30.0,
        ..by_name("s3").unwrap()
    };
    assert_eq!(one, key(&arrivals(&s3, 1, s3.load)), "S3's mix and rate");
}

#[test]
fn both_fleets_finish_every_request_and_only_pd_transfers() {
    let s = short_s6(30.0);
    let arrivals = arrivals(&s, 1, s.load);
    let by = |decode| {
        *variants()
            .iter()
            .find(|v| v.decode == decode && v.router.label == DEFAULT_ROUTER)
            .unwrap()
    };
    let aggregated = run_pd_variant(&s, &arrivals, &by(None), KvLink::DEFAULT);
    let pd = run_pd_variant(
        &s,
        &arrivals,
        &by(Some(DecodePolicy::DecodeLoad)),
        KvLink::DEFAULT,
    );
    for o in [&aggregated, &pd] {
        assert_eq!(o.completed, arrivals.len(), "everything finishes");
        assert!(o.cache_hit_rate().unwrap() > 0.3, "{:?}", o.cache_tokens);
    }
    assert!(aggregated.pd.is_empty());
    assert_eq!(pd.pd.len(), arrivals.len());
    assert!(
        pd.pd
            .iter()
            .all(|l| l.prefill_engine < PREFILL_ENGINES && l.decode_engine >= PREFILL_ENGINES)
    );
    let rows = [
        PdRow {
            variant: by(None),
            load: s.load,
            outcome: aggregated,
        },
        PdRow {
            variant: by(Some(DecodePolicy::DecodeLoad)),
            load: s.load,
            outcome: pd,
        },
    ];
    let t = table(&rows);
    assert_eq!(t.lines().count(), 3, "{t}");
    assert!(t.lines().nth(2).unwrap().contains("decode_load"), "{t}");
    let j = rows_json(&rows);
    assert!(
        j[0]["transfer_wait_p99_s"].is_null()
            && j[1]["transfer_wait_p99_s"].as_f64().unwrap() > 0.0
    );
}
