//! A cut of a rank's prefix cache and its snapshot answer.
//!
//! Why the split: the engine must hold its scheduler lock while it copies the cache (so the copy
//! and the barrier seq agree), and nothing else. So the snapshot source only copies pages
//! `(hash, parent, medium)` into a [`CacheCut`]; ordering them parent-before-child, gathering
//! chains into records, chunking and encoding all happen here, on the replay thread, with no lock.

use loadlink_wire::kv_snapshot::{
    KIND_CHUNK, KIND_END, KIND_HEADER, SnapshotHeader, SnapshotRecord, chunk_records, encode_chunk,
    encode_end, encode_header,
};
use std::collections::HashMap;
use std::sync::Arc;

/// One cached page as the cache holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutPage {
    pub hash: i64,
    /// The page before it in its sequence; `None` at the root.
    pub parent: Option<i64>,
    /// The tier; `None` (or `"GPU"`) for device memory.
    pub medium: Option<&'static str>,
}

/// A rank's cache at a barrier: every page, and the last KV batch seq assigned before the copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheCut {
    pub replica_rank: u32,
    /// −1 when no batch was assigned a seq yet.
    pub barrier_seq: i64,
    pub page_size: u32,
    pub pages: Vec<CutPage>,
}

/// Makes a cut; called on the replay thread. `None`: no cut could be made (answered `error`).
pub type SnapshotSource = Arc<dyn Fn() -> Option<CacheCut> + Send + Sync>;

