//! Driving the trace: every arrival is sent at its compressed time to a router replica (round
//! robin over the replicas) or, for direct traffic, straight to an engine; TTFT and E2E are
//! measured on the streamed response.
//!
//! The request body always carries the prompt as `input_ids`, which the engine takes as given, so
//! every variant puts the same tokens in the same caches. Routers that only accept OpenAI's
//! completions schema (sglang-router requires `model`, and a `prompt` that is text) get those too
//! when the run has an external variant: `model` is the engines' served name, and `prompt` writes
//! each token id as 4 base-36 digits.
//!
//! A request of a many-model trace (`bench live --scenario models`) names its own model, and its
//! LoRA adapter as [`AdapterField`] says: `model: "base:adapter"` (SGLang), `model: "adapter"`
//! (vLLM) or `model: "base"` with `lora_path: "adapter"` (SGLang's body field). So one trace can
//! be sent through loadlink and through another router that knows one spelling. That text has the trace's prefix structure exactly (a shared
//! token prefix is a shared character prefix, 4 characters per token, the engine tokenizer's own
//! rate), so a text-based prefix tree such as sglang-router's `cache_aware` sees the reuse that is
//! there. The engine ignores `prompt` when `input_ids` is present.

use super::LiveConfig;
use super::pd::{PdWorkers, with_bootstrap};
use crate::scenario::Scenario;
use crate::sim::sessions::ClosedLoop;
use crate::sim::{DirectTarget, isolated_ttft};
use crate::workload::Arrival;
use loadlink_router::policy::mix;
use std::time::{Duration, Instant};

/// One completed request, in virtual seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Done {
    /// When the trace sent it (its arrival time, for the windowed figures of a burst).
    pub(super) arrived: f64,
    pub(super) ttft: f64,
    pub(super) e2e: f64,
    /// Its TTFT on an idle engine.
    pub(super) floor: f64,
    /// Time per output token after the first, when it has two or more.
    pub(super) tpot: Option<f64>,
}

/// What the clients got: every completed request, in arrival order, and what was refused.
#[derive(Debug, Default)]
pub(super) struct Measured {
    pub(super) done: Vec<Done>,
    /// 429s a client answered by sending the request again, after its `Retry-After`.
    pub(super) retried: usize,
    /// Requests refused with 429 for good (their client's retries spent).
    pub(super) refused: usize,
    /// Closed-loop turns never sent because an earlier turn of their session was refused or
    /// failed (the agent stopped there).
    pub(super) abandoned: usize,
}

/// What one attempt got back.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// Streamed: when it was sent, when its first event came, when it ended.
    Streamed(Instant, Instant, Instant),
    /// 429: when it was sent, and its `Retry-After` in seconds when it had one.
    Refused(Instant, Option<u64>),
    /// Anything else: a connection error, another status, a stream without an event.
    Failed,
}

/// How long a client waits before sending a refused request again, as the OpenAI Python SDK
/// does: the `Retry-After` when it is a positive number of seconds up to 60, else 0.5 s doubling
/// with each retry, at most 8 s (without the SDK's jitter, so runs repeat).
fn retry_delay(retry_after_s: Option<u64>, retry: u32) -> Duration {
    match retry_after_s {
        Some(s @ 1..=60) => Duration::from_secs(s),
        _ => Duration::from_secs_f64((0.5 * 2f64.powi(retry as i32)).min(8.0)),
    }
}

/// Where arrival `i` is sent: a router replica, or an engine for direct traffic.
fn target(s: &Scenario, i: usize, a: &Arrival, engines: &[String], routers: &[String]) -> String {
    if !a.direct {
        return routers[i % routers.len()].clone();
    }
    match s.direct {
        DirectTarget::Pinned => engines[0].clone(),
        DirectTarget::Uniform => {
            engines[(mix(i as u64 ^ 0xd1ec7) % engines.len() as u64) as usize].clone()
        }
    }
}

