//! Property tests of the snapshot codec (2,000 cases each): any valid reply round-trips through
//! its encoder and `decode_reply`, chunking keeps every block once and parents first, and no
//! payload (arbitrary bytes, or a valid one corrupted) makes the decoder panic.

use loadlink_wire::kv_snapshot::*;
use proptest::prelude::*;
use std::collections::HashSet;

fn any_record() -> impl Strategy<Value = SnapshotRecord> {
    (
        proptest::option::of(any::<i64>()),
        proptest::collection::vec(any::<i64>(), 1..40),
        proptest::option::of("[A-Z_]{1,12}"),
    )
        .prop_map(|(parent, blocks, medium)| SnapshotRecord {
            parent,
            blocks,
            medium,
        })
}

fn any_reply() -> impl Strategy<Value = SnapshotReply> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u32>(),
            -1i64..i64::MAX,
            any::<u64>(),
            any::<u64>(),
            1u32..u32::MAX
        )
            .prop_map(
                |(e, r, b, id, n, p)| SnapshotReply::Header(SnapshotHeader::new(e, r, b, id, n, p))
            ),
        (any::<u64>(), proptest::collection::vec(any_record(), 0..60)).prop_map(
            |(barrier_id, records)| SnapshotReply::Chunk {
                barrier_id,
                records
            }
        ),
        (any::<u64>(), any::<u64>()).prop_map(|(barrier_id, record_count)| SnapshotReply::End {
            barrier_id,
            record_count
        }),
        ".{0,200}".prop_map(|reason| SnapshotReply::Error { reason }),
    ]
}

const KINDS: [&[u8]; 4] = [KIND_HEADER, KIND_CHUNK, KIND_END, KIND_ERROR];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn replies_round_trip(reply in any_reply()) {
        let mut out = Vec::new();
        let kind = encode_reply(&reply, &mut out);
        prop_assert_eq!(decode_reply(kind, &out).unwrap(), reply);
    }

    #[test]
    fn corrupted_replies_never_panic(reply in any_reply(), at in any::<usize>(), byte in any::<u8>()) {
        let mut out = Vec::new();
        let kind = encode_reply(&reply, &mut out);
        if !out.is_empty() {
            let i = at % out.len();
            out[i] = byte;
        }
        let _ = decode_reply(kind, &out);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), k in 0usize..4) {
        let _ = decode_reply(KINDS[k], &bytes);
    }

    #[test]
    fn chunking_keeps_blocks_order_and_bounds(sizes in proptest::collection::vec(1usize..9000, 1..6)) {
        // Distinct chains, each child of the previous chain's first block.
        let mut next = 0i64;
        let mut records = Vec::new();
        for n in sizes {
            let parent = records.last().map(|r: &SnapshotRecord| r.blocks[0]);
            records.push(SnapshotRecord { parent, blocks: (next..next + n as i64).collect(), medium: None });
            next += n as i64;
        }
        let chunks = chunk_records(records);
        let mut seen = HashSet::new();
        let mut order = Vec::new();
        for c in &chunks {
            prop_assert!(c.iter().map(|r| r.blocks.len()).sum::<usize>() <= MAX_CHUNK_BLOCKS);
            let mut out = Vec::new();
            encode_chunk(1, c, &mut out);
            prop_assert!(decode_reply(KIND_CHUNK, &out).is_ok());
            for r in c {
                prop_assert!(r.parent.is_none_or(|p| seen.contains(&p)));
                for &b in &r.blocks {
                    seen.insert(b);
                    order.push(b);
                }
            }
        }
        prop_assert_eq!(order, (0..next).collect::<Vec<_>>());
    }
}
