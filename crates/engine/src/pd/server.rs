//! The prefill side's bootstrap server: a TCP listener bound when the engine starts (its port
//! advertised in `/server_info`), one task pair per decode connection (a reader of `register`
//! frames, a writer of `transferred` and `failed` frames), and a sweeper of stale registrations.
//!
//! Budgets: at most [`MAX_CONNECTIONS`] decode connections at once (more are closed on accept);
//! frames over [`super::frame::MAX_FRAME`] or malformed close that connection only, failing the
//! requests of its rooms.

use super::frame::{Frame, read_frame};
use super::rooms::{Peer, Refusal, Rooms};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

/// Decode connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// The running server's tasks (aborted when the engine stops).
pub(crate) struct BootstrapServer {
    tasks: Vec<JoinHandle<()>>,
}

impl BootstrapServer {
    /// Serves `listener` until [`BootstrapServer::stop`]; stale registrations are swept every
    /// second (those older than `timeout`).
    pub(crate) fn start(listener: TcpListener, rooms: Arc<Rooms>, timeout: Duration) -> Self {
        let sweep_rooms = rooms.clone();
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                sweep_rooms.sweep(timeout);
            }
        });
        let acceptor = tokio::spawn(accept(listener, rooms));
        BootstrapServer {
            tasks: vec![sweeper, acceptor],
        }
    }

    pub(crate) fn stop(&self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept(listener: TcpListener, rooms: Arc<Rooms>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let next_conn = AtomicU64::new(1);
    // The connections are this task's: when it is aborted (the engine stops or is dropped),
    // the set is dropped and every connection closes with it, as a killed engine's would.
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            if rooms.refuse(Refusal::Connections) {
                tracing::warn!(%peer, "bootstrap: more than {MAX_CONNECTIONS} decode connections; closing this one (counted in loadlink_engine_pd_bootstrap_refused_total)");
            }
            continue;
        };
        let conn = next_conn.fetch_add(1, Ordering::Relaxed);
        let rooms = rooms.clone();
        conns.spawn(async move {
            serve(stream, conn, rooms.clone()).await;
            rooms.peer_gone(conn);
            drop(permit);
        });
    }
}

/// One decode connection: registrations in, outcomes out, until either side closes or a frame
/// is refused. Reader and writer run in this one task, so ending it closes the socket.
async fn serve(stream: TcpStream, conn: u64, rooms: Arc<Rooms>) {
    let _ = stream.set_nodelay(true);
    let peer_addr = stream.peer_addr().ok();
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Frame>();
    let writer = async move {
        while let Some(f) = rx.recv().await {
            if wr.write_all(&f.encode()).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        loop {
            match read_frame(&mut rd).await {
                Ok(None) => return,
                Ok(Some(Frame::Register { room, dp_rank })) => {
                    let peer = Peer {
                        conn,
                        frames: tx.clone(),
                    };
                    if let Err(reason) = rooms.register(room, peer) {
                        rooms.refuse(Refusal::Register);
                        tracing::debug!(room, dp_rank, "bootstrap: register refused: {reason}");
                        let _ = tx.send(Frame::Failed { room, reason });
                    }
                }
                Ok(Some(other)) => {
                    if rooms.refuse(Refusal::Frame) {
                        tracing::warn!(
                            ?peer_addr,
                            "bootstrap: a decode side sent {other:?}; closing"
                        );
                    }
                    return;
                }
                Err(e) => {
                    if rooms.refuse(Refusal::Frame) {
                        tracing::warn!(?peer_addr, "bootstrap: {e}; closing the connection");
                    }
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = reader => {}
        () = writer => {}
    }
}
