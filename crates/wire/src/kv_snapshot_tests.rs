//! Unit tests of the snapshot codec: round trips, the exact bytes of a header, chunking, and
//! hostile payloads (every truncation, lies about lengths, wrong types, over-bounds).

use super::*;

fn header() -> SnapshotHeader {
    SnapshotHeader::new(1_790_000_000_123_456_789, 3, 41, 7, 2, 16)
}

fn records() -> Vec<SnapshotRecord> {
    vec![
        SnapshotRecord {
            parent: None,
            blocks: vec![-5, 1 << 40, i64::MIN],
            medium: None,
        },
        SnapshotRecord {
            parent: Some(1 << 40),
            blocks: vec![i64::MAX],
            medium: Some("CPU_PINNED".into()),
        },
    ]
}

fn all_replies() -> Vec<SnapshotReply> {
    vec![
        SnapshotReply::Header(header()),
        SnapshotReply::Chunk {
            barrier_id: 7,
            records: records(),
        },
        SnapshotReply::End {
            barrier_id: 7,
            record_count: 2,
        },
        SnapshotReply::Error {
            reason: "no snapshot source: this rank has no cache".into(),
        },
    ]
}

fn encoded(reply: &SnapshotReply) -> (&'static [u8], Vec<u8>) {
    let mut out = Vec::new();
    let kind = encode_reply(reply, &mut out);
    (kind, out)
}

#[test]
fn every_reply_round_trips_with_its_kind() {
    for reply in all_replies() {
        let (kind, bytes) = encoded(&reply);
        assert_eq!(decode_reply(kind, &bytes).unwrap(), reply);
    }
    let kinds: Vec<&[u8]> = all_replies().iter().map(|r| encoded(r).0).collect();
    assert_eq!(kinds, [KIND_HEADER, KIND_CHUNK, KIND_END, KIND_ERROR]);
}

#[test]
fn header_bytes_are_a_map_of_nine_in_declaration_order() {
    let h = SnapshotHeader::new(5, 1, -1, 2, 0, 16);
    let mut out = Vec::new();
    encode_header(&h, &mut out);
    let mut want = vec![0x89];
    for (k, v) in [
        ("version", 1u8),
        ("epoch", 5),
        ("replica_rank", 1),
        ("barrier_seq", 0xff), // -1 as a negative fixint
        ("resume_seq", 0),
        ("barrier_id", 2),
        ("record_count", 0),
        ("page_size", 16),
        ("hash_schema_version", 1),
    ] {
        want.push(0xa0 | k.len() as u8);
        want.extend_from_slice(k.as_bytes());
        want.push(v);
    }
    assert_eq!(out, want);
    assert_eq!(h.resume_seq, 0);
}

#[test]
fn a_v1_draft_header_without_page_size_decodes_with_none() {
    let mut h = header();
    h.page_size = None;
    h.hash_schema_version = None;
    let mut out = Vec::new();
    encode_header(&h, &mut out);
    assert_eq!(out[0], 0x87);
    assert_eq!(
        decode_reply(KIND_HEADER, &out).unwrap(),
        SnapshotReply::Header(h)
    );
}

#[test]
fn header_semantics_are_checked_and_named() {
    type Spoil = fn(&mut SnapshotHeader);
    let cases: [(Spoil, &str); 5] = [
        (
            |h| {
                h.barrier_seq = i64::MAX;
                h.resume_seq = i64::MAX
            },
            "resume_seq",
        ),
        (|h| h.version = 2, "version"),
        (|h| h.resume_seq = h.barrier_seq + 2, "resume_seq"),
        (
            |h| {
                h.barrier_seq = -2;
                h.resume_seq = -1
            },
            "barrier_seq",
        ),
        (|h| h.page_size = Some(0), "page_size"),
    ];
    for (spoil, field) in cases {
        let mut h = header();
        spoil(&mut h);
        let mut out = Vec::new();
        encode_header(&h, &mut out);
        let e = decode_reply(KIND_HEADER, &out).unwrap_err();
        assert!(
            matches!(&e, SnapshotError::OutOfRange { field: f, .. } if *f == field),
            "{field}: {e}"
        );
    }
}

#[test]
fn missing_fields_are_named() {
    // {"version": 1} only.
    let mut p = vec![0x81, 0xa7];
    p.extend_from_slice(b"version");
    p.push(1);
    let e = decode_reply(KIND_HEADER, &p).unwrap_err();
    assert_eq!(e.to_string(), "header: missing field `barrier_seq`");
    let e = decode_reply(KIND_END, &[0x80]).unwrap_err();
    assert_eq!(e.to_string(), "end: missing field `barrier_id`");
}

