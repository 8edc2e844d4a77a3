//! `loadlink wire …`: the protocol as command-line tools. The interop harness drives these to
//! compare loadlink with the real SGLang modules, and operators can use them to inspect sockets.

use anyhow::{Context, Result, bail};
use clap::{Subcommand, ValueEnum};
use loadlink_wire::codec::{decode_payload, snapshot_bytes, stat_bytes};
use loadlink_wire::kv_events::{
    decode_kv_batch, kv_batch_bytes, kv_batch_from_json, kv_batch_to_json, page_hashes,
};
use loadlink_wire::loads::{Include, snapshot_dict, snapshot_from_dict};
use loadlink_wire::{
    Generation, KvEventsConfig, LoadStat, Payload, RangeRequest, resolve_load_range,
};
use serde_json::{Value, json};
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    Snapshot,
    Stat,
    /// A KV-event stream `KVEventBatch` (`{"ts", "events": [{"type": …}], "attn_dp_rank"}`).
    KvBatch,
}

/// What `wire parse-loads` reads.
#[derive(Clone, Copy, ValueEnum)]
pub enum PolledBody {
    /// A `GET /v1/loads` JSON document.
    Loads,
    /// A `GET /metrics` page with SGLang's or vLLM's scheduler gauges.
    Metrics,
}

#[derive(Subcommand)]
pub enum WireCommand {
    /// Read JSON objects (one per line) from stdin, print their msgpack bytes as hex.
    Encode {
        /// `snapshot`: a `to_dict`-shaped object (present floats count as explicitly set);
        /// `stat`: an object with LoadStat's field names; `kv-batch`: a KV-event batch.
        #[arg(long, value_enum, default_value = "snapshot")]
        kind: Kind,
    },
    /// Read hex payloads (one per line) from stdin, print each decoded as JSON (or {"error": …}).
    Decode {
        /// `snapshot` or `stat`: either load payload (told apart by its shape); `kv-batch`: a
        /// KV-event batch.
        #[arg(long, value_enum, default_value = "snapshot")]
        kind: Kind,
    },
    /// Read resolver requests as JSON lines ({kv_endpoint, replay_endpoint, dp_size,
    /// load_publish_endpoint, generation}) and print the decision for each.
    Resolve,
    /// Write one snapshot (JSON on stdin) into rank's slot of an SLNS slot file.
    ShmWrite {
        path: PathBuf,
        #[arg(long)]
        dp_size: u16,
        #[arg(long)]
        rank: u32,
    },
    /// Read a polled load body from stdin (a `/v1/loads` JSON document, or a `/metrics` page) as
    /// the router's poller does, and print each rank's snapshot (core fields) as a JSON line, or
    /// one {"error": …} line.
    ParseLoads {
        #[arg(long, value_enum, default_value = "loads")]
        from: PolledBody,
    },
    /// Print every rank's slot of an SLNS slot file as JSON lines (null for an empty slot).
    ShmRead { path: PathBuf },
    /// Read token-id lists (JSON, one per line) and print each one's page hashes as a JSON list:
    /// the block hashes a KV-event stream publishes for those tokens from the root.
    PageHashes {
        #[arg(long, default_value_t = 1)]
        page_size: usize,
    },
    /// Read request bodies (JSON, one per line) and print the token ids the router prices each
    /// by, as `{"ids": […]}` (or `{"error": …}`): chat requests rendered by the model's chat
    /// template as the engine renders them. The interop suite compares these with transformers.
    PromptIds {
        /// A Hugging Face tokenizer.json or its directory (as `route --tokenizer`); without it,
        /// the simulated engine's tokenizer.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// The route the bodies are sent to.
        #[arg(long, default_value = "/v1/chat/completions")]
        path: String,
    },
    /// Subscribe to a publisher and print each message as a JSON line
    /// (`{"topic", "seq", "payload"}`, or `{"error", "reason"}` for a bad message).
    Listen {
        /// tcp://HOST:PORT of the publisher.
        endpoint: String,
        /// `snapshot` or `stat`: a load socket (either payload); `kv-batch`: a KV-event stream,
        /// each payload printed as [`kv_batch_to_json`] does.
        #[arg(long, value_enum, default_value = "snapshot")]
        kind: Kind,
        /// Stop after this many messages (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Stop after this many seconds (0: never).
        #[arg(long, default_value_t = 0.0, value_parser = crate::seconds::listen_timeout)]
        timeout: f64,
    },
}

