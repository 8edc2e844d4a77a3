//! The SUB side of a load stream: how a socket is configured (shared by the router's ingest and by
//! `loadlink watch`), and a simple drain for one-socket consumers. The router's many-socket
//! receive loop is in [`crate::ingest`].
//!
//! Reconnect: libzmq retries a lost publisher every `RECONNECT_IVL_MS`, doubling up to
//! `RECONNECT_IVL_MAX_MS`. The cap is what makes a publisher that returns after an outage of any
//! length be used again within a second; its cost is one TCP connect attempt per dead rank per
//! `RECONNECT_IVL_MAX_MS` (see docs/router.md).

use crate::budget::Budgets;
use loadlink_wire::FrameError;
use loadlink_wire::frame::{Message, decode_frames};

/// First reconnect delay after a publisher is lost.
pub const RECONNECT_IVL_MS: i32 = 100;
/// Largest reconnect delay: bounds the time from a publisher's return to its next message.
pub const RECONNECT_IVL_MAX_MS: i32 = 500;
/// A TCP connect that has not completed by then is abandoned and retried (after the reconnect
/// interval) instead of waiting out the kernel's SYN back-off, which reaches minutes: a
/// publisher whose host drops SYNs, or whose accept queue overflowed in a reconnect storm of a
/// whole fleet, is dialled again within about 1.5 s.
pub const CONNECT_TIMEOUT_MS: i32 = 1000;

/// What one subscription socket may hold: its largest message and how many messages it queues.
///
/// libzmq counts its receive queue in messages, not bytes, so the byte bound is the product:
/// [`SocketBounds::for_budget`] picks the high-water mark so that `max_message_bytes × rcvhwm`
/// stays within the per-socket byte budget. A peer that sends a larger message is not queued:
/// libzmq drops that connection (and reconnects) before allocating the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBounds {
    /// `ZMQ_MAXMSGSIZE`.
    pub max_message_bytes: usize,
    /// `ZMQ_RCVHWM`, in messages.
    pub rcvhwm: i32,
}

impl SocketBounds {
    /// Messages of at most `max_message_bytes`, queued within `budgets.socket_queue_bytes`.
    pub fn for_budget(budgets: &Budgets, max_message_bytes: usize) -> Self {
        SocketBounds {
            max_message_bytes: max_message_bytes.max(1),
            rcvhwm: budgets.rcvhwm(max_message_bytes),
        }
    }

    /// A load stream's bounds (a load message is under 200 bytes; only the newest matters).
    pub fn load(budgets: &Budgets) -> Self {
        Self::for_budget(budgets, budgets.load_message_bytes)
    }

    /// A KV-event stream's bounds, live SUB and replay DEALER alike.
    pub fn kv(budgets: &Budgets) -> Self {
        Self::for_budget(budgets, budgets.kv_message_bytes)
    }

    /// The most bytes a socket with these bounds may queue.
    pub fn queue_bytes(&self) -> u64 {
        self.max_message_bytes as u64 * self.rcvhwm.max(0) as u64
    }

    /// Sets `ZMQ_MAXMSGSIZE` and `ZMQ_RCVHWM` on `s` (before it connects).
    pub fn apply(&self, s: &zmq::Socket) -> zmq::Result<()> {
        s.set_maxmsgsize(i64::try_from(self.max_message_bytes).unwrap_or(i64::MAX))?;
        s.set_rcvhwm(self.rcvhwm)
    }
}

/// Sets the router's load-stream bounds (default budgets) on `s`, subscribes to `topic` (empty:
/// every topic) and dials `endpoint`.
pub fn configure(s: &zmq::Socket, endpoint: &str, topic: &[u8]) -> zmq::Result<()> {
    configure_with(s, endpoint, topic, SocketBounds::load(&Budgets::default()))
}

/// Sets `bounds` (message size, receive high-water mark) and the router's other options
/// (reconnect backoff, connect timeout, keepalive, no linger) on `s`, subscribes to `topic` and
/// dials `endpoint`.
pub fn configure_with(
    s: &zmq::Socket,
    endpoint: &str,
    topic: &[u8],
    bounds: SocketBounds,
) -> zmq::Result<()> {
    s.set_ipv6(endpoint.contains('['))?;
    bounds.apply(s)?;
    s.set_reconnect_ivl(RECONNECT_IVL_MS)?;
    s.set_reconnect_ivl_max(RECONNECT_IVL_MAX_MS)?;
    s.set_connect_timeout(CONNECT_TIMEOUT_MS)?;
    s.set_tcp_keepalive(1)?;
    s.set_tcp_keepalive_idle(30)?;
    s.set_linger(0)?;
    s.set_subscribe(topic)?;
    s.connect(endpoint)
}

/// A SUB socket from `ctx` dialing `endpoint` for `topic`, configured by [`configure`].
pub fn open(ctx: &zmq::Context, endpoint: &str, topic: &[u8]) -> zmq::Result<zmq::Socket> {
    let s = ctx.socket(zmq::SUB)?;
    configure(&s, endpoint, topic)?;
    Ok(s)
}

/// Waits up to `timeout_ms` for messages; says which of `sockets` are readable.
pub fn wait_readable<'a>(
    sockets: impl IntoIterator<Item = &'a zmq::Socket>,
    timeout_ms: i64,
) -> zmq::Result<Vec<bool>> {
    let mut items: Vec<zmq::PollItem> = sockets
        .into_iter()
        .map(|s| s.as_poll_item(zmq::POLLIN))
        .collect();
    zmq::poll(&mut items, timeout_ms)?;
    Ok(items.iter().map(zmq::PollItem::is_readable).collect())
}

/// Decodes every message queued on `socket`, oldest first, without blocking.
pub fn drain(socket: &zmq::Socket, mut each: impl FnMut(Result<Message, FrameError>)) {
    while let Ok(frames) = socket.recv_multipart(zmq::DONTWAIT) {
        each(decode_frames(&frames));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queues_stay_within_the_byte_budget() {
        let b = Budgets::default();
        for bounds in [SocketBounds::load(&b), SocketBounds::kv(&b)] {
            assert!(
                bounds.queue_bytes() <= b.socket_queue_bytes as u64,
                "{bounds:?}"
            );
            assert!(bounds.rcvhwm >= 1);
        }
        assert_eq!(SocketBounds::load(&b).max_message_bytes, 64 << 10);
        assert_eq!(SocketBounds::kv(&b).max_message_bytes, 1 << 20);
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::SUB).unwrap();
        configure_with(&s, "tcp://127.0.0.1:9", b"", SocketBounds::load(&b)).unwrap();
        assert_eq!(s.get_maxmsgsize().unwrap(), 64 << 10);
        assert_eq!(s.get_rcvhwm().unwrap(), SocketBounds::load(&b).rcvhwm);
    }
}
