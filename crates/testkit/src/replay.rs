//! The replay side of a KV-event stream: a DEALER asks a publisher's ROUTER for every buffered
//! batch from a seq, and reads the answer up to the end marker.

/// One replayed batch: its topic, seq and payload, as the live frames carried them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub topic: Vec<u8>,
    pub seq: i64,
    pub payload: Vec<u8>,
}

/// Every batch the replay socket at `tcp://127.0.0.1:port` holds from `from` on. Panics when an
/// answer is malformed or does not end within 10 s.
pub fn replay(port: u16, from: i64) -> Vec<Replayed> {
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).expect("a DEALER socket");
    dealer
        .connect(&format!("tcp://127.0.0.1:{port}"))
        .expect("connect the DEALER");
    dealer
        .send_multipart([&b""[..], &from.to_be_bytes()], 0)
        .expect("send the replay request");
    let mut out = Vec::new();
    loop {
        let ready = dealer.poll(zmq::POLLIN, 10_000).expect("poll");
        assert!(ready > 0, "replay from {from} on port {port} timed out");
        let f = dealer.recv_multipart(0).expect("a replay frame");
        assert_eq!(
            f.len(),
            4,
            "replay answer: [empty, topic, seq, payload]: {f:?}"
        );
        let seq = i64::from_be_bytes(f[2][..].try_into().expect("an 8-byte seq"));
        if seq == -1 {
            assert!(f[1].is_empty() && f[3].is_empty(), "end marker: {f:?}");
            return out;
        }
        out.push(Replayed {
            topic: f[1].clone(),
            seq,
            payload: f[3].clone(),
        });
    }
}
