//! `loadlink watch`: subscribe to engines' load sockets and show them live.
//!
//! Targets are worker URLs (discovered through `/server_info`, exactly as the router does) or
//! `tcp://HOST:PORT` load endpoints. Both wire generations are decoded. `--json` prints one line
//! per message for scripts instead of the table.

use anyhow::{Context, Result, bail};
use clap::Args;
use loadlink_wire::descriptor::parse_server_info;
use loadlink_wire::frame::decode_frames;
use loadlink_wire::{LoadSnapshot, Payload};
use serde_json::json;
use std::io::Write;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct WatchArgs {
    /// Worker URLs (http://HOST:PORT, discovered via /server_info) or load endpoints (tcp://HOST:PORT).
    #[arg(required = true)]
    targets: Vec<String>,
    /// Print one JSON line per message instead of the live table.
    #[arg(long)]
    json: bool,
    /// Table refresh period (ms).
    #[arg(long, default_value_t = 500)]
    refresh_ms: u64,
    /// Stop after this many seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 0.0)]
    duration: f64,
}

struct Row {
    label: String,
    socket: zmq::Socket,
    last: Option<LoadSnapshot>,
    seq: i64,
    received: u64,
    dropped: u64,
    at: Option<Instant>,
}

fn endpoints_of(target: &str) -> Result<Vec<(String, String)>> {
    if target.starts_with("tcp://") {
        return Ok(vec![(target.to_string(), target.to_string())]);
    }
    let url = target.trim_end_matches('/');
    let host = url.split("://").nth(1).map(|r| {
        if r.starts_with('[') {
            r.split(']').next().unwrap_or(r).to_string() + "]"
        } else {
            r.rsplit_once(':').map_or(r, |(h, _)| h).to_string()
        }
    });
    let host =
        host.with_context(|| format!("{target}: expected http://HOST:PORT or tcp://HOST:PORT"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let body = rt
        .block_on(async {
            reqwest::Client::new()
                .get(format!("{url}/server_info"))
                .timeout(Duration::from_secs(5))
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await
        })
        .with_context(|| format!("{url}: GET /server_info"))?;
    let desc = parse_server_info(&body).with_context(|| url.to_string())?;
    let Some(desc) = desc else {
        bail!(
            "{url} has no KV-events publisher (kv_events is null), so it publishes no load; start it with --kv-events-config"
        );
    };
    let eps = desc.load_endpoints(&host);
    if eps.is_empty() {
        let why = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("load_publish_decline_reason")
                    .and_then(|r| r.as_str())
                    .map(|r| format!(": {r}"))
            })
            .unwrap_or_else(|| {
                " (its --load-publish-endpoint is off, or the range was declined)".into()
            });
        bail!("{url} advertises no load_endpoint_port_base, so it does not report load{why}");
    }
    Ok(eps
        .into_iter()
        .map(|e| (format!("{url} rank {}", e.rank), e.endpoint))
        .collect())
}

pub fn run(a: WatchArgs) -> Result<()> {
    let ctx = zmq::Context::new();
    let mut rows = Vec::new();
    for t in &a.targets {
        for (label, ep) in endpoints_of(t)? {
            let s = ctx.socket(zmq::SUB)?;
            s.set_ipv6(ep.contains('['))?;
            s.set_subscribe(b"")?;
            s.set_maxmsgsize(1 << 20)?;
            s.connect(&ep)
                .with_context(|| format!("connecting to {ep}"))?;
            rows.push(Row {
                label,
                socket: s,
                last: None,
                seq: -1,
                received: 0,
                dropped: 0,
                at: None,
            });
        }
    }
    let end = (a.duration > 0.0).then(|| Instant::now() + Duration::from_secs_f64(a.duration));
    let mut next_draw = Instant::now();
    let mut out = std::io::stdout().lock();
    while end.is_none_or(|e| Instant::now() < e) {
        let mut items: Vec<zmq::PollItem> = rows
            .iter()
            .map(|r| r.socket.as_poll_item(zmq::POLLIN))
            .collect();
        zmq::poll(&mut items, 100)?;
        drop(items);
        for r in rows.iter_mut() {
            while let Ok(frames) = r.socket.recv_multipart(zmq::DONTWAIT) {
                match decode_frames(&frames) {
                    Ok(m) => {
                        if a.json {
                            let kind = matches!(m.payload, Payload::Stat(_))
                                .then_some("LoadStat")
                                .unwrap_or("LoadSnapshot");
                            let snap = m.payload.into_snapshot();
                            let v = json!({"target": r.label, "seq": m.seq, "type": kind, "load": loadlink_wire::loads::snapshot_dict(&snap, loadlink_wire::loads::Include::ALL)});
                            writeln!(out, "{v}")?;
                        } else {
                            r.last = Some(m.payload.into_snapshot());
                        }
                        r.seq = m.seq;
                        r.received += 1;
                        r.at = Some(Instant::now());
                    }
                    Err(e) => {
                        r.dropped += 1;
                        if a.json {
                            writeln!(
                                out,
                                "{}",
                                json!({"target": r.label, "error": e.to_string(), "reason": e.reason()})
                            )?;
                        }
                    }
                }
            }
        }
        if !a.json && Instant::now() >= next_draw {
            next_draw = Instant::now() + Duration::from_millis(a.refresh_ms);
            let mut s = String::from("\x1b[H\x1b[2J");
            s.push_str(&format!(
                "{:<40} {:>7} {:>7} {:>6} {:>9} {:>8} {:>8} {:>8}\n",
                "target", "running", "waiting", "KV%", "tok/s", "seq", "msgs", "age"
            ));
            for r in &rows {
                let age = r.at.map_or("never".to_string(), |t| {
                    format!("{}ms", t.elapsed().as_millis())
                });
                match &r.last {
                    Some(x) => s.push_str(&format!(
                        "{:<40} {:>7} {:>7} {:>5.1}% {:>9.0} {:>8} {:>8} {:>8}\n",
                        r.label,
                        x.num_running_reqs,
                        x.num_waiting_reqs,
                        x.token_usage() * 100.0,
                        x.gen_throughput(),
                        r.seq,
                        r.received,
                        age
                    )),
                    None => s.push_str(&format!(
                        "{:<40} {:>7} {:>7} {:>6} {:>9} {:>8} {:>8} {:>8}\n",
                        r.label, "-", "-", "-", "-", "-", r.received, age
                    )),
                }
                if r.dropped > 0 {
                    s.push_str(&format!(
                        "{:<40} ({} malformed frames dropped)\n",
                        "", r.dropped
                    ));
                }
            }
            s.push_str("\nCtrl-C to stop.\n");
            out.write_all(s.as_bytes())?;
        }
        out.flush()?;
    }
    Ok(())
}
