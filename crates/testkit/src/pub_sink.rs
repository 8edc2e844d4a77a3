//! The PUB side of a load stream when a test plays the engine: a real [`PubSink`] bound the way a
//! dp-1 engine's rank 0 binds its load socket, so the test controls what is published and when.

use loadlink_publish::{PubSink, SinkError};
use loadlink_wire::Generation;

/// A generation-A (`LoadSnapshot`) PUB sink on every interface at `port`, rank 0, writing every
/// cycle. A `Result`, so a test that rebinds a port libzmq is still releasing can retry.
pub fn snapshot_pub(ctx: &zmq::Context, port: u16) -> Result<PubSink, SinkError> {
    PubSink::bind(ctx, &format!("tcp://*:{port}"), Generation::Snapshot, 0, 1)
}
