//! The request path's match against the index: for each candidate, the longest run of a request's
//! chain its rank (or any rank of a whole worker) holds, at one block size at a time. Apart from
//! the book's registration and ingest (`book.rs`) because it is the one read that runs per request:
//! one read lock, a thread-local scratch that only grows, no allocation in steady state.

use super::approx_slots::key;
use super::book::{CacheBook, WorkerEntry};
use super::index::Slot;
use crate::candidate::Candidates;
use std::cell::RefCell;

/// Reused buffers of [`CacheBook::cached_tokens`], one set per thread.
#[derive(Default)]
struct Scratch {
    matches: Vec<(Slot, u32)>,
    depth: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl CacheBook {
    /// For each candidate (in order), how many of the request's prompt tokens are cached there: the
    /// longest run of `chain` (the prompt's page hashes, `page_size` tokens each) held by its rank
    /// (a whole worker: by any of its ranks), in tokens; 0 without a stream or when its worker
    /// pages by another size. `out` is overwritten; steady state allocates nothing.
    pub fn cached_tokens(
        &self,
        targets: Candidates<'_>,
        chain: &[i64],
        page_size: u64,
        out: &mut Vec<u64>,
    ) {
        out.clear();
        out.resize(targets.len(), 0);
        self.cached_tokens_at(targets, chain, page_size, out);
    }

    /// [`CacheBook::cached_tokens`] for the candidates whose worker advertises `page_size` only:
    /// their entries of `out` (sized to `targets`) are written, the others left as they are, so
    /// one call per block size in the fleet fills every candidate.
    pub fn cached_tokens_at(
        &self,
        targets: Candidates<'_>,
        chain: &[i64],
        page_size: u64,
        out: &mut [u64],
    ) {
        if chain.is_empty() || targets.is_empty() || out.len() != targets.len() {
            return;
        }
        let g = self.read();
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            g.index.match_into(chain, &mut s.matches);
            if s.matches.is_empty() {
                return;
            }
            if s.depth.len() < g.next_slot as usize {
                s.depth.resize(g.next_slot as usize, 0);
            }
            for &(slot, held) in &s.matches {
                if let Some(d) = s.depth.get_mut(slot as usize) {
                    *d = held;
                }
            }
            // Candidates of one worker sit together: look its entry up once.
            let mut entry: Option<(u32, Option<&WorkerEntry>)> = None;
            for (i, o) in out.iter_mut().enumerate() {
                let c = targets.get(i);
                let e = match entry {
                    Some((w, e)) if w == c.worker => e,
                    _ => {
                        let w = &targets.workers()[c.worker as usize];
                        let e = g.workers.get(&key(w));
                        entry = Some((c.worker, e));
                        e
                    }
                };
                let Some(e) = e.filter(|e| e.block_size == page_size) else {
                    continue;
                };
                let held = match c.rank {
                    // Rank r's stream sits at index r ([`CacheBook::register`] gives ranks 0..n).
                    Some(r) => e
                        .ranks
                        .get(r as usize)
                        .map_or(0, |re| s.depth[re.slot as usize]),
                    None => e
                        .ranks
                        .iter()
                        .map(|re| s.depth[re.slot as usize])
                        .max()
                        .unwrap_or(0),
                };
                *o = u64::from(held) * page_size;
            }
            for &(slot, _) in &s.matches {
                if let Some(d) = s.depth.get_mut(slot as usize) {
                    *d = 0;
                }
            }
        });
    }
}