pub fn run(cmd: WireCommand) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match cmd {
        WireCommand::Encode { kind } => each_line(&mut out, |line| {
            let v: Value = serde_json::from_str(line).context("input line is not JSON")?;
            Ok(hex(&encode(kind, &v)?))
        })?,
        WireCommand::Decode { kind } => {
            each_line(&mut out, |line| Ok(decode(kind, line).to_string()))?
        }
        WireCommand::Resolve => each_line(&mut out, |line| {
            let v: Value = serde_json::from_str(line).context("input line is not JSON")?;
            Ok(resolve_json(&v)?.to_string())
        })?,
        WireCommand::PageHashes { page_size } => each_line(&mut out, |line| {
            let tokens: Vec<u32> =
                serde_json::from_str(line).context("expected a JSON list of token ids")?;
            Ok(json!(page_hashes(&tokens, page_size.max(1))).to_string())
        })?,
        WireCommand::PromptIds { tokenizer, path } => {
            let tok = loadlink_router::cache::RouterTokenizer::load(tokenizer.as_deref())
                .map_err(anyhow::Error::msg)?;
            each_line(&mut out, |line| {
                Ok(
                    match loadlink_router::cache::prompt_ids(&path, line.as_bytes(), &tok) {
                        Ok(ids) => json!({ "ids": ids }),
                        Err(e) => json!({ "error": e }),
                    }
                    .to_string(),
                )
            })?
        }
        WireCommand::ShmWrite {
            path,
            dp_size,
            rank,
        } => shm_write(&path, dp_size, rank)?,
        WireCommand::ParseLoads { from } => {
            let mut body = String::new();
            std::io::stdin().lock().read_to_string(&mut body)?;
            for line in parse_loads(from, &body) {
                writeln!(out, "{line}")?;
            }
        }
        WireCommand::ShmRead { path } => {
            for slot in loadlink_publish::read_slots(&path)? {
                let v = slot.map_or(Value::Null, |b| load_json(&b));
                writeln!(out, "{v}")?;
            }
        }
        WireCommand::Listen {
            endpoint,
            kind,
            count,
            timeout,
        } => listen(&endpoint, kind, count, timeout, &mut out)?,
    }
    Ok(())
}

/// A polled body read by the router's parsers: one core dict per rank, or one error object.
fn parse_loads(from: PolledBody, body: &str) -> Vec<Value> {
    use loadlink_wire::loads::{Include, snapshot_dict};
    use loadlink_wire::polled::{loads_from_json, loads_from_metrics};
    let parsed = match from {
        PolledBody::Loads => loads_from_json(body.as_bytes()),
        PolledBody::Metrics => loads_from_metrics(body).map(|(_, s)| s),
    };
    let core = Include::parse(Some("core")).unwrap_or(Include::ALL);
    match parsed {
        Ok(snaps) => snaps.iter().map(|s| snapshot_dict(s, core)).collect(),
        Err(e) => vec![json!({ "error": e.to_string() })],
    }
}

/// Maps every non-empty stdin line to one output line.
fn each_line(out: &mut impl Write, mut f: impl FnMut(&str) -> Result<String>) -> Result<()> {
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if !line.trim().is_empty() {
            writeln!(out, "{}", f(line.trim())?)?;
        }
    }
    Ok(())
}

fn encode(kind: Kind, v: &Value) -> Result<Vec<u8>> {
    Ok(match kind {
        Kind::Snapshot => snapshot_bytes(&snapshot_from_dict(v).map_err(anyhow::Error::msg)?),
        Kind::Stat => stat_bytes(&stat_from_json(v)?),
        Kind::KvBatch => kv_batch_bytes(&kv_batch_from_json(v).map_err(anyhow::Error::msg)?),
    })
}

/// One hex payload as JSON, or `{"error": …}` naming what is wrong with it.
fn decode(kind: Kind, line: &str) -> Value {
    match (unhex(line), kind) {
        (Err(e), _) => json!({ "error": e }),
        (Ok(b), Kind::KvBatch) => match decode_kv_batch(&b) {
            Ok(batch) => kv_batch_to_json(&batch),
            Err(e) => json!({ "error": e.to_string() }),
        },
        (Ok(b), _) => load_json(&b),
    }
}

/// A load payload of either generation as JSON (or its error).
fn load_json(bytes: &[u8]) -> Value {
    match decode_payload(bytes) {
        Ok(p) => payload_json(&p),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn shm_write(path: &std::path::Path, dp_size: u16, rank: u32) -> Result<()> {
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)?;
    let snap = snapshot_from_dict(&serde_json::from_str(&input)?).map_err(anyhow::Error::msg)?;
    let mut sink = loadlink_publish::ShmSink::open(path, dp_size, rank, 1)?;
    let bytes = snapshot_bytes(&snap);
    let w = loadlink_publish::Encoded {
        snapshot: &snap,
        bytes: &bytes,
    };
    loadlink_publish::Sink::write(&mut sink, w)?;
    Ok(())
}

fn listen(
    endpoint: &str,
    kind: Kind,
    count: u64,
    timeout: f64,
    out: &mut impl Write,
) -> Result<()> {
    let ctx = zmq::Context::new();
    let sub = ctx.socket(zmq::SUB)?;
    sub.set_ipv6(endpoint.contains('['))?;
    sub.set_subscribe(b"")?;
    sub.set_rcvtimeo(100)?;
    sub.connect(endpoint)
        .with_context(|| format!("connecting to {endpoint}"))?;
    let deadline = (timeout > 0.0).then(|| Instant::now() + Duration::from_secs_f64(timeout));
    let mut seen = 0;
    while count == 0 || seen < count {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let frames = match sub.recv_multipart(0) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) => continue,
            Err(e) => bail!("receiving from {endpoint}: {e}"),
        };
        writeln!(out, "{}", message_json(kind, &frames))?;
        out.flush()?;
        seen += 1;
    }
    Ok(())
}

