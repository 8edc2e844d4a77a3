//! One request's adapter on one worker, from dispatch to the end of its response: created when the
//! request is sent ([`AdapterBook::record_dispatch`]), dropped when its body ends, the client goes
//! or the attempt fails ([`AdapterBook::record_done`]), so the book knows which adapters have
//! requests in flight (an engine never evicts those) and how long requests take there.

use super::{AdapterBook, AdapterId};
use crate::book::Worker;
use std::sync::Arc;

/// See the module docs.
pub struct AdapterTicket {
    book: Arc<AdapterBook>,
    worker: Arc<Worker>,
    rank: Option<u32>,
    adapter: AdapterId,
    sent_ms: u64,
}

impl AdapterTicket {
    /// Records the dispatch of a request for `adapter` to `worker` (`rank`: the rank it was routed
    /// to, if any) at `now_ms`.
    pub fn dispatched(
        book: &Arc<AdapterBook>,
        worker: &Arc<Worker>,
        rank: Option<u32>,
        adapter: AdapterId,
        now_ms: u64,
    ) -> Self {
        book.record_dispatch(&worker.url, rank, adapter, now_ms);
        AdapterTicket {
            book: book.clone(),
            worker: worker.clone(),
            rank,
            adapter,
            sent_ms: now_ms,
        }
    }
}

impl Drop for AdapterTicket {
    fn drop(&mut self) {
        let now = self.worker.now_ms();
        self.book.record_done(
            &self.worker.url,
            self.rank,
            self.adapter,
            (self.sent_ms, now),
        );
    }
}