/// Token ids as text: 4 base-36 digits each (ids are below 36^4), no separator.
pub(super) fn ids_text(ids: &[u32]) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = String::with_capacity(ids.len() * 4);
    for &id in ids {
        for place in [36 * 36 * 36, 36 * 36, 36, 1] {
            s.push(DIGITS[(id / place % 36) as usize] as char);
        }
    }
    s
}

/// How a request names its LoRA adapter (`bench live --adapter-field`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AdapterField {
    /// `model: "base:adapter"` (SGLang).
    #[default]
    Colon,
    /// `model: "adapter"` (vLLM).
    Name,
    /// `model: "base"`, `lora_path: "adapter"` (SGLang's body field).
    LoraPath,
}

impl AdapterField {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "colon" => Ok(AdapterField::Colon),
            "name" => Ok(AdapterField::Name),
            "lora-path" => Ok(AdapterField::LoraPath),
            o => Err(format!(
                "--adapter-field {o:?}: expected colon, name or lora-path"
            )),
        }
    }
}

/// The body for arrival `i`: its own `model` (and adapter, as `field` says) when the trace names
/// one; else, with `openai_model`, that; with `openai_model`, also a text `prompt` (module docs).
pub(super) fn body(
    a: &Arrival,
    i: usize,
    (openai_model, field): (Option<&str>, AdapterField),
) -> serde_json::Value {
    let ids = a.prompt_ids(i);
    let mut b = serde_json::json!({ "max_tokens": a.output_tokens, "stream": true });
    match (&a.model, openai_model) {
        (Some(m), _) => match (&m.adapter, field) {
            (None, _) => b["model"] = m.model.as_ref().into(),
            (Some(ad), AdapterField::Colon) => b["model"] = format!("{}:{ad}", m.model).into(),
            (Some(ad), AdapterField::Name) => b["model"] = ad.as_ref().into(),
            (Some(ad), AdapterField::LoraPath) => {
                b["model"] = m.model.as_ref().into();
                b["lora_path"] = ad.as_ref().into();
            }
        },
        (None, Some(model)) => b["model"] = model.into(),
        (None, None) => {}
    }
    if openai_model.is_some() {
        b["prompt"] = ids_text(&ids).into();
    }
    b["input_ids"] = ids.into();
    b
}

/// Finds the stream's first event: whether `chunk`, after what came before it (`seen`: at most
/// the last few bytes, kept so a `data:` split across two chunks is found), holds a `data:` field.
/// SSE comments (`:` lines) are not events: a router may send them as keep-alives long before
/// the first token (SMG 1.13 does, every 15 s), and counting them would cap the measured TTFT.
fn first_event(seen: &mut Vec<u8>, chunk: &[u8]) -> bool {
    const FIELD: &[u8] = b"data:";
    seen.extend_from_slice(chunk);
    if seen.windows(FIELD.len()).any(|w| w == FIELD) {
        return true;
    }
    let keep = seen.len().saturating_sub(FIELD.len() - 1);
    seen.drain(..keep);
    false
}

/// One streaming request at `at`.
async fn send_one(c: reqwest::Client, at: Instant, url: String, body: serde_json::Value) -> Answer {
    tokio::time::sleep_until(at.into()).await;
    let t0 = Instant::now();
    let Ok(mut resp) = c
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
    else {
        return Answer::Failed;
    };
    if resp.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok());
        return Answer::Refused(t0, retry_after);
    }
    if !resp.status().is_success() {
        return Answer::Failed;
    }
    let (mut first, mut seen) = (None, Vec::new());
    while let Ok(Some(chunk)) = resp.chunk().await {
        if first.is_none() && first_event(&mut seen, &chunk) {
            first = Some(Instant::now());
        }
    }
    first.map_or(Answer::Failed, |f| Answer::Streamed(t0, f, Instant::now()))
}

