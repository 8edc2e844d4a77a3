//! Generation A's port rule on the shared resolver table (`tests/interop/resolver_cases.json`,
//! whose `expect_a` column is written from PROTOCOL.md §4; generation B's column is checked live
//! against SGLang by the interop suite).

use loadlink_wire::{Generation, KvEventsConfig, RangeRequest, resolve_load_range};
use serde_json::Value;

#[test]
fn generation_a_follows_the_protocol_rule_on_every_row() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/interop/resolver_cases.json"
    );
    let rows: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(rows.len() >= 60);
    let mut wrong = Vec::new();
    for row in &rows {
        let s = |k: &str| row[k].as_str();
        let kv = s("kv_endpoint").map(|e| KvEventsConfig {
            publisher: "zmq".into(),
            endpoint: e.into(),
            replay_endpoint: s("replay_endpoint").map(Into::into),
            ..Default::default()
        });
        let got = resolve_load_range(RangeRequest {
            kv: kv.as_ref(),
            dp_size: row["dp_size"].as_u64().unwrap() as u32,
            load_publish_endpoint: s("load_publish_endpoint"),
            generation: Generation::Snapshot,
        });
        let got = got.ok().map(|r| (r.host, r.base as u64));
        let want = row["expect_a"].as_object().map(|o| {
            (
                o["host"].as_str().unwrap().to_string(),
                o["base"].as_u64().unwrap(),
            )
        });
        if got != want {
            wrong.push(format!("{row}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} rows wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
