//! The prefill side's rooms: for each `bootstrap_room`, the request here (if it has arrived),
//! the decode connection that registered it (if it has), and whether its prefill is done. The
//! transfer starts when all three hold (in whichever order they came): a task waits the transfer
//! time, sends `transferred` to the decode side and tells the rank to finish the request.
//!
//! A room with no request here, registered longer than the timeout ago, is swept with a
//! `failed` frame; a decode connection that closes fails the requests of its rooms. The table is
//! bounded ([`MAX_ROOMS`]); its lock is never held across an await.

use super::frame::Frame;
use super::{Outcome, PdConfig};
use crate::rank::Command;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

/// Rooms the table holds at most (requests and registrations together).
pub const MAX_ROOMS: usize = 65_536;

/// Why a room's request here failed (sent to its HTTP handler).
pub(crate) type Failure = (Outcome, String);

/// A decode engine's connection, as a room knows it.
#[derive(Clone)]
pub(crate) struct Peer {
    pub(crate) conn: u64,
    pub(crate) frames: UnboundedSender<Frame>,
}

struct Local {
    id: u64,
    commands: std::sync::mpsc::Sender<Command>,
    tokens: u64,
    prefilled_at: Option<Instant>,
    fail: Option<oneshot::Sender<Failure>>,
}

struct Room {
    local: Option<Local>,
    peer: Option<Peer>,
    since: Instant,
    transferring: bool,
}

/// The prefill side's table of rooms.
pub(crate) struct Rooms {
    table: Mutex<HashMap<u64, Room>>,
    cfg: PdConfig,
    time_scale: f64,
    outcomes: Arc<[AtomicU64; 3]>,
    /// Decode peers refused on the bootstrap port, by [`Refusal`].
    refused: [AtomicU64; 3],
}

/// Why the bootstrap server refused a decode peer (`loadlink_engine_pd_bootstrap_refused_total`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// More than `MAX_CONNECTIONS` connections at once: the new one is closed on accept.
    Connections = 0,
    /// A malformed, over-budget or unexpected frame: its connection is closed.
    Frame = 1,
    /// A registration the room table refused (room taken, or the table full).
    Register = 2,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 3] = [Refusal::Connections, Refusal::Frame, Refusal::Register];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Connections => "connections",
            Refusal::Frame => "frame",
            Refusal::Register => "register",
        }
    }
}

impl Rooms {
    /// Counts a refused decode peer; true on the first of its kind and every 1,000th after (the
    /// caller logs only then: a flood of them must not flood the log).
    pub(crate) fn refuse(&self, why: Refusal) -> bool {
        let n = self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        n.is_multiple_of(1000)
    }

    /// Decode peers refused so far, of kind `why`.
    pub(crate) fn refused(&self, why: Refusal) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn new(cfg: PdConfig, time_scale: f64, outcomes: Arc<[AtomicU64; 3]>) -> Self {
        Rooms {
            table: Mutex::new(HashMap::new()),
            cfg,
            time_scale: if time_scale > 0.0 { time_scale } else { 1.0 },
            outcomes,
            refused: Default::default(),
        }
    }

    fn count(&self, o: Outcome) {
        self.outcomes[o as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests here not yet transferred.
    pub(crate) fn requests(&self) -> usize {
        self.table
            .lock()
            .map_or(0, |t| t.values().filter(|r| r.local.is_some()).count())
    }

    /// Request `id` (on the rank behind `commands`) arrived for `room`. The receiver hears why
    /// it failed, if it does.
    pub(crate) fn add_request(
        &self,
        room: u64,
        id: u64,
        commands: std::sync::mpsc::Sender<Command>,
        tokens: u64,
    ) -> Result<oneshot::Receiver<Failure>, String> {
        let mut t = self.table.lock().map_err(|_| "room table poisoned")?;
        let entry = open_room(&mut t, room)?;
        if entry.local.is_some() {
            return Err(format!(
                "bootstrap_room {room} is already in use on this engine"
            ));
        }
        if entry.peer.is_some() {
            let _ = commands.send(Command::PeerRegistered(id));
        }
        let (tx, rx) = oneshot::channel();
        entry.local = Some(Local {
            id,
            commands,
            tokens,
            prefilled_at: None,
            fail: Some(tx),
        });
        Ok(rx)
    }

    /// Room `room`'s prefill is done: its KV waits for the transfer.
    pub(crate) fn prefilled(self: &Arc<Self>, room: u64) {
        let Ok(mut t) = self.table.lock() else {
            return;
        };
        if let Some(local) = t.get_mut(&room).and_then(|r| r.local.as_mut()) {
            local.prefilled_at = Some(Instant::now());
        }
        self.maybe_start(&mut t, room);
    }

    /// A decode connection registered `room`. Refused when another one already did, or the
    /// table is full.
    pub(crate) fn register(self: &Arc<Self>, room: u64, peer: Peer) -> Result<(), String> {
        let mut t = self.table.lock().map_err(|_| "room table poisoned")?;
        let entry = open_room(&mut t, room)?;
        if entry.peer.is_some() {
            return Err(format!("room {room} is already registered"));
        }
        entry.since = Instant::now();
        entry.peer = Some(peer);
        if let Some(l) = &entry.local {
            let _ = l.commands.send(Command::PeerRegistered(l.id));
        }
        self.maybe_start(&mut t, room);
        Ok(())
    }

    /// Whether a decode side has registered `room`.
    pub(crate) fn is_registered(&self, room: u64) -> bool {
        self.table
            .lock()
            .is_ok_and(|t| t.get(&room).is_some_and(|r| r.peer.is_some()))
    }

    fn maybe_start(self: &Arc<Self>, t: &mut HashMap<u64, Room>, room: u64) {
        let Some(r) = t.get_mut(&room) else {
            return;
        };
        let ready = r.local.as_ref().is_some_and(|l| l.prefilled_at.is_some());
        if !ready || r.peer.is_none() || r.transferring {
            return;
        }
        r.transferring = true;
        let tokens = r.local.as_ref().map_or(0, |l| l.tokens);
        let secs = self.cfg.transfer_secs(tokens) / self.time_scale;
        let wait = Duration::try_from_secs_f64(secs).unwrap_or(Duration::from_secs(3600));
        let rooms = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            rooms.complete(room);
        });
    }