/// One received message as JSON: its topic, seq and decoded payload, or what is wrong with it.
fn message_json(kind: Kind, frames: &[Vec<u8>]) -> Value {
    let raw = match loadlink_wire::frame::split_frames(frames) {
        Ok(raw) => raw,
        Err(e) => return json!({ "error": e.to_string(), "reason": e.reason() }),
    };
    let payload = match kind {
        Kind::KvBatch => match decode_kv_batch(raw.payload) {
            Ok(batch) => kv_batch_to_json(&batch),
            Err(e) => return json!({ "error": e.to_string(), "seq": raw.seq }),
        },
        Kind::Snapshot | Kind::Stat => match decode_payload(raw.payload) {
            Ok(p) => payload_json(&p),
            Err(e) => {
                let e = loadlink_wire::FrameError::Payload(e);
                return json!({ "error": e.to_string(), "reason": e.reason() });
            }
        },
    };
    json!({ "topic": String::from_utf8_lossy(raw.topic), "seq": raw.seq, "payload": payload })
}

fn payload_json(p: &Payload) -> Value {
    match p {
        Payload::Snapshot(s) => {
            json!({ "type": "LoadSnapshot", "value": snapshot_dict(s, Include::ALL) })
        }
        Payload::Stat(s) => json!({ "type": "LoadStat", "value": {
            "num_running_reqs": s.num_running_reqs, "num_waiting_reqs": s.num_waiting_reqs,
            "num_tokens": s.num_tokens, "max_total_num_tokens": s.max_total_num_tokens,
            "attn_dp_rank": s.attn_dp_rank, "num_waiting_uncached_tokens": s.num_waiting_uncached_tokens,
            "num_total_tokens": s.num_total_tokens, "max_running_requests": s.max_running_requests,
            "total_prefill_uncached_tokens": s.total_prefill_uncached_tokens,
            "total_prefill_busy_us": s.total_prefill_busy_us,
        }}),
    }
}

fn stat_from_json(v: &Value) -> Result<LoadStat> {
    let f = |k: &str| -> Result<i64> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(0),
            Some(x) => x
                .as_i64()
                .with_context(|| format!("{k}: expected an integer")),
        }
    };
    Ok(LoadStat {
        num_running_reqs: f("num_running_reqs")?,
        num_waiting_reqs: f("num_waiting_reqs")?,
        num_tokens: f("num_tokens")?,
        max_total_num_tokens: f("max_total_num_tokens")?,
        attn_dp_rank: v.get("attn_dp_rank").and_then(Value::as_i64),
        num_waiting_uncached_tokens: f("num_waiting_uncached_tokens")?,
        num_total_tokens: f("num_total_tokens")?,
        max_running_requests: f("max_running_requests")?,
        total_prefill_uncached_tokens: f("total_prefill_uncached_tokens")?,
        total_prefill_busy_us: f("total_prefill_busy_us")?,
    })
}

fn resolve_json(v: &Value) -> Result<Value> {
    let s = |k: &str| v.get(k).and_then(Value::as_str);
    let kv = s("kv_endpoint").map(|e| KvEventsConfig {
        publisher: "zmq".into(),
        endpoint: e.into(),
        replay_endpoint: s("replay_endpoint").map(Into::into),
        ..Default::default()
    });
    let generation =
        Generation::parse(s("generation").unwrap_or("snapshot")).map_err(anyhow::Error::msg)?;
    let dp_size = v
        .get("dp_size")
        .and_then(Value::as_u64)
        .context("dp_size: expected a non-negative integer")?;
    let r = resolve_load_range(RangeRequest {
        kv: kv.as_ref(),
        dp_size: u32::try_from(dp_size).unwrap_or(u32::MAX),
        load_publish_endpoint: s("load_publish_endpoint"),
        generation,
    });
    Ok(match r {
        Ok(r) => json!({ "host": r.host, "base": r.base }),
        Err(d) => json!({ "declined": true, "reason": d.reason }),
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> std::result::Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("hex input has odd length {}", s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| format!("not hex at {i}")))
        .collect()
}
