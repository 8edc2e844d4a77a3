//! The SUB side of a load stream: how a socket is configured (shared by the router's ingest and by
//! `loadlink watch`), and a simple drain for one-socket consumers. The router's many-socket
//! receive loop is in [`crate::ingest`].
//!
//! Reconnect: libzmq retries a lost publisher every `RECONNECT_IVL_MS`, doubling up to
//! `RECONNECT_IVL_MAX_MS`. The cap is what makes a publisher that returns after an outage of any
//! length be used again within a second; its cost is one TCP connect attempt per dead rank per
//! `RECONNECT_IVL_MAX_MS` (see docs/router.md).

use loadlink_wire::FrameError;
use loadlink_wire::frame::{Message, decode_frames};

/// Largest accepted message; libzmq drops the connection of a peer that sends more.
pub const MAX_MSG_BYTES: i64 = 1 << 20;
/// First reconnect delay after a publisher is lost.
pub const RECONNECT_IVL_MS: i32 = 100;
/// Largest reconnect delay: bounds the time from a publisher's return to its next message.
pub const RECONNECT_IVL_MAX_MS: i32 = 500;
/// A TCP connect that has not completed by then is abandoned and retried (after the reconnect
/// interval) instead of waiting out the kernel's SYN back-off, which reaches minutes: a
/// publisher whose host drops SYNs, or whose accept queue overflowed in a reconnect storm of a
/// whole fleet, is dialled again within about 1.5 s.
pub const CONNECT_TIMEOUT_MS: i32 = 1000;
/// Messages libzmq queues per rank before it sheds (a gauge: the newest is what matters).
pub const RCVHWM: i32 = 1000;

/// Sets the router's bounds on `s` (message size, reconnect backoff, keepalive, receive
/// high-water mark, no linger), subscribes to `topic` (empty: every topic) and dials `endpoint`.
pub fn configure(s: &zmq::Socket, endpoint: &str, topic: &[u8]) -> zmq::Result<()> {
    configure_with_hwm(s, endpoint, topic, RCVHWM)
}

/// [`configure`] with a receive high-water mark of `rcvhwm` messages (the KV-event streams keep
/// a deeper queue: every batch matters there, only the newest snapshot does for load).
pub fn configure_with_hwm(
    s: &zmq::Socket,
    endpoint: &str,
    topic: &[u8],
    rcvhwm: i32,
) -> zmq::Result<()> {
    s.set_ipv6(endpoint.contains('['))?;
    s.set_maxmsgsize(MAX_MSG_BYTES)?;
    s.set_reconnect_ivl(RECONNECT_IVL_MS)?;
    s.set_reconnect_ivl_max(RECONNECT_IVL_MAX_MS)?;
    s.set_connect_timeout(CONNECT_TIMEOUT_MS)?;
    s.set_tcp_keepalive(1)?;
    s.set_tcp_keepalive_idle(30)?;
    s.set_rcvhwm(rcvhwm)?;
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