/// Device memory is the default tier: it travels as a record without a medium.
fn tier(medium: Option<&'static str>) -> Option<&'static str> {
    medium.filter(|m| *m != "GPU")
}

/// Orders `pages` parent-before-child and gathers each run of pages that chain onto one another
/// (same tier) into one record. A page whose parent is not in the cut cannot be placed (its
/// parent must come first) and is left out, with everything below it.
pub fn order_records(pages: &[CutPage]) -> Vec<SnapshotRecord> {
    let n = pages.len();
    // Where each hash is first listed (a page on two tiers appears twice; either is a parent).
    let mut at: HashMap<i64, u32> = HashMap::with_capacity(n);
    for (i, p) in pages.iter().enumerate() {
        at.entry(p.hash).or_insert(i as u32);
    }
    // Children by parent, as one flat list with offsets (no allocation per node).
    const ROOT: u32 = u32::MAX;
    let parent_of: Vec<u32> = pages
        .iter()
        .map(|p| match p.parent {
            None => ROOT,
            // An orphan hangs below a parent no one visits.
            Some(h) => at.get(&h).copied().unwrap_or(ROOT - 1),
        })
        .collect();
    let mut start = vec![0u32; n + 1];
    for &q in &parent_of {
        if (q as usize) < n {
            start[q as usize + 1] += 1;
        }
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut children = vec![0u32; start[n] as usize];
    let mut roots = Vec::new();
    for (i, &q) in parent_of.iter().enumerate() {
        match q {
            ROOT => roots.push(i as u32),
            q if (q as usize) < n => {
                children[fill[q as usize] as usize] = i as u32;
                fill[q as usize] += 1;
            }
            _ => {}
        }
    }
    // Depth first: after a page comes its first child, so a chain stays one record.
    let mut records: Vec<SnapshotRecord> = Vec::new();
    let mut stack: Vec<u32> = roots.into_iter().rev().collect();
    let mut last: Option<(i64, Option<&'static str>)> = None;
    while let Some(i) = stack.pop() {
        let p = pages[i as usize];
        let medium = tier(p.medium);
        let continues = matches!(
            (last, p.parent),
            (Some((h, m)), Some(parent)) if h == parent && m == medium
        );
        match records.last_mut() {
            Some(r) if continues => r.blocks.push(p.hash),
            _ => records.push(SnapshotRecord {
                parent: p.parent,
                blocks: vec![p.hash],
                medium: medium.map(str::to_owned),
            }),
        }
        last = Some((p.hash, medium));
        let kids = &children[start[i as usize] as usize..start[i as usize + 1] as usize];
        stack.extend(kids.iter().rev());
    }
    records
}

/// Every reply of one snapshot answer, `(kind, payload)` in sending order: header, chunks, end.
pub fn snapshot_replies(
    cut: &CacheCut,
    epoch: u64,
    barrier_id: u64,
) -> Vec<(&'static [u8], Vec<u8>)> {
    let chunks = chunk_records(order_records(&cut.pages));
    let records: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    let mut header = SnapshotHeader::new(
        epoch,
        cut.replica_rank,
        cut.barrier_seq,
        barrier_id,
        records,
        cut.page_size,
    );
    // A page size the source does not know is left out rather than sent as an invalid 0.
    header.page_size = header.page_size.filter(|&p| p > 0);
    let mut out = Vec::with_capacity(chunks.len() + 2);
    let mut h = Vec::with_capacity(160);
    encode_header(&header, &mut h);
    out.push((KIND_HEADER, h));
    for c in &chunks {
        let blocks: usize = c.iter().map(|r| r.blocks.len()).sum();
        let mut p = Vec::with_capacity(16 + blocks * 9 + c.len() * 12);
        encode_chunk(barrier_id, c, &mut p);
        out.push((KIND_CHUNK, p));
    }
    let mut e = Vec::with_capacity(32);
    encode_end(barrier_id, records, &mut e);
    out.push((KIND_END, e));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(hash: i64, parent: Option<i64>) -> CutPage {
        CutPage {
            hash,
            parent,
            medium: None,
        }
    }

    #[test]
    fn chains_become_records_and_parents_come_first() {
        // 1-2-3 with a branch 2-4-5, a second root 9, a host page 6 below 3, an orphan 7-8.
        let mut pages = vec![
            page(5, Some(4)),
            page(3, Some(2)),
            page(8, Some(7)),
            page(1, None),
            page(4, Some(2)),
            page(2, Some(1)),
            page(9, None),
        ];
        pages.push(CutPage {
            hash: 6,
            parent: Some(3),
            medium: Some("CPU_PINNED"),
        });
        let recs = order_records(&pages);
        let mut seen = std::collections::HashSet::new();
        for r in &recs {
            assert!(r.parent.is_none_or(|p| seen.contains(&p)), "{recs:?}");
            seen.extend(r.blocks.iter().copied());
        }
        assert_eq!(seen, [1, 2, 3, 4, 5, 6, 9].into_iter().collect());
        // 1-2-3 (or 1-2-4-5) is one record; the other branch another; 6 its own (tier); 9 its own.
        assert_eq!(recs.len(), 4, "{recs:?}");
        let host = recs.iter().find(|r| r.blocks == [6]).unwrap();
        assert_eq!(host.medium.as_deref(), Some("CPU_PINNED"));
        assert_eq!(host.parent, Some(3));
    }

    #[test]
    fn gpu_medium_is_the_default_tier() {
        let pages = [
            CutPage {
                hash: 1,
                parent: None,
                medium: Some("GPU"),
            },
            page(2, Some(1)),
        ];
        let recs = order_records(&pages);
        assert_eq!(
            recs,
            [SnapshotRecord {
                parent: None,
                blocks: vec![1, 2],
                medium: None
            }]
        );
    }

    #[test]
    fn replies_are_header_chunks_end_with_counts_that_agree() {
        use loadlink_wire::kv_snapshot::{SnapshotReply, decode_reply};
        // One chain of 10,000 pages: three chunks (4,096 + 4,096 + 1,808 blocks).
        let pages: Vec<CutPage> = (0..10_000)
            .map(|i| page(i, (i > 0).then(|| i - 1)))
            .collect();
        let cut = CacheCut {
            replica_rank: 2,
            barrier_seq: 99,
            page_size: 16,
            pages,
        };
        let replies = snapshot_replies(&cut, 77, 5);
        let decoded: Vec<SnapshotReply> = replies
            .iter()
            .map(|(k, p)| decode_reply(k, p).unwrap())
            .collect();
        let SnapshotReply::Header(h) = decoded[0] else {
            panic!("first reply is not a header")
        };
        assert_eq!(
            (
                h.epoch,
                h.replica_rank,
                h.barrier_seq,
                h.resume_seq,
                h.barrier_id
            ),
            (77, 2, 99, 100, 5)
        );
        assert_eq!(h.record_count, 3);
        let mut blocks: Vec<i64> = Vec::new();
        for r in &decoded[1..decoded.len() - 1] {
            let SnapshotReply::Chunk {
                barrier_id,
                records,
            } = r
            else {
                panic!("expected a chunk: {r:?}")
            };
            assert_eq!(*barrier_id, 5);
            records.iter().for_each(|r| blocks.extend(&r.blocks));
        }
        assert_eq!(blocks, (0..10_000).collect::<Vec<i64>>());
        assert_eq!(
            decoded.last(),
            Some(&SnapshotReply::End {
                barrier_id: 5,
                record_count: 3
            })
        );
    }
}
