//! Opening a worker's KV-event subscriptions: a slot per rank in the [`CacheBook`] and a connected
//! SUB per rank, handed together to an ingest thread ([`super::kv`]). Separate from the stream
//! logic because it runs on the caller's thread (the fleet's `add`), not the ingest's.

use crate::book::Worker;
use crate::cache::{CacheBook, Slot, StreamStats};
use crate::subscribe::{SocketBounds, configure_with};
use crate::zctx::FleetContext;
use loadlink_wire::discovery::KvStreams as Discovered;
use std::sync::Arc;

/// A SUB for a KV-event stream with `bounds` ([`SocketBounds::kv`]: every batch matters, so a
/// shed one is a gap, recovered by replay; the queue is as deep as the byte budget allows).
pub fn open_kv_sub(
    ctx: &FleetContext,
    endpoint: &str,
    topic: &[u8],
    bounds: SocketBounds,
) -> zmq::Result<zmq::Socket> {
    let s = ctx.sub_socket()?;
    configure_with(&s, endpoint, topic, bounds)?;
    Ok(s)
}

/// Registers `worker`'s streams in `book` and opens their SUBs with `bounds` (its replay DEALERs
/// get the same); on failure nothing stays registered and the error names the socket.
pub fn subscribe(
    book: &Arc<CacheBook>,
    ctx: &FleetContext,
    worker: &Arc<Worker>,
    streams: &Discovered,
    bounds: SocketBounds,
) -> Result<KvSubscription, String> {
    let ranks = u32::try_from(streams.endpoints.len()).unwrap_or(u32::MAX);
    let slots = book.register(worker, streams.block_size, ranks);
    let mut out = Vec::with_capacity(slots.len());
    for (ep, (slot, stats)) in streams.endpoints.iter().zip(slots) {
        match open_kv_sub(ctx, &ep.endpoint, streams.topic.as_bytes(), bounds) {
            Ok(sub) => out.push(KvSocket {
                rank: ep.rank,
                slot,
                sub,
                bounds,
                replay_endpoint: ep.replay_endpoint.clone(),
                stats,
            }),
            Err(e) => {
                book.unregister(worker);
                return Err(format!(
                    "cannot subscribe to rank {}'s KV-event socket {}: {e}",
                    ep.rank, ep.endpoint
                ));
            }
        }
    }
    Ok(KvSubscription {
        book: book.clone(),
        block_size: i64::try_from(streams.block_size).unwrap_or(i64::MAX),
        streams: out,
    })
}

/// One rank's KV stream, handed to an ingest thread.
pub struct KvSocket {
    pub rank: u32,
    pub slot: Slot,
    /// Connected and subscribed.
    pub sub: zmq::Socket,
    /// Its size bounds, which its replay DEALERs get too.
    pub bounds: SocketBounds,
    pub replay_endpoint: Option<String>,
    pub stats: Arc<StreamStats>,
}

/// A worker's KV streams and the book they feed.
pub struct KvSubscription {
    pub book: Arc<CacheBook>,
    /// The worker's advertised block size.
    pub block_size: i64,
    pub streams: Vec<KvSocket>,
}