#[test]
fn unknown_keys_are_skipped_but_unknown_kinds_rejected() {
    // An `end` with an extra key in front, including a non-string key with a nested value.
    let mut p = vec![0x84, 0xa5];
    p.extend_from_slice(b"extra");
    p.extend_from_slice(&[0x92, 1, 2]);
    p.extend_from_slice(&[0x07, 0x91, 0x80]); // key 7 -> [ {} ]
    p.push(0xaa);
    p.extend_from_slice(b"barrier_id");
    p.push(9);
    p.push(0xac);
    p.extend_from_slice(b"record_count");
    p.push(3);
    assert_eq!(
        decode_reply(KIND_END, &p).unwrap(),
        SnapshotReply::End {
            barrier_id: 9,
            record_count: 3
        }
    );
    let e = decode_reply(b"footer", &p).unwrap_err();
    assert!(matches!(e, SnapshotError::UnknownKind { ref got } if got == "footer"));
}

#[test]
fn every_truncation_and_every_trailing_byte_is_an_error() {
    for reply in all_replies() {
        let (kind, bytes) = encoded(&reply);
        for cut in 0..bytes.len() {
            assert!(
                decode_reply(kind, &bytes[..cut]).is_err(),
                "{kind:?} cut {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            decode_reply(kind, &long),
            Err(SnapshotError::Decode(DecodeError::TrailingBytes {
                trailing: 1
            }))
        ));
    }
}

#[test]
fn hostile_bytes_never_panic() {
    // Every single-byte corruption of every reply, and a few length lies.
    for reply in all_replies() {
        let (kind, bytes) = encoded(&reply);
        for at in 0..bytes.len() {
            for b in [
                0x00, 0x7f, 0x80, 0x9f, 0xc0, 0xc1, 0xcf, 0xdb, 0xdd, 0xdf, 0xff,
            ] {
                let mut spoiled = bytes.clone();
                spoiled[at] = b;
                let _ = decode_reply(kind, &spoiled);
            }
        }
    }
    // A chunk claiming 2^32-1 records in a few bytes.
    let mut p = Vec::new();
    encode_chunk_start(1, 0, &mut p);
    p.pop();
    p.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    assert!(decode_reply(KIND_CHUNK, &p).is_err());
    // A map claiming 2^32-1 entries.
    assert!(decode_reply(KIND_HEADER, &[0xdf, 0xff, 0xff, 0xff, 0xff]).is_err());
}

