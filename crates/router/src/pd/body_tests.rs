use super::*;

fn parsed(b: &[u8]) -> Value {
    serde_json::from_slice(b).unwrap()
}

fn boot<'a>(rooms: &'a [u64], port: BootstrapPort, rank: Option<u32>) -> Bootstrap<'a> {
    Bootstrap {
        host: "10.0.0.7",
        port,
        rooms,
        prefill_rank: rank,
    }
}

#[test]
fn a_single_request_gets_single_fields_and_keeps_its_own() {
    let body = Bytes::from_static(
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
    );
    let s = shape("/v1/chat/completions", body.clone()).unwrap();
    assert_eq!(
        s,
        Shape {
            batch: None,
            body: body.clone()
        },
        "nothing to strip: the same bytes"
    );
    let out = with_bootstrap(
        &s.body,
        s.batch,
        &boot(&[42], BootstrapPort::Port(8998), Some(3)),
    );
    let v = parsed(&out);
    assert_eq!(v["bootstrap_host"], "10.0.0.7");
    assert_eq!(v["bootstrap_port"], 8998);
    assert_eq!(v["bootstrap_room"], 42);
    assert_eq!(v["disagg_prefill_dp_rank"], 3);
    assert_eq!(v["messages"][0]["content"], "hi");
    assert!(
        out.ends_with(&body[1..]),
        "the client's members follow byte for byte"
    );
}

#[test]
fn a_batched_generate_gets_one_room_per_prompt() {
    let body =
        Bytes::from_static(br#"{"text":["a","b","c"],"sampling_params":{"max_new_tokens":4}}"#);
    let s = shape("/generate", body).unwrap();
    assert_eq!(s.batch, Some(3));
    let out = with_bootstrap(
        &s.body,
        s.batch,
        &boot(&[1, 2, 3], BootstrapPort::Port(9000), None),
    );
    let v = parsed(&out);
    assert_eq!(
        v["bootstrap_host"],
        serde_json::json!(["10.0.0.7", "10.0.0.7", "10.0.0.7"])
    );
    assert_eq!(v["bootstrap_port"], serde_json::json!([9000, 9000, 9000]));
    assert_eq!(v["bootstrap_room"], serde_json::json!([1, 2, 3]));
    assert!(v.get("disagg_prefill_dp_rank").is_none());
    let ids = shape(
        "/generate",
        Bytes::from_static(br#"{"input_ids":[[1,2],[3]]}"#),
    )
    .unwrap();
    assert_eq!(ids.batch, Some(2));
    let one = shape("/generate", Bytes::from_static(br#"{"input_ids":[1,2]}"#)).unwrap();
    assert_eq!(one.batch, None);
    // A list prompt on the OpenAI route is still one request's fields (SGLang's protocol).
    let c = shape(
        "/v1/completions",
        Bytes::from_static(br#"{"prompt":["a","b"]}"#),
    )
    .unwrap();
    assert_eq!(c.batch, None);
}

#[test]
fn client_bootstrap_fields_are_replaced_and_none_omits_the_port() {
    let body = Bytes::from_static(
        br#"{"text":"x","bootstrap_room":5,"bootstrap_host":"evil","disagg_prefill_dp_rank":9}"#,
    );
    let s = shape("/generate", body).unwrap();
    let out = with_bootstrap(&s.body, s.batch, &boot(&[77], BootstrapPort::Omitted, None));
    let text = std::str::from_utf8(&out).unwrap();
    assert_eq!(text.matches("bootstrap_room").count(), 1, "{text}");
    let v = parsed(&out);
    assert_eq!(
        (v["bootstrap_room"].as_u64(), v["bootstrap_host"].as_str()),
        (Some(77), Some("10.0.0.7"))
    );
    assert!(v.get("bootstrap_port").is_none() && v.get("disagg_prefill_dp_rank").is_none());
    let empty = with_bootstrap(b"{}", None, &boot(&[1], BootstrapPort::Port(1), None));
    assert_eq!(parsed(&empty)["bootstrap_room"], 1);
}

#[test]
fn bodies_that_are_not_objects_are_refused_with_the_reason() {
    for bad in [&b"[1]"[..], b"\"x\"", b"{", b""] {
        let e = shape("/generate", Bytes::copy_from_slice(bad)).unwrap_err();
        assert!(e.contains("must be a JSON object"), "{e}");
    }
}

#[test]
fn hosts_come_from_the_worker_url() {
    assert_eq!(url_host("http://127.0.0.1:30000"), "127.0.0.1");
    assert_eq!(url_host("http://prefill-0.svc:8000/"), "prefill-0.svc");
    assert_eq!(url_host("http://[::1]:8000"), "::1");
    assert_eq!(url_host("http://u:p@host:1"), "host");
}
