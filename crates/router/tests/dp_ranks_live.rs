//! Issue 20's live acceptance: DP ranks as routing targets, with real engines on loopback.
//!
//! (a) The same multi-turn chat sessions through the default router, on 8 engines × 1 rank and on
//! 2 engines × 4 ranks (every engine publishing its load and KV events per rank): the fleet's
//! engine-reported hit rate (cached prompt tokens / prompt tokens, summed over every engine's own
//! counters) on 2 × 4 must be at least 0.95× the one on 8 × 1; the same 2 × 4 fleet with rank
//! routing off (`--dp-rank-field none`: each engine's dispatcher re-picks the rank by load) is run
//! beside it as the contrast, and must lose much of the reuse.
//! (b) A direct client that buries one rank under long prompts (sent straight to the engine with
//! `routed_dp_rank`) makes the router send new sessions to the other ranks of the same engine; the
//! engine's `loadlink_engine_rank_requests_total` says where they ran.

use loadlink_engine::Engine;
use loadlink_router::cache::CacheBook;
use loadlink_router::candidate::RankField;
use loadlink_router::{RouterConfig, RouterHandle};
use loadlink_testkit::{KvEngine, kv_engine, scrape, wait_for, wait_until, wait_worker};
use loadlink_wire::kv_events::page_hashes;
use loadlink_wire::prompt::{PromptRoute, SimTokenizer, json_object, prompt_of};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

const WAIT_SECS: u64 = 20;
/// The engines' page size (their default).
const PAGE: usize = 16;

/// `engines` engines of `ranks` DP ranks each, publishing load and KV events per rank.
async fn fleet(engines: usize, ranks: u32, time_scale: f64) -> Vec<Engine> {
    let mut out = Vec::new();
    for _ in 0..engines {
        let KvEngine { engine, .. } = kv_engine(|c| {
            c.dp_size = ranks;
            c.time_scale = time_scale;
        })
        .await;
        out.push(engine);
    }
    out
}

/// The default router (`min_ttft` on the backlog), the chosen rank sent as `field` says, in front
/// of `engines`, once every rank's load is fresh and every KV stream is subscribed (a single-rank
/// engine, or any engine under `none`, is routed as a whole worker).
async fn default_router(engines: &[Engine], field: RankField) -> RouterHandle {
    let urls: Vec<String> = engines.iter().map(Engine::url).collect();
    let r = loadlink_router::start(RouterConfig {
        port: 0,
        worker_urls: urls.clone(),
        dp_rank_field: field,
        ..Default::default()
    })
    .await
    .expect("router starts");
    for url in &urls {
        wait_worker(&r, url, "every rank fresh, KV subscribed", |w| {
            let ranks = w["ranks"].as_array().map_or(&[][..], Vec::as_slice);
            let per_rank = ranks.len() > 1 && field != RankField::None;
            let mode = if per_rank { "per-rank" } else { "worker" };
            !ranks.is_empty()
                && ranks.iter().all(|k| k["source"] == "engine")
                && w["kv_events"].is_object()
                && w["rank_routing"]["mode"] == mode
        })
        .await;
    }
    r
}

/// The fleet `r` routes to: `engines`, each of `ranks` DP ranks.
fn fleet_of(r: &RouterHandle, engines: &[Engine], ranks: u32) -> Fleet {
    Fleet {
        router: r.url(),
        cache: r.state.cache.clone(),
        workers: Arc::new(engines.iter().map(|e| (e.url(), ranks)).collect()),
    }
}

/// Text of about `tokens` tokens (4 characters each) that no other tag shares.
fn text(tag: &str, tokens: usize) -> String {
    let unit = format!("{tag}:{}; ", tag.len());
    unit.repeat(tokens * 4 / unit.len() + 1)
}

/// Where a session runs: the router, and its view of which blocks each worker's ranks hold.
#[derive(Clone)]
struct Fleet {
    router: String,
    cache: Arc<CacheBook>,
    /// Every worker URL with its rank count.
    workers: Arc<Vec<(String, u32)>>,
}

impl Fleet {
    /// Whether some rank's announced blocks include `hash`.
    fn announced(&self, hash: i64) -> bool {
        self.workers.iter().any(|(url, ranks)| {
            (0..*ranks).any(|r| {
                self.cache
                    .rank_blocks(url, r)
                    .is_some_and(|b| b.contains(&hash))
            })
        })
    }
}

