//! Unit tests of the KV-event payload codec: round trips, the exact bytes SGLang sends, block hashes.

use super::*;

fn sample() -> KvEventBatch {
    KvEventBatch {
        ts: 1.5,
        events: vec![
            KvEvent::Stored(BlockStored {
                block_hashes: vec![-5, 1 << 40],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                lora_id: None,
                medium: Some("GPU".into()),
                ..Default::default()
            }),
            KvEvent::Removed(BlockRemoved {
                block_hashes: vec![i64::MIN],
                medium: Some("GPU".into()),
            }),
            KvEvent::AllCleared,
        ],
        attn_dp_rank: Some(1),
    }
}

#[test]
fn round_trips_and_starts_with_the_positional_batch() {
    let b = sample();
    let bytes = kv_batch_bytes(&b);
    assert_eq!(&bytes[..2], &[0x93, 0xcb]);
    assert_eq!(decode_kv_batch(&bytes).unwrap(), b);
}

#[test]
fn json_form_round_trips() {
    let b = sample();
    assert_eq!(kv_batch_from_json(&kv_batch_to_json(&b)).unwrap(), b);
    let e = kv_batch_from_json(&json!({"ts": 1, "events": [{"type": "Nope"}]})).unwrap_err();
    assert!(e.contains("Nope"), "{e}");
}

#[test]
fn golden_all_cleared() {
    // msgspec: KVEventBatch(ts=0.0, events=[AllBlocksCleared()]) with attn_dp_rank None.
    let b = KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::AllCleared],
        attn_dp_rank: None,
    };
    let mut want = vec![0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa4];
    want.extend_from_slice(b"type");
    want.push(0xa0 | 16);
    want.extend_from_slice(b"AllBlocksCleared");
    want.push(0xc0);
    assert_eq!(kv_batch_bytes(&b), want);
}

#[test]
fn rejects_unknown_event_type_and_truncation() {
    let mut bytes = kv_batch_bytes(&sample());
    let at = bytes.windows(7).position(|w| w == b"Removed").unwrap();
    bytes[at] = b'X';
    assert!(matches!(
        decode_kv_batch(&bytes),
        Err(DecodeError::UnknownEventType { got }) if got == "BlockXemoved"
    ));
    let bytes = kv_batch_bytes(&sample());
    for cut in 0..bytes.len() {
        assert!(decode_kv_batch(&bytes[..cut]).is_err());
    }
}

#[test]
fn page_hashes_chain() {
    let a = page_digest(None, &[1, 2]);
    let b = page_digest(Some(&a), &[3, 4]);
    assert_ne!(a, b);
    assert_eq!(page_digest(Some(&a), &[3, 4]), b);
    assert_ne!(page_digest(None, &[3, 4]), b);
    assert_eq!(block_hash(&[0xff; 32]), -1);
}