/// Direct request `i` on a PD fleet at `at`: the same body, with the bootstrap fields of a pair
/// the client picked, to a prefill and a decode engine at once; the decode engine's stream is
/// measured (the prefill engine's answer is read to its end and dropped).
async fn send_pair(
    c: reqwest::Client,
    at: Instant,
    (sides, i): (&PdWorkers, usize),
    body: serde_json::Value,
) -> Answer {
    let Some((prefill, decode, room)) = sides.direct_pair(i) else {
        return Answer::Failed;
    };
    let body = with_bootstrap(body, prefill, room);
    let prefill_leg = send_one(c.clone(), at, prefill.0.clone(), body.clone());
    let decode_leg = send_one(c, at, decode.clone(), body);
    let (_, measured) = tokio::join!(prefill_leg, decode_leg);
    measured
}

/// Sends every arrival at its (compressed) time and waits for all of them. A closed-loop
/// session's turn ([`crate::workload::Turn`]) is sent instead once the previous turn's answer has
/// streamed to its end, after the think time (compressed too); a turn that fails, or is refused
/// once its client's retries (`LiveConfig::client_retries`) are spent, ends its session.
pub(super) async fn drive(
    cfg: &LiveConfig,
    client: &reqwest::Client,
    (arrivals, openai_model): (&[Arrival], Option<&str>),
    (engines, routers, pd): (&[String], &[String], Option<&PdWorkers>),
    progress: &mut dyn FnMut(&str),
    label: &str,
) -> Measured {
    let (s, k) = (&cfg.scenario, cfg.time_scale);
    let start = Instant::now();
    let mut floors = std::collections::HashMap::new();
    let mut requests: Vec<Option<Request>> = arrivals
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let floor = *floors
                .entry(a.prompt_tokens)
                .or_insert_with(|| isolated_ttft(s.model, a.prompt_tokens));
            Some(Request {
                i,
                url: target(s, i, a, engines, routers),
                body: body(a, i, (openai_model, cfg.adapter_field)),
                pair: pd.filter(|_| a.direct).cloned(),
                retries: cfg.client_retries,
                floor,
                later_tokens: a.output_tokens.saturating_sub(1),
            })
        })
        .collect();
    let sessions = ClosedLoop::new(arrivals);
    let mut tasks = Vec::new();
    for first in (0..arrivals.len()).filter(|&i| !sessions.held(i)) {
        // The session's turns in order, each with the think time before it.
        let chain: Vec<(Request, f64)> =
            std::iter::successors(Some((first, 0.0)), |&(i, _)| sessions.next(i))
                .filter_map(|(i, think)| Some((requests[i].take()?, think)))
                .collect();
        let (c, at) = (
            client.clone(),
            start + Duration::from_secs_f64(arrivals[first].t / k),
        );
        tasks.push(tokio::spawn(async move {
            let (mut at, mut m) = (at, Measured::default());
            let turns = chain.len();
            for (turn, (r, think)) in chain.into_iter().enumerate() {
                if turn > 0 {
                    at = Instant::now() + Duration::from_secs_f64(think / k);
                }
                let arrived = at.saturating_duration_since(start).as_secs_f64() * k;
                match r.send(c.clone(), at, arrived, k, &mut m).await {
                    Some(d) => m.done.push(d),
                    None => {
                        m.abandoned += turns - turn - 1;
                        break;
                    }
                }
            }
            m
        }));
    }
    let (n, mut measured) = (tasks.len(), Measured::default());
    for (j, t) in tasks.into_iter().enumerate() {
        if let Ok(m) = t.await {
            measured.done.extend(m.done);
            measured.retried += m.retried;
            measured.refused += m.refused;
            measured.abandoned += m.abandoned;
        }
        if j % 200 == 0 {
            progress(&format!("{label}: {j}/{n} sessions done"));
        }
    }
    measured
        .done
        .sort_by(|a, b| a.arrived.total_cmp(&b.arrived));
    measured
}