/// One chat session: each turn's prompt is the previous one plus the reply and a new question.
/// A turn is sent once the previous turn's pages are in the router's KV index: a user reads the
/// answer before the next question, and the simulated engine announces a request's pages when
/// it finishes, just after its answer leaves, so a turn sent at once would race that
/// announcement (on every fleet alike). Returns the prompt tokens the engines reported.
async fn session(c: reqwest::Client, fleet: Fleet, id: usize, turns: usize) -> u64 {
    let system = text(&format!("system {id}"), 400);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut prompt_tokens = 0;
    for turn in 0..turns {
        let question = text(&format!("s{id} t{turn}"), 60);
        messages.push(json!({"role": "user", "content": question}));
        let body = json!({"model": "loadlink-sim", "messages": messages, "max_tokens": 8});
        let resp = c
            .post(format!("{}/v1/chat/completions", fleet.router))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("session {id} turn {turn}: {e}"));
        let status = resp.status();
        let answer = resp.text().await.unwrap_or_default();
        assert!(
            status.is_success(),
            "session {id} turn {turn}: {status} {answer}"
        );
        let v: Value = serde_json::from_str(&answer).expect("a JSON answer");
        prompt_tokens += v["usage"]["prompt_tokens"]
            .as_u64()
            .expect("usage.prompt_tokens");
        let reply = v["choices"][0]["message"]["content"].clone();
        messages.push(json!({"role": "assistant", "content": reply}));
        let ids = prompt_ids(&body);
        if let Some(&last) = page_hashes(&ids, PAGE).last() {
            let what = format!("session {id} turn {turn}'s pages announced");
            wait_for(&what, WAIT_SECS, || {
                let f = fleet.clone();
                async move { f.announced(last) }
            })
            .await;
        }
    }
    prompt_tokens
}

/// The token ids the engines see for a chat body (the shared simulated tokenizer and template).
fn prompt_ids(body: &Value) -> Vec<u32> {
    let bytes = serde_json::to_vec(body).expect("a JSON body");
    let m = json_object(&bytes).expect("a JSON object");
    prompt_of(PromptRoute::Chat, &m)
        .expect("a chat prompt")
        .token_ids(&SimTokenizer)
}

/// The fleet's hit rate from the engines' own counters, once they account for `prompt_tokens`.
async fn fleet_hit_rate(c: &reqwest::Client, engines: &[Engine], prompt_tokens: u64) -> f64 {
    wait_until(
        "the engines' counters to cover every request",
        WAIT_SECS,
        || async {
            let (mut hit, mut prompt) = (0.0, 0.0);
            for e in engines {
                let page = scrape(c, &e.url()).await;
                hit += page
                    .samples("loadlink_engine_cache_hit_tokens_total")
                    .map(|s| s.value)
                    .sum::<f64>();
                prompt += page
                    .samples("loadlink_engine_prompt_tokens_total")
                    .map(|s| s.value)
                    .sum::<f64>();
            }
            if prompt >= prompt_tokens as f64 {
                Ok(hit / prompt)
            } else {
                Err(format!("{prompt} of {prompt_tokens} prompt tokens counted"))
            }
        },
    )
    .await
}

