//! A live view of engines' load sockets: what `loadlink watch` shows.
//!
//! It lives in the router crate because it is the router's own machinery pointed at a terminal:
//! targets are discovered exactly as the router discovers workers ([`crate::fleet::discover`], so
//! both print the same reasons, the engine's decline reason included), sockets are opened and
//! drained by [`crate::subscribe`], and frames are decoded by `loadlink-wire`. The CLI only parses
//! flags. Both wire generations are decoded; malformed frames are counted (and, in JSON mode,
//! reported with their reason).

use crate::fleet::{discover, http_client};
use crate::subscribe::{drain, open, wait_readable};
use loadlink_wire::discovery::{WorkerUrlError, worker_url};
use loadlink_wire::frame::Message;
use loadlink_wire::loads::{Include, snapshot_dict};
use loadlink_wire::{FrameError, LoadSnapshot, Payload};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::io::{self, Write};
use std::time::{Duration, Instant};

/// How long one poll waits for messages before the view checks its clock.
const POLL_MS: i64 = 100;

/// One load socket to watch and the label it is shown under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedSocket {
    pub label: String,
    pub endpoint: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("{0} (or a load endpoint tcp://HOST:PORT)")]
    Target(WorkerUrlError),
    #[error("{url}: {reason}")]
    NoLoad { url: String, reason: String },
    #[error("connecting to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: zmq::Error,
    },
    #[error("polling the load sockets: {0}")]
    Poll(zmq::Error),
    #[error("writing the view: {0}")]
    Output(#[from] io::Error),
}

/// The sockets behind `targets`: `tcp://` endpoints as given, worker URLs through discovery (one
/// attempt: a person is waiting). A worker without load sockets is an error that says why.
pub async fn resolve(targets: &[String]) -> Result<Vec<WatchedSocket>, WatchError> {
    let client = http_client();
    let mut sockets = Vec::new();
    for target in targets {
        if target.starts_with("tcp://") {
            sockets.push(WatchedSocket {
                label: target.clone(),
                endpoint: target.clone(),
            });
            continue;
        }
        let url = worker_url(target).map_err(WatchError::Target)?;
        let limits = crate::discovery::DiscoveryLimits::new(1, &Default::default());
        let found = discover(&client, &url, &limits).await;
        if let Some(reason) = found.no_load_reason {
            return Err(WatchError::NoLoad { url, reason });
        }
        sockets.extend(found.endpoints.into_iter().map(|e| WatchedSocket {
            label: format!("{url} rank {}", e.rank),
            endpoint: e.endpoint,
        }));
    }
    Ok(sockets)
}

/// What arrived on one watched socket.
#[derive(Debug)]
pub enum Event<'a> {
    Load {
        label: &'a str,
        seq: i64,
        /// `LoadSnapshot` (generation A) or `LoadStat` (generation B).
        kind: &'static str,
        snapshot: &'a LoadSnapshot,
    },
    Dropped {
        label: &'a str,
        error: FrameError,
    },
}

impl Event<'_> {
    /// The event as one JSON line for scripts.
    pub fn json(&self) -> Value {
        match self {
            Event::Load {
                label,
                seq,
                kind,
                snapshot,
            } => {
                json!({"target": label, "seq": seq, "type": kind, "load": snapshot_dict(snapshot, Include::ALL)})
            }
            Event::Dropped { label, error } => {
                json!({"target": label, "error": error.to_string(), "reason": error.reason()})
            }
        }
    }
}

/// How to show the view.
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    /// One JSON line per message instead of the live table.
    pub json: bool,
    /// Table refresh period.
    pub refresh: Duration,
    /// Stop after this long (`None`: never).
    pub duration: Option<Duration>,
}

/// One watched socket and what it last said.
struct Row {
    socket: zmq::Socket,
    seen: Seen,
}

/// What a watched socket last said, and how much.
struct Seen {
    label: String,
    last: Option<LoadSnapshot>,
    seq: i64,
    received: u64,
    dropped: u64,
    at: Option<Instant>,
}

impl Seen {
    /// Takes in one decoded (or rejected) message and describes it.
    fn take(&mut self, m: Result<Message, FrameError>) -> Event<'_> {
        match m {
            Ok(m) => {
                let kind = match m.payload {
                    Payload::Stat(_) => "LoadStat",
                    _ => "LoadSnapshot",
                };
                (self.seq, self.received, self.at) =
                    (m.seq, self.received + 1, Some(Instant::now()));
                let snapshot = self.last.insert(m.payload.into_snapshot());
                Event::Load {
                    label: &self.label,
                    seq: m.seq,
                    kind,
                    snapshot,
                }
            }
            Err(error) => {
                self.dropped += 1;
                Event::Dropped {
                    label: &self.label,
                    error,
                }
            }
        }
    }

    /// This row of the table (and a second line when frames were dropped).
    fn render(&self, s: &mut String) {
        let age = self.at.map_or("never".to_string(), |t| {
            format!("{}ms", t.elapsed().as_millis())
        });
        let _ = match &self.last {
            Some(x) => writeln!(
                s,
                "{:<40} {:>7} {:>7} {:>5.1}% {:>5.1}% {:>9.0} {:>8} {:>8} {:>8}",
                self.label,
                x.num_running_reqs,
                x.num_waiting_reqs,
                x.token_usage() * 100.0,
                x.cache_hit_rate() * 100.0,
                x.gen_throughput(),
                self.seq,
                self.received,
                age
            ),
            None => writeln!(
                s,
                "{:<40} {:>7} {:>7} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8}",
                self.label, "-", "-", "-", "-", "-", "-", self.received, age
            ),
        };
        if self.dropped > 0 {
            let _ = writeln!(s, "{:<40} ({} malformed frames dropped)", "", self.dropped);
        }
    }
}

