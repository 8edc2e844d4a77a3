use super::*;
use crate::candidate::RankField;
use crate::models::served::ServedModels;
use serde_json::json;
use std::time::Instant;

/// A fleet of workers serving `info` (a `/server_info` body each; `None`: names nothing).
fn fleet(info: &[Option<serde_json::Value>]) -> (Vec<Arc<Worker>>, ModelTable) {
    let epoch = Instant::now();
    let workers: Vec<Arc<Worker>> = (0..info.len())
        .map(|i| Arc::new(Worker::new(format!("http://w{i}"), 0, None, epoch)))
        .collect();
    let mut served = HashMap::new();
    for (w, i) in workers.iter().zip(info) {
        if let Some(i) = i {
            let mut s = ServedModels::default();
            s.read_server_info(i.to_string().as_bytes()).unwrap();
            served.insert(w.url.clone(), Arc::new(s));
        }
    }
    let list = CandidateList::of(&workers, RankField::Both);
    let t = ModelTable::build(&workers, &list, &served, &mut HashMap::new());
    (workers, t)
}

/// The worker indices `r` leads to.
fn to(t: &ModelTable, ws: &[Arc<Worker>], r: &Resolved) -> Vec<u32> {
    let list = CandidateList::of(ws, RankField::Both);
    t.targets(r.set, Candidates::whole(ws), &list.ranked, false)
        .iter()
        .map(|c| c.worker)
        .collect()
}

#[test]
fn names_and_paths_lead_to_the_workers_that_serve_them() {
    let (ws, t) = fleet(&[
        Some(json!({"served_model_name": "alpha", "model_path": "/m/alpha"})),
        Some(json!({"served_model_name": "beta"})),
        Some(json!({"served_model_name": "alpha"})),
    ]);
    let r = t.resolve(Some("alpha"), None, None).unwrap();
    assert_eq!(to(&t, &ws, &r), [0, 2]);
    assert_eq!(r.model.as_deref(), Some("alpha"));
    let r = t.resolve(Some("/m/alpha"), None, None).unwrap();
    assert_eq!(to(&t, &ws, &r), [0], "only the worker that names the path");
    assert_eq!(
        t.resolve(Some("gamma"), None, None).unwrap_err(),
        Unresolved::NotFound("gamma".into())
    );
    let e = t.resolve(None, None, None).unwrap_err();
    assert_eq!(
        e,
        Unresolved::NoDefault(vec!["alpha".into(), "beta".into()])
    );
    assert!(t.resolve(Some("default"), None, None).is_err());
    let r = t.resolve(Some("default"), None, Some("beta")).unwrap();
    assert_eq!(to(&t, &ws, &r), [1], "--default-model");
    assert_eq!(t.workers_of("alpha"), [0, 2]);
}

#[test]
fn one_model_is_the_default_and_a_silent_fleet_is_routed_as_before() {
    let (ws, t) = fleet(&[
        Some(json!({"served_model_name": "alpha"})),
        Some(json!({"served_model_name": "alpha"})),
    ]);
    let r = t.resolve(None, None, None).unwrap();
    assert_eq!((r.set, to(&t, &ws, &r)), (SetId::All, vec![0, 1]));
    let (ws, t) = fleet(&[None, None]);
    assert!(!t.routes_by_model());
    let r = t.resolve(Some("anything"), Some("a1"), None).unwrap();
    assert_eq!(r.adapter.as_deref(), Some("a1"));
    assert_eq!((r.model.clone(), to(&t, &ws, &r)), (None, vec![0, 1]));
}

#[test]
fn adapters_are_reached_as_sglang_and_vllm_name_them() {
    let (ws, t) = fleet(&[
        Some(json!({"served_model_name": "base", "lora_paths": ["a1=/l/a1"]})),
        Some(json!({"served_model_name": "base", "lora_paths": ["a2=/l/a2"]})),
        Some(json!({"served_model_name": "other", "lora_paths": ["a1=/l/a1"]})),
    ]);
    let r = t.resolve(Some("base:a1"), None, None).unwrap();
    assert_eq!(to(&t, &ws, &r), [0]);
    assert_eq!(r.adapter.as_deref(), Some("a1"));
    assert_eq!(r.model.as_deref(), Some("base"));
    let r = t.resolve(Some("a2"), None, None).unwrap();
    assert_eq!(to(&t, &ws, &r), [1], "vLLM: the adapter as the model");
    let r = t.resolve(Some("base"), Some("a1"), None).unwrap();
    assert_eq!(to(&t, &ws, &r), [0], "SGLang's lora_path");
    let r = t.resolve(Some("a1"), Some("a2"), None).unwrap();
    assert_eq!(
        (to(&t, &ws, &r), r.adapter.as_deref()),
        (vec![1], Some("a2")),
        "beside a bare name, lora_path names the adapter, as SGLang reads it"
    );
    let r = t.resolve(Some("base"), Some("/l/new"), None).unwrap();
    assert_eq!(
        to(&t, &ws, &r),
        [0, 1],
        "an unlisted path may load on demand"
    );
    assert!(matches!(
        t.resolve(Some("base:zz"), None, None),
        Err(Unresolved::NotFound(_))
    ));
    assert_eq!(
        t.lora(Some("base"), "a1"),
        LoraRef::from_path("a1", "/l/a1")
    );
    assert_ne!(
        t.lora(Some("base"), "zz").id,
        LoraRef::from_path("zz", "zz").id
    );
    assert_ne!(
        t.lora(Some("nope"), "a1").id,
        LoraRef::from_path("a1", "/l/a1").id
    );
}

#[test]
fn workers_that_name_nothing_take_only_what_nobody_names() {
    let (ws, t) = fleet(&[Some(json!({"served_model_name": "alpha"})), None]);
    let r = t.resolve(Some("alpha"), None, None).unwrap();
    assert_eq!(to(&t, &ws, &r), [0]);
    let r = t.resolve(Some("mystery"), None, None).unwrap();
    assert_eq!((r.model.clone(), to(&t, &ws, &r)), (None, vec![1]));
    let colon = fleet(&[Some(json!({"served_model_name": "s3://b/m"}))]).1;
    let r = colon.resolve(Some("s3://b/m"), None, None).unwrap();
    assert_eq!(r.adapter, None, "a served name with colons is a name");
}

#[test]
fn one_adapter_name_under_two_models_is_never_mixed() {
    let (ws, t) = fleet(&[
        Some(json!({"served_model_name": "m1", "lora_paths": ["sql=/m1/sql"]})),
        Some(json!({"served_model_name": "m2", "lora_paths": ["sql=/m2/sql"]})),
    ]);
    let r = t.resolve(Some("m2:sql"), None, None).unwrap();
    assert_eq!(to(&t, &ws, &r), [1]);
    assert_eq!(
        t.lora(r.model.as_deref(), "sql"),
        LoraRef::from_path("sql", "/m2/sql")
    );
    let e = t.resolve(Some("sql"), None, None).unwrap_err();
    assert_eq!(
        e,
        Unresolved::Ambiguous("sql".into(), vec!["m1".into(), "m2".into()])
    );
}