fn chunk_bytes(records: &[SnapshotRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_chunk(1, records, &mut out);
    out
}

#[test]
fn chunk_bounds_are_enforced() {
    let at_bound = vec![SnapshotRecord {
        parent: None,
        blocks: (0..MAX_CHUNK_BLOCKS as i64).collect(),
        medium: None,
    }];
    assert!(decode_reply(KIND_CHUNK, &chunk_bytes(&at_bound)).is_ok());

    let mut over = at_bound.clone();
    over.push(SnapshotRecord {
        parent: Some(0),
        blocks: vec![1],
        medium: None,
    });
    let e = decode_reply(KIND_CHUNK, &chunk_bytes(&over)).unwrap_err();
    assert!(matches!(
        e,
        SnapshotError::TooLarge {
            field: "block_hashes",
            len: 4097,
            max: 4096
        }
    ));

    let empty = vec![SnapshotRecord::default()];
    let e = decode_reply(KIND_CHUNK, &chunk_bytes(&empty)).unwrap_err();
    assert!(matches!(
        e,
        SnapshotError::OutOfRange {
            field: "block_hashes",
            ..
        }
    ));

    let long_medium = vec![SnapshotRecord {
        parent: None,
        blocks: vec![1],
        medium: Some("X".repeat(MAX_MEDIUM_LEN + 1)),
    }];
    let e = decode_reply(KIND_CHUNK, &chunk_bytes(&long_medium)).unwrap_err();
    assert!(matches!(
        e,
        SnapshotError::TooLarge {
            field: "medium",
            ..
        }
    ));

    // A record of four elements, and a record whose parent is a string.
    let mut p = Vec::new();
    encode_chunk_start(1, 1, &mut p);
    p.extend_from_slice(&[0x94, 0xc0, 0x91, 1, 0xc0, 0xc0]);
    let e = decode_reply(KIND_CHUNK, &p).unwrap_err();
    assert!(matches!(
        e,
        SnapshotError::OutOfRange {
            field: "record",
            ..
        }
    ));
    let mut p = Vec::new();
    encode_chunk_start(1, 1, &mut p);
    p.extend_from_slice(&[0x92, 0xa1, b'x', 0x91, 1]);
    assert_eq!(
        decode_reply(KIND_CHUNK, &p).unwrap_err().to_string(),
        "field `parent_block_hash`: expected int, got str"
    );
}

#[test]
fn an_explicit_nil_medium_reads_as_device() {
    let mut p = Vec::new();
    encode_chunk_start(4, 1, &mut p);
    p.extend_from_slice(&[0x93, 0xc0, 0x91, 5, 0xc0]);
    assert_eq!(
        decode_reply(KIND_CHUNK, &p).unwrap(),
        SnapshotReply::Chunk {
            barrier_id: 4,
            records: vec![SnapshotRecord {
                parent: None,
                blocks: vec![5],
                medium: None
            }]
        }
    );
}

#[test]
fn error_reasons_are_cut_at_the_bound_on_a_char_boundary() {
    let reason = "é".repeat(MAX_REASON_LEN); // 2 bytes each
    let mut out = Vec::new();
    encode_error(&reason, &mut out);
    let SnapshotReply::Error { reason: got } = decode_reply(KIND_ERROR, &out).unwrap() else {
        panic!("not an error reply");
    };
    assert_eq!(got.len(), MAX_REASON_LEN);
    assert!(reason.starts_with(&got));
}

#[test]
fn chunking_keeps_order_bounds_and_chains() {
    // 3 records: 5,000 blocks, 10 blocks, 4,000 blocks (CPU tier).
    let a: Vec<i64> = (0..5000).collect();
    let b: Vec<i64> = (10_000..10_010).collect();
    let c: Vec<i64> = (20_000..24_000).collect();
    let input = vec![
        SnapshotRecord {
            parent: None,
            blocks: a.clone(),
            medium: None,
        },
        SnapshotRecord {
            parent: Some(4999),
            blocks: b.clone(),
            medium: None,
        },
        SnapshotRecord {
            parent: Some(3),
            blocks: c.clone(),
            medium: Some("DISK".into()),
        },
        SnapshotRecord::default(),
    ];
    let chunks = chunk_records(input);
    assert!(
        chunks
            .iter()
            .all(|c| c.iter().map(|r| r.blocks.len()).sum::<usize>() <= MAX_CHUNK_BLOCKS)
    );
    let flat: Vec<&SnapshotRecord> = chunks.iter().flatten().collect();
    // Every record's parent is nil or a block seen before it; each block appears once, in order.
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    for r in &flat {
        assert!(r.parent.is_none_or(|p| seen.contains(&p)), "{:?}", r.parent);
        assert!(!r.blocks.is_empty());
        for &b in &r.blocks {
            assert!(seen.insert(b));
            order.push(b);
        }
    }
    let want: Vec<i64> = a.into_iter().chain(b).chain(c).collect();
    assert_eq!(order, want);
    // The split piece of `a` continues from its last block; the split piece of `c` keeps DISK.
    assert_eq!(flat[1].parent, Some(4095));
    assert!(
        flat.iter()
            .filter(|r| r.blocks[0] >= 20_000)
            .all(|r| r.medium.as_deref() == Some("DISK"))
    );
    assert_eq!(chunks.len(), 3);
}

#[test]
fn epoch_topic_round_trips_and_tolerates_plain_topics() {
    for (topic, epoch) in [
        (&b""[..], 0u64),
        (b"kv", 1_790_000_000_123_456_789),
        (b"a\0b", u64::MAX),
    ] {
        let mut f = Vec::new();
        epoch_topic(topic, epoch, &mut f);
        assert_eq!(split_epoch_topic(&f), (topic, Some(epoch)));
    }
    let mut f = Vec::new();
    epoch_topic(b"kv", 42, &mut f);
    assert_eq!(f, b"kv\0sgl-kv-epoch=42");
    for plain in [
        &b""[..],
        b"kv",
        b"kv\0sgl-kv-epoch=",
        b"kv\0sgl-kv-epoch=12x",
        b"kv\0sgl-kv-epoch=-1",
        b"kv\0sgl-kv-epoch=18446744073709551616", // u64::MAX + 1
    ] {
        assert_eq!(split_epoch_topic(plain), (plain, None), "{plain:?}");
    }
}
