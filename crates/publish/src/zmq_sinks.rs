//! The two ZeroMQ sinks. `PushSink` feeds the one in-engine PULL owner (multi-node DP); `PubSink`
//! is the router-facing socket any number of routers subscribe to. Neither ever blocks the
//! scheduler: PUSH sends non-blocking with CONFLATE, PUB sheds at a small high-water mark
//! (CONFLATE cannot be used with three-frame messages).

use crate::sink::{Encoded, Sink, SinkError, WriteOutcome};
use loadlink_wire::codec::encode_stat;
use loadlink_wire::endpoint::TcpEndpoint;
use loadlink_wire::frame::seq_frame;
use loadlink_wire::{Generation, LoadStat};
use std::time::{Duration, Instant};

/// SGLang's load PUB high-water mark: a gauge's backlog is worthless, keep it tiny.
pub const PUB_SNDHWM: i32 = 8;
/// Generation B re-sends an unchanged stat at most this often.
pub const STAT_HEARTBEAT: Duration = Duration::from_secs(1);

fn wants_ipv6(endpoint: &str) -> bool {
    TcpEndpoint::parse(endpoint)
        .map(|e| e.is_ipv6())
        .unwrap_or(false)
}

fn outcome(r: zmq::Result<()>) -> Result<WriteOutcome, SinkError> {
    match r {
        Ok(()) => Ok(WriteOutcome::Sent),
        Err(zmq::Error::EAGAIN) => Ok(WriteOutcome::Dropped),
        Err(e) => Err(e.into()),
    }
}

/// PUSH to the in-engine PULL owner: single frame, CONFLATE 1, LINGER 0, non-blocking.
pub struct PushSink {
    socket: Option<zmq::Socket>,
    rank: i64,
    interval: u32,
}

impl PushSink {
    pub fn connect(
        ctx: &zmq::Context,
        endpoint: &str,
        rank: u32,
        interval: u32,
    ) -> Result<Self, SinkError> {
        let socket = ctx.socket(zmq::PUSH)?;
        socket.set_ipv6(wants_ipv6(endpoint))?;
        socket.set_linger(0)?;
        socket.set_conflate(true)?;
        socket.connect(endpoint)?;
        Ok(PushSink {
            socket: Some(socket),
            rank: rank as i64,
            interval: interval.max(1),
        })
    }
}

impl Sink for PushSink {
    fn name(&self) -> &'static str {
        "push"
    }
    fn interval(&self) -> u32 {
        self.interval
    }
    fn internal(&self) -> bool {
        true
    }
    fn write(&mut self, snap: Encoded<'_>) -> Result<WriteOutcome, SinkError> {
        if snap.snapshot.dp_rank != self.rank {
            return Err(SinkError::WrongRank {
                expected: self.rank,
                got: snap.snapshot.dp_rank,
            });
        }
        let s = self.socket.as_ref().ok_or(SinkError::Closed)?;
        outcome(s.send(snap.bytes, zmq::DONTWAIT))
    }
    fn close(&mut self) {
        self.socket = None;
    }
}

/// The router-facing PUB: binds only, three frames, seq from 0 per socket.
pub struct PubSink {
    socket: Option<zmq::Socket>,
    endpoint: String,
    generation: Generation,
    rank: i64,
    interval: u32,
    seq: i64,
    heartbeat: Duration,
    last_stat: Option<(LoadStat, Instant)>,
    stat_buf: Vec<u8>,
}

impl PubSink {
    /// Binds `endpoint`, which must have a wildcard host: a concrete host would mean connect, and
    /// a connected load PUB publishes into nothing.
    pub fn bind(
        ctx: &zmq::Context,
        endpoint: &str,
        generation: Generation,
        rank: u32,
        interval: u32,
    ) -> Result<Self, SinkError> {
        let ep = TcpEndpoint::parse(endpoint).map_err(|e| SinkError::Config(e.to_string()))?;
        if !ep.is_wildcard() {
            return Err(SinkError::Config(format!(
                "{endpoint:?}: a load PUB only binds a wildcard host (*, 0.0.0.0 or [::]); a concrete host would be connected to and reach no router"
            )));
        }
        let socket = ctx.socket(zmq::PUB)?;
        socket.set_sndhwm(PUB_SNDHWM)?;
        socket.set_linger(0)?;
        socket.set_ipv6(ep.is_ipv6())?;
        socket.bind(endpoint)?;
        Ok(PubSink {
            socket: Some(socket),
            endpoint: endpoint.to_string(),
            generation,
            rank: rank as i64,
            interval: interval.max(1),
            seq: 0,
            heartbeat: STAT_HEARTBEAT,
            last_stat: None,
            stat_buf: Vec::with_capacity(64),
        })
    }

    /// Changes generation B's unchanged-stat heartbeat (default 1 s).
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sequence number of the next message.
    pub fn next_seq(&self) -> i64 {
        self.seq
    }

    fn send3(
        &mut self,
        topic: &[u8],
        payload_is_stat: bool,
        snapshot_bytes: &[u8],
    ) -> Result<WriteOutcome, SinkError> {
        let s = self.socket.as_ref().ok_or(SinkError::Closed)?;
        let payload = if payload_is_stat {
            &self.stat_buf[..]
        } else {
            snapshot_bytes
        };
        let seq = seq_frame(self.seq);
        // PUB never blocks; it sheds at HWM per subscriber pipe without telling the sender.
        s.send(topic, zmq::SNDMORE | zmq::DONTWAIT)?;
        s.send(&seq[..], zmq::SNDMORE | zmq::DONTWAIT)?;
        let r = outcome(s.send(payload, zmq::DONTWAIT));
        if matches!(r, Ok(WriteOutcome::Sent)) {
            self.seq += 1;
        }
        r
    }
}

impl Sink for PubSink {
    fn name(&self) -> &'static str {
        "pub"
    }
    fn interval(&self) -> u32 {
        self.interval
    }
    fn internal(&self) -> bool {
        false
    }

    fn write(&mut self, snap: Encoded<'_>) -> Result<WriteOutcome, SinkError> {
        match self.generation {
            Generation::Snapshot => self.send3(Generation::Snapshot.topic(), false, snap.bytes),
            Generation::LoadStat => {
                let stat = LoadStat::from_snapshot(snap.snapshot, self.rank);
                let now = Instant::now();
                if let Some((last, at)) = &self.last_stat
                    && *last == stat
                    && now.duration_since(*at) < self.heartbeat
                {
                    return Ok(WriteOutcome::Skipped);
                }
                self.stat_buf.clear();
                encode_stat(&stat, &mut self.stat_buf);
                let r = self.send3(Generation::LoadStat.topic(), true, &[]);
                if matches!(r, Ok(WriteOutcome::Sent)) {
                    self.last_stat = Some((stat, now));
                }
                r
            }
        }
    }

    fn close(&mut self) {
        self.socket = None;
    }
}
