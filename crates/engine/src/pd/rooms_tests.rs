//! The room table on its own: a transfer starts once the request is here, prefilled and
//! registered, in whichever order those came; closing a room or its connection tells the other
//! side; stale registrations are swept.

use super::frame::Frame;
use super::rooms::{Peer, Rooms};
use super::{Outcome, PdConfig};
use crate::rank::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::unbounded_channel;

fn rooms() -> Arc<Rooms> {
    // 1 token = 1 byte at 1 GB/s: transfers take nanoseconds.
    let cfg = PdConfig {
        kv_bytes_per_token: 1,
        kv_transfer_gb_s: 1.0,
        ..PdConfig::default()
    };
    Arc::new(Rooms::new(cfg, 1.0, Arc::default()))
}

async fn next_frame(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Frame>) -> Frame {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a frame in time")
        .expect("the channel is open")
}

#[tokio::test]
async fn registration_before_the_request_and_after_both_transfer() {
    for register_first in [true, false] {
        let r = rooms();
        let (frames, mut from_prefill) = unbounded_channel();
        let (commands, rank) = std::sync::mpsc::channel();
        let peer = Peer { conn: 1, frames };
        if register_first {
            r.register(5, peer.clone()).unwrap();
        }
        let _failed = r.add_request(5, 42, commands, 10).unwrap();
        if !register_first {
            r.register(5, peer).unwrap();
        }
        assert!(matches!(rank.try_recv(), Ok(Command::PeerRegistered(42))));
        assert!(r.is_registered(5));
        r.prefilled(5);
        let f = next_frame(&mut from_prefill).await;
        assert_eq!(
            f,
            Frame::Transferred {
                room: 5,
                tokens: 10,
                bytes: 10
            }
        );
        assert!(matches!(
            rank.try_recv(),
            Ok(Command::TransferDone { id: 42, .. })
        ));
        assert_eq!(r.requests(), 0, "the room closed");
    }
}

#[tokio::test]
async fn a_second_registration_or_request_for_a_room_is_refused() {
    let r = rooms();
    let (frames, _rx) = unbounded_channel();
    let (commands, _rank) = std::sync::mpsc::channel();
    r.register(
        1,
        Peer {
            conn: 1,
            frames: frames.clone(),
        },
    )
    .unwrap();
    let again = r.register(1, Peer { conn: 2, frames }).unwrap_err();
    assert!(again.contains("already registered"), "{again}");
    let _first = r.add_request(1, 7, commands.clone(), 3).unwrap();
    let twice = r.add_request(1, 8, commands, 3).unwrap_err();
    assert!(twice.contains("already in use"), "{twice}");
}

#[tokio::test]
async fn a_closed_connection_fails_its_requests_and_a_dropped_request_fails_its_peer() {
    let r = rooms();
    let (frames, mut from_prefill) = unbounded_channel();
    let (commands, _rank) = std::sync::mpsc::channel();
    let failed = r.add_request(9, 1, commands.clone(), 3).unwrap();
    r.register(
        9,
        Peer {
            conn: 3,
            frames: frames.clone(),
        },
    )
    .unwrap();
    r.peer_gone(3);
    let (outcome, reason) = failed.await.expect("told why");
    assert_eq!(outcome, Outcome::Failed);
    assert!(reason.contains("connection closed"), "{reason}");
    // The other way: the request goes away, its registered decode side hears `failed`.
    let _failed = r.add_request(10, 2, commands, 3).unwrap();
    r.register(10, Peer { conn: 4, frames }).unwrap();
    r.remove_request(10, 2, "client gone");
    let f = next_frame(&mut from_prefill).await;
    assert_eq!(
        f,
        Frame::Failed {
            room: 10,
            reason: "client gone".into()
        }
    );
}

#[tokio::test]
async fn registrations_without_a_request_are_swept_after_the_timeout() {
    let r = rooms();
    let (frames, mut from_prefill) = unbounded_channel();
    r.register(11, Peer { conn: 1, frames }).unwrap();
    r.sweep(Duration::from_secs(60));
    assert!(r.is_registered(11), "not stale yet");
    r.sweep(Duration::ZERO);
    assert!(!r.is_registered(11));
    let f = next_frame(&mut from_prefill).await;
    assert!(matches!(f, Frame::Failed { room: 11, .. }), "{f:?}");
}