/// One arrival, ready to send.
struct Request {
    i: usize,
    url: String,
    body: serde_json::Value,
    pair: Option<PdWorkers>,
    /// How many times its client sends it again after a 429.
    retries: u32,
    floor: f64,
    later_tokens: u64,
}

impl Request {
    /// Sends it at `at` (trace time `arrived`), again after each 429 while its retries last
    /// (counted in `m`); its figures in trace seconds (× `k`), its TTFT from the first attempt.
    /// `None`: it failed or was refused for good.
    async fn send(
        mut self,
        c: reqwest::Client,
        at: Instant,
        arrived: f64,
        k: f64,
        m: &mut Measured,
    ) -> Option<Done> {
        let (mut attempt_at, mut first_sent) = (at, None);
        for retry in 0..=self.retries {
            // The body is copied only while a retry may still need it.
            let body = match retry < self.retries {
                true => self.body.clone(),
                false => std::mem::take(&mut self.body),
            };
            let answer = match &self.pair {
                Some(sides) => send_pair(c.clone(), attempt_at, (sides, self.i), body).await,
                None => send_one(c.clone(), attempt_at, self.url.clone(), body).await,
            };
            match answer {
                Answer::Streamed(sent, first, end) => {
                    let sent = *first_sent.get_or_insert(sent);
                    let (ttft, e2e) = (first - sent, end - sent);
                    let (ttft, e2e) = (ttft.as_secs_f64(), e2e.as_secs_f64());
                    return Some(Done {
                        arrived,
                        ttft: ttft * k,
                        e2e: e2e * k,
                        floor: self.floor,
                        tpot: (self.later_tokens > 0)
                            .then(|| (end - first).as_secs_f64() * k / self.later_tokens as f64),
                    });
                }
                Answer::Refused(sent, retry_after) if retry < self.retries => {
                    first_sent.get_or_insert(sent);
                    m.retried += 1;
                    attempt_at = Instant::now() + retry_delay(retry_after, retry);
                }
                Answer::Refused(..) => m.refused += 1,
                Answer::Failed => return None,
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_event_is_the_first_data_field_not_a_keep_alive_comment() {
        let mut seen = Vec::new();
        assert!(!first_event(&mut seen, b":\n\n"));
        assert!(!first_event(&mut seen, b": keep-alive\n\n"));
        assert!(first_event(&mut seen, b"data: {\"choices\":[]}\n\n"));
        // A field split across two chunks is found, and the bytes kept stay bounded.
        let mut seen = Vec::new();
        assert!(!first_event(&mut seen, b":\n\nda"));
        assert!(seen.len() < 5);
        assert!(first_event(&mut seen, b"ta: x\n\n"));
    }

    #[tokio::test]
    async fn a_keep_alive_before_the_first_token_does_not_count_as_it() {
        // A raw HTTP/1.1 server on loopback: a keep-alive comment at once, the first event only
        // after the client's clock has run `gap` past the comment.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let gap = Duration::from_millis(300);
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            // Read the request head and its small JSON body (bounded: until the body's end).
            while !got.ends_with(b"}") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed early");
                got.extend_from_slice(&buf[..n]);
            }
            let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            conn.write_all(format!("{head}{}", chunk(":\n\n")).as_bytes())
                .await
                .unwrap();
            conn.flush().await.unwrap();
            tokio::time::sleep(gap).await;
            let rest = format!(
                "{}{}0\r\n\r\n",
                chunk("data: {}\n\n"),
                chunk("data: [DONE]\n\n")
            );
            conn.write_all(rest.as_bytes()).await.unwrap();
        });
        let body = serde_json::json!({ "stream": true });
        let Answer::Streamed(sent, first, end) =
            send_one(reqwest::Client::new(), Instant::now(), url, body).await
        else {
            panic!("the stream had an event");
        };
        // The comment came at once; the first event no sooner than `gap` later.
        assert!(first - sent >= gap, "{:?}", first - sent);
        assert!(end >= first);
        server.await.unwrap();
    }