/// Subscriptions to a set of load sockets and what each last said.
pub struct LoadWatch {
    rows: Vec<Row>,
}

impl LoadWatch {
    /// Subscribes to every socket (all topics: a `tcp://` target's generation is not known).
    pub fn open(sockets: Vec<WatchedSocket>) -> Result<Self, WatchError> {
        let ctx = zmq::Context::new();
        let rows = sockets
            .into_iter()
            .map(|w| {
                let socket =
                    open(&ctx, &w.endpoint, b"").map_err(|source| WatchError::Connect {
                        endpoint: w.endpoint.clone(),
                        source,
                    })?;
                let seen = Seen {
                    label: w.label,
                    last: None,
                    seq: -1,
                    received: 0,
                    dropped: 0,
                    at: None,
                };
                Ok(Row { socket, seen })
            })
            .collect::<Result<_, WatchError>>()?;
        Ok(LoadWatch { rows })
    }

    /// Waits up to `timeout_ms` for messages and hands each to `on_event`, oldest first per socket.
    pub fn poll(
        &mut self,
        timeout_ms: i64,
        mut on_event: impl FnMut(Event<'_>) -> io::Result<()>,
    ) -> Result<(), WatchError> {
        let ready = wait_readable(self.rows.iter().map(|r| &r.socket), timeout_ms)
            .map_err(WatchError::Poll)?;
        let mut result = Ok(());
        for (row, _) in self.rows.iter_mut().zip(ready).filter(|(_, ready)| *ready) {
            drain(&row.socket, |m| {
                let event = row.seen.take(m);
                if result.is_ok() {
                    result = on_event(event);
                }
            });
        }
        Ok(result?)
    }

    /// The live table, as a full-screen redraw.
    pub fn screen(&self) -> String {
        let mut s = String::from("\x1b[H\x1b[2J");
        let _ = writeln!(
            s,
            "{:<40} {:>7} {:>7} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8}",
            "target", "running", "waiting", "KV%", "hit%", "tok/s", "seq", "msgs", "age"
        );
        for row in &self.rows {
            row.seen.render(&mut s);
        }
        s.push_str("\nCtrl-C to stop.\n");
        s
    }

    /// Shows the view on `out` until `opts.duration` has passed (or forever).
    pub fn run(&mut self, opts: &WatchOptions, out: &mut impl Write) -> Result<(), WatchError> {
        let end = opts.duration.map(|d| Instant::now() + d);
        let mut next_draw = Instant::now();
        while end.is_none_or(|e| Instant::now() < e) {
            self.poll(POLL_MS, |e| match opts.json {
                true => writeln!(out, "{}", e.json()),
                false => Ok(()),
            })?;
            if !opts.json && Instant::now() >= next_draw {
                next_draw = Instant::now() + opts.refresh;
                out.write_all(self.screen().as_bytes())?;
            }
            out.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loadlink_wire::codec::snapshot_bytes;
    use loadlink_wire::frame::seq_frame;

    #[tokio::test]
    async fn targets_resolve_or_say_why() {
        let tcp = resolve(&["tcp://127.0.0.1:5557".into()]).await.unwrap();
        assert_eq!(tcp[0].endpoint, "tcp://127.0.0.1:5557");
        let e = resolve(&["ftp://x".into()]).await.unwrap_err();
        assert!(e.to_string().contains("tcp://HOST:PORT"), "{e}");
    }

    #[test]
    fn messages_and_malformed_frames_reach_the_view() {
        let port = loadlink_publish::free_port_block(1).unwrap();
        let ctx = zmq::Context::new();
        let publisher = ctx.socket(zmq::PUB).unwrap();
        publisher.bind(&format!("tcp://127.0.0.1:{port}")).unwrap();
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let mut view = LoadWatch::open(vec![WatchedSocket {
            label: "r0".into(),
            endpoint,
        }])
        .unwrap();
        let load = snapshot_bytes(&LoadSnapshot {
            num_waiting_reqs: 4,
            cache_hit_rate: Some(0.625),
            ..Default::default()
        });
        let (mut loads, mut drops) = (Vec::new(), Vec::new());
        // PUB drops messages sent before the subscription lands: publish until both arrive.
        for seq in 0..100 {
            let s = seq_frame(seq);
            publisher.send_multipart([&b""[..], &s, &load], 0).unwrap();
            publisher.send_multipart([&b""[..], &load], 0).unwrap();
            view.poll(50, |e| {
                match e {
                    Event::Load { snapshot, .. } => loads.push(snapshot.num_waiting_reqs),
                    Event::Dropped { error, .. } => drops.push(error.reason()),
                }
                Ok(())
            })
            .unwrap();
            if !loads.is_empty() && !drops.is_empty() {
                break;
            }
        }
        assert_eq!(loads.first(), Some(&4));
        assert_eq!(drops.first(), Some(&"frame_count"));
        let screen = view.screen();
        assert!(
            screen.contains("r0")
                && screen.contains("hit%")
                && screen.contains(" 62.5%")
                && screen.contains("malformed frames dropped"),
            "{screen}"
        );
    }
}