/// Runs 8 concurrent sessions of 8 turns through a default router on `engines` (each of `ranks`
/// ranks), the chosen rank sent as `field` says; returns the fleet's hit rate. (One session per
/// rank on average: with twice as many, `min_ttft` sometimes trades a session's hit for an idle
/// rank under contention, on either fleet, and the ratio varies from run to run.)
async fn hit_rate_of(engines: Vec<Engine>, ranks: u32, field: RankField) -> f64 {
    let (sessions, turns) = (8, 8);
    let r = default_router(&engines, field).await;
    let c = reqwest::Client::new();
    let f = fleet_of(&r, &engines, ranks);
    let tasks: Vec<_> = (0..sessions)
        .map(|id| tokio::spawn(session(c.clone(), f.clone(), id, turns)))
        .collect();
    let mut prompt_tokens = 0;
    for t in tasks {
        prompt_tokens += t.await.expect("a session task");
    }
    let rate = fleet_hit_rate(&c, &engines, prompt_tokens).await;
    r.stop().await;
    for e in engines {
        e.stop().await;
    }
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_engines_of_four_ranks_keep_the_hit_rate_of_eight_single_rank_engines() {
    let flat = hit_rate_of(fleet(8, 1, 10.0).await, 1, RankField::Both).await;
    let ranked = hit_rate_of(fleet(2, 4, 10.0).await, 4, RankField::Both).await;
    let blind = hit_rate_of(fleet(2, 4, 10.0).await, 4, RankField::None).await;
    eprintln!(
        "fleet hit rate: 8 x 1 {flat:.3}; 2 x 4 {ranked:.3} ({:.3}x); 2 x 4 rank-blind {blind:.3} ({:.3}x)",
        ranked / flat,
        blind / flat
    );
    assert!(
        flat > 0.5,
        "the sessions reuse their prefixes on 8 x 1: {flat}"
    );
    assert!(
        ranked >= 0.95 * flat,
        "2 x 4 keeps {ranked:.3} against 8 x 1's {flat:.3}"
    );
    // The contrast: left to each engine's dispatcher, a turn finds its rank's cache by chance.
    assert!(
        blind < 0.8 * flat,
        "rank-blind 2 x 4 {blind:.3} against 8 x 1's {flat:.3}"
    );
}

/// `(dp_rank, rank_from)` → requests, from the engine's own counter.
async fn placements(c: &reqwest::Client, url: &str) -> BTreeMap<(String, String), f64> {
    let page = scrape(c, url).await;
    page.samples("loadlink_engine_rank_requests_total")
        .map(|s| {
            let label = |k| s.label(k).unwrap_or_default().to_string();
            ((label("dp_rank"), label("rank_from")), s.value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_direct_backlog_on_one_rank_moves_new_sessions_to_the_engines_other_ranks() {
    let engines = fleet(1, 4, 1.0).await;
    let url = engines[0].url();
    let r = default_router(&engines, RankField::Both).await;
    let c = reqwest::Client::new();

    // A direct client buries rank 2 under long prompts the router never saw.
    const FLOOD: usize = 24;
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                let body = json!({"prompt": text(&format!("flood {i}"), 6000), "max_tokens": 1,
                                  "routed_dp_rank": 2});
                c.post(format!("{url}/v1/completions"))
                    .json(&body)
                    .send()
                    .await
            })
        })
        .collect();
    let key = |rank: &str, from: &str| (rank.to_string(), from.to_string());
    wait_until("the flood accepted on rank 2", WAIT_SECS, || async {
        let n = placements(&c, &url)
            .await
            .get(&key("2", "routed"))
            .copied()
            .unwrap_or(0.0);
        if n as usize == FLOOD {
            Ok(())
        } else {
            Err(format!("{n} of {FLOOD}"))
        }
    })
    .await;
    wait_worker(&r, &url, "rank 2's queue at the router", |w| {
        w["ranks"][2]["waiting"].as_i64().unwrap_or(0) >= 4
    })
    .await;

    let before = placements(&c, &url).await;
    const NEW: usize = 8;
    let f = fleet_of(&r, &engines, 4);
    for id in 0..NEW {
        session(c.clone(), f.clone(), 1000 + id, 1).await;
    }
    let after = placements(&c, &url).await;
    let delta = |rank: &str, from: &str| {
        after.get(&key(rank, from)).copied().unwrap_or(0.0)
            - before.get(&key(rank, from)).copied().unwrap_or(0.0)
    };
    let elsewhere: f64 = ["0", "1", "3"].iter().map(|k| delta(k, "routed")).sum();
    assert_eq!(
        delta("2", "routed"),
        0.0,
        "no new session joins rank 2's queue: {after:?}"
    );
    assert_eq!(
        elsewhere, NEW as f64,
        "the router named the other ranks: {after:?}"
    );
    for k in ["0", "1", "2", "3"] {
        assert_eq!(
            delta(k, "dispatcher"),
            0.0,
            "no rank left to the dispatcher: {after:?}"
        );
    }
    r.stop().await;
    for f in &flood {
        f.abort();
    }
    for e in engines {
        e.stop_within(std::time::Duration::from_millis(200)).await;
    }
}