    /// A loopback server, one request per connection: the first `refusals` get 429 with
    /// `Retry-After: 1` at once, the rest one streamed event `answer` after they were read. When
    /// each of its `requests` came in.
    async fn loopback_server(
        (refusals, requests): (usize, usize),
        answer: Duration,
    ) -> (String, tokio::task::JoinHandle<Vec<Instant>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut came = Vec::new();
            for k in 0..requests {
                let (mut conn, _) = listener.accept().await.unwrap();
                let (mut buf, mut got) = (vec![0u8; 65536], Vec::new());
                while !got.ends_with(b"}") {
                    let n = conn.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client closed early");
                    got.extend_from_slice(&buf[..n]);
                }
                came.push(Instant::now());
                let data = "data: {}\n\ndata: [DONE]\n\n";
                let reply = match k < refusals {
                    true => "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\n\
                             connection: close\r\ncontent-length: 0\r\n\r\n"
                        .to_string(),
                    false => {
                        tokio::time::sleep(answer).await;
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                             connection: close\r\ncontent-length: {}\r\n\r\n{data}",
                            data.len()
                        )
                    }
                };
                conn.write_all(reply.as_bytes()).await.unwrap();
            }
            came
        });
        (url, server)
    }

    /// Turn `index` of one session, nominally at `t`, after `think_s` of tool time.
    fn session_turn(t: f64, index: u32, think_s: f64) -> Arrival {
        Arrival {
            t,
            prompt_tokens: 8,
            output_tokens: 2,
            stream: true,
            direct: false,
            prompt: None,
            model: None,
            turn: Some(crate::workload::Turn {
                session: 9,
                index,
                think_s,
            }),
        }
    }

    /// Drives `arrivals` at time-scale 1 to `url` (as router and engine), the client retrying a
    /// 429 `retries` times.
    async fn drive_to(url: String, arrivals: &[Arrival], retries: u32) -> Measured {
        let cfg = LiveConfig {
            exe: Default::default(),
            scenario: crate::scenario::by_name("s0").unwrap(),
            seed: 1,
            load: 1.0,
            time_scale: 1.0,
            duration_s: 1.0,
            variants: Vec::new(),
            adapter_field: AdapterField::default(),
            pd_prefill: None,
            burst: None,
            client_retries: retries,
        };
        let fleet = [url];
        let traffic = (arrivals, None);
        let client = reqwest::Client::new();
        drive(
            &cfg,
            &client,
            traffic,
            (&fleet, &fleet, None),
            &mut |_| {},
            "t",
        )
        .await
    }

    #[tokio::test]
    async fn a_refused_turn_ends_its_session_unless_the_client_retries_after_retry_after() {
        let arrivals = [session_turn(0.0, 0, 0.0), session_turn(0.0, 1, 0.0)];
        // Without retries the server sees the 429'd request only.
        let (url, server) = loopback_server((1, 1), Duration::ZERO).await;
        let gave_up = drive_to(url, &arrivals, 0).await;
        server.await.unwrap();
        assert_eq!(
            (
                gave_up.done.len(),
                gave_up.refused,
                gave_up.retried,
                gave_up.abandoned
            ),
            (0, 1, 0, 1),
            "refused, and the session's second turn never sent"
        );
        // With retries: the 429, the retry, the second turn.
        let (url, server) = loopback_server((1, 3), Duration::ZERO).await;
        let retried = drive_to(url, &arrivals, 2).await;
        let came = server.await.unwrap();
        assert_eq!(
            (
                retried.done.len(),
                retried.refused,
                retried.retried,
                retried.abandoned
            ),
            (2, 0, 1, 0)
        );
        let waited = (came[1] - came[0]).as_secs_f64();
        assert!(waited >= 1.0, "the retry came {waited} s after the 429");
        // The retried turn's TTFT counts from its first attempt.
        assert!(retried.done[0].ttft >= 1.0, "{}", retried.done[0].ttft);
        assert!(retried.done[1].ttft < 1.0);
    }

    #[tokio::test]
    async fn a_closed_loop_turn_is_sent_after_the_previous_answer_and_the_think_time() {
        // Each answer comes 200 ms after its request. Open-loop, turn 1 would go 50 ms after
        // turn 0, before turn 0 is answered.
        let (answer, think_s) = (Duration::from_millis(200), 0.3);
        let (url, server) = loopback_server((0, 2), answer).await;
        let arrivals = [
            session_turn(0.0, 0, think_s),
            session_turn(0.05, 1, think_s),
        ];
        let measured = drive_to(url, &arrivals, 0).await;
        let came = server.await.unwrap();
        let gap = (came[1] - came[0]).as_secs_f64();
        assert!(
            gap >= answer.as_secs_f64() + think_s,
            "turn 1 came {gap} s after turn 0"
        );
        assert_eq!(measured.done.len(), 2);
        assert!(measured.done[1].arrived >= answer.as_secs_f64() + think_s);
    }

    #[test]
    fn ids_text_is_four_characters_per_token_and_keeps_prefixes() {
        assert_eq!(
            ids_text(&[0, 1, 35, 36, (1 << 17) - 1]),
            "00000001000z00102t4v"
        );
        let a = ids_text(&[500, 600, 700]);
        let b = ids_text(&[500, 600, 701]);
        assert_eq!(a.len(), 12);
        assert!(b.starts_with(&a[..8]));
        assert_ne!(a, b);
    }

    #[test]
    fn the_openai_body_adds_model_and_text_but_keeps_the_ids() {
        let a = Arrival {
            t: 0.0,
            prompt_tokens: 2,
            output_tokens: 3,
            stream: true,
            direct: false,
            prompt: Some(vec![17u32, 18].into()),
            turn: None,
            model: None,
        };
        let plain = body(&a, 0, (None, AdapterField::Colon));
        assert_eq!(plain["input_ids"], serde_json::json!([17, 18]));
        assert!(plain.get("model").is_none() && plain.get("prompt").is_none());
        let openai = body(&a, 0, (Some("m"), AdapterField::Colon));
        assert_eq!(openai["input_ids"], plain["input_ids"]);
        assert_eq!(openai["model"], "m");
        assert_eq!(openai["prompt"], "000h000i");
        assert_eq!(openai["max_tokens"], 3);
    }

    #[test]
    fn a_named_model_and_adapter_are_spelled_as_asked() {
        let mut a = Arrival {
            t: 0.0,
            prompt_tokens: 1,
            output_tokens: 1,
            stream: true,
            direct: false,
            prompt: Some(vec![17u32].into()),
            turn: None,
            model: Some(crate::workload::ModelRef {
                model: "base".into(),
                adapter: Some("tenant-03".into()),
            }),
        };
        let b = |f, openai| body(&a, 0, (openai, f));
        assert_eq!(b(AdapterField::Colon, None)["model"], "base:tenant-03");
        assert_eq!(b(AdapterField::Name, Some("x"))["model"], "tenant-03");
        let lp = b(AdapterField::LoraPath, None);
        assert_eq!(
            (&lp["model"], &lp["lora_path"]),
            (&"base".into(), &"tenant-03".into())
        );
        assert!(b(AdapterField::Colon, None).get("prompt").is_none());
        assert!(b(AdapterField::Colon, Some("x")).get("prompt").is_some());
        a.model.as_mut().unwrap().adapter = None;
        assert_eq!(
            body(&a, 0, (Some("x"), AdapterField::Name))["model"],
            "base"
        );
        assert!(
            AdapterField::parse("y")
                .unwrap_err()
                .contains("colon, name or lora-path")
        );
    }
}
