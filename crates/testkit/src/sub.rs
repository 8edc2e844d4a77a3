//! libzmq sockets on the receiving side of a load stream. A SUB misses whatever was published
//! before its subscription reached the publisher (the slow-joiner problem), so a test first waits
//! for one message to arrive, and only then relies on the stream.

use crate::wait::wait_until_sync;
use loadlink_publish::{Encoded, Sink};
use loadlink_wire::LoadSnapshot;
use loadlink_wire::codec::snapshot_bytes;
use loadlink_wire::frame::decode_frames;

/// How long a socket may take to receive its first message.
const JOIN_SECS: u64 = 10;

/// A SUB on `endpoint`, subscribed to every topic, with a 50 ms receive timeout.
pub fn sub(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::SUB).expect("a SUB socket");
    s.set_subscribe(b"").expect("subscribe");
    s.set_rcvtimeo(50).expect("receive timeout");
    s.connect(endpoint).expect("connect the SUB");
    s
}

/// Receives the first message on `socket` (a SUB or a PULL with a receive timeout), calling
/// `poke` before each attempt (to publish once, say); panics after 10 s.
pub fn first_message(socket: &zmq::Socket, mut poke: impl FnMut()) -> Vec<Vec<u8>> {
    wait_until_sync("a first message", JOIN_SECS, || {
        poke();
        socket.recv_multipart(0)
    })
}

/// Writes `snap` through `sink` until `sub` receives a message; returns its frames.
pub fn publish_until_received(
    sink: &mut dyn Sink,
    sub: &zmq::Socket,
    snap: &LoadSnapshot,
) -> Vec<Vec<u8>> {
    let bytes = snapshot_bytes(snap);
    first_message(sub, || {
        sink.write(Encoded {
            snapshot: snap,
            bytes: &bytes,
        })
        .expect("the sink writes");
    })
}

/// A SUB on `endpoint` (its own context), returned once the first message, an engine's idle
/// heartbeat for instance, has arrived.
pub fn joined_sub(endpoint: &str) -> zmq::Socket {
    let s = sub(&zmq::Context::new(), endpoint);
    first_message(&s, || {});
    s
}

/// Every load message queued on `s` until a receive times out, decoded as snapshots; frames that
/// do not decode are skipped.
pub fn drain_snapshots(s: &zmq::Socket) -> Vec<LoadSnapshot> {
    let mut out = Vec::new();
    while let Ok(f) = s.recv_multipart(0) {
        if let Ok(m) = decode_frames(&f) {
            out.push(m.payload.into_snapshot());
        }
    }
    out
}
