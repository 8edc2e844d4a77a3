//! Telling a connection libzmq refused from one that was lost, for a load socket that went
//! silent. libzmq drops the connection of a publisher that sends a message over
//! `ZMQ_MAXMSGSIZE` (a protocol error) and reports it only as `ZMQ_EVENT_DISCONNECTED`, like a
//! publisher that exited; the difference is what follows: after a lost connection libzmq schedules
//! a reconnect (`ZMQ_EVENT_CONNECT_RETRIED`, at once), after a protocol error it does not.
//!
//! A monitor costs two sockets and their descriptors, so a load socket gets one only while it is
//! silent and redialled by the sweep ([`super::REDIAL_AFTER`]): a disconnect that no reconnect
//! follows within [`GRACE`] is a refusal (an oversized message, or a malformed frame header,
//! which libzmq treats alike). The watch ends as soon as the socket delivers again or libzmq
//! retries (a lost publisher), so healthy and merely dead publishers hold no monitor for long; a
//! thread holds at most [`MAX_WATCHES`] at once.

use super::epoll::Epoll;
use crate::zctx::FleetContext;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Epoll tokens of monitor sockets: this bit | slot index.
pub const WATCH_TAG: u64 = 1 << 60;
/// Monitors one ingest thread holds at once (two sockets and up to four descriptors each, within
/// the fleet's reserve): beyond it a silent socket is redialled unwatched.
pub const MAX_WATCHES: usize = 32;
/// A disconnect not followed by a reconnect attempt within this is a refusal.
pub const GRACE: Duration = Duration::from_secs(1);

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A monitor on one load socket.
pub struct Watch {
    pair: zmq::Socket,
    fd: RawFd,
    dropped_at: Option<Instant>,
}

/// What the events read so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// Nothing conclusive yet.
    Pending,
    /// libzmq is redialling: the publisher was lost, not refused; stop watching.
    Lost,
}

impl Watch {
    /// Starts monitoring `s`'s connection events, readable in `epoll` as `WATCH_TAG | slot`.
    pub fn start(
        ctx: &FleetContext,
        s: &zmq::Socket,
        epoll: &Epoll,
        slot: usize,
    ) -> zmq::Result<Self> {
        let ep = format!("inproc://loadlink-watch-{}", NEXT.fetch_add(1, Relaxed));
        let events = zmq::SocketEvent::DISCONNECTED as i32
            | zmq::SocketEvent::CONNECT_RETRIED as i32
            | zmq::SocketEvent::CONNECTED as i32;
        s.monitor(&ep, events)?;
        let pair = ctx.pair_socket()?;
        pair.set_linger(0)?;
        pair.connect(&ep)?;
        let fd = pair.get_fd()?;
        epoll
            .add(fd, WATCH_TAG | slot as u64)
            .map_err(|_| zmq::Error::EINVAL)?;
        let mut w = Watch {
            pair,
            fd,
            dropped_at: None,
        };
        // libzmq signals a reader only after a read found its pipe empty: arm it.
        w.read();
        Ok(w)
    }

    /// Reads the queued events.
    pub fn read(&mut self) -> Seen {
        loop {
            match self.pair.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => {
                    let Some(event) = frames
                        .first()
                        .and_then(|f| f.get(..2))
                        .map(|b| u16::from_ne_bytes([b[0], b[1]]) as u32)
                    else {
                        continue;
                    };
                    if event == zmq_sys::ZMQ_EVENT_DISCONNECTED {
                        self.dropped_at = Some(Instant::now());
                    } else if event == zmq_sys::ZMQ_EVENT_CONNECT_RETRIED {
                        return Seen::Lost;
                    } else {
                        self.dropped_at = None;
                    }
                }
                Err(zmq::Error::EAGAIN) if super::drain::readable(&self.pair) => continue,
                Err(_) => return Seen::Pending,
            }
        }
    }

    /// Whether a disconnect went unanswered for [`GRACE`] (then it is counted once).
    pub fn refused(&mut self) -> bool {
        match self.dropped_at {
            Some(t) if t.elapsed() >= GRACE => {
                self.dropped_at = None;
                true
            }
            _ => false,
        }
    }

    /// Stops monitoring `s` and closes the monitor.
    pub fn stop(self, s: &mut zmq::Socket, epoll: &Epoll) {
        epoll.remove(self.fd);
        // SAFETY: `s` is a live socket owned by this thread; a null endpoint stops its monitor.
        unsafe { zmq_sys::zmq_socket_monitor(s.as_mut_ptr(), std::ptr::null(), 0) };
    }
}