    /// The transfer time of `room` has elapsed: tell both sides.
    fn complete(&self, room: u64) {
        let Some(r) = self.table.lock().ok().and_then(|mut t| t.remove(&room)) else {
            return;
        };
        let (Some(mut local), Some(peer)) = (r.local, r.peer) else {
            return;
        };
        let frame = Frame::Transferred {
            room,
            tokens: local.tokens,
            bytes: self.cfg.kv_bytes(local.tokens),
        };
        if peer.frames.send(frame).is_err() {
            self.fail(
                &mut local,
                Outcome::Failed,
                "the decode side's bootstrap connection closed before the KV was sent",
            );
            return;
        }
        let latency = local
            .prefilled_at
            .map_or(0.0, |t| t.elapsed().as_secs_f64() * self.time_scale);
        let _ = local.commands.send(Command::TransferDone {
            id: local.id,
            latency_s: latency,
        });
        self.count(Outcome::Transferred);
    }

    fn fail(&self, local: &mut Local, outcome: Outcome, reason: &str) {
        self.count(outcome);
        if let Some(tx) = local.fail.take() {
            let _ = tx.send((outcome, reason.to_string()));
        }
    }

    /// Request `id` of `room` is gone (failed, timed out or its client left): the room closes,
    /// and a registered decode side hears `failed` with `reason`.
    pub(crate) fn remove_request(&self, room: u64, id: u64, reason: &str) {
        let Ok(mut t) = self.table.lock() else {
            return;
        };
        let ours = t
            .get(&room)
            .and_then(|r| r.local.as_ref())
            .is_some_and(|l| l.id == id);
        if !ours {
            return;
        }
        if let Some(Room {
            peer: Some(peer), ..
        }) = t.remove(&room)
        {
            let _ = peer.frames.send(Frame::Failed {
                room,
                reason: reason.to_string(),
            });
        }
    }

    /// Decode connection `conn` closed: its rooms close, their requests here fail.
    pub(crate) fn peer_gone(&self, conn: u64) {
        let Ok(mut t) = self.table.lock() else {
            return;
        };
        let gone: Vec<u64> = t
            .iter()
            .filter(|(_, r)| r.peer.as_ref().is_some_and(|p| p.conn == conn))
            .map(|(k, _)| *k)
            .collect();
        for room in gone {
            if let Some(Room {
                local: Some(mut l), ..
            }) = t.remove(&room)
            {
                self.fail(
                    &mut l,
                    Outcome::Failed,
                    "the decode side's bootstrap connection closed before the KV was sent",
                );
            }
        }
    }

    /// Closes registrations whose request never arrived here within `timeout`.
    pub(crate) fn sweep(&self, timeout: Duration) {
        let Ok(mut t) = self.table.lock() else {
            return;
        };
        t.retain(|room, r| {
            let stale = r.local.is_none() && r.since.elapsed() > timeout;
            if stale && let Some(p) = &r.peer {
                let _ = p.frames.send(Frame::Failed {
                    room: *room,
                    reason: format!(
                        "no request for room {room} reached this prefill engine within {timeout:?}"
                    ),
                });
            }
            !stale
        });
    }
}

/// Room `room`'s entry, opened empty if it is new; refused when the table is full.
fn open_room(t: &mut HashMap<u64, Room>, room: u64) -> Result<&mut Room, String> {
    if t.len() >= MAX_ROOMS && !t.contains_key(&room) {
        return Err(format!("too many open rooms (at most {MAX_ROOMS})"));
    }
    Ok(t.entry(room).or_insert_with(|| Room {
        local: None,
        peer: None,
        since: Instant::now(),
        transferring: false,
    }))
}
