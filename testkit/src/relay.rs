//! [`Relay`]: a TCP relay on a free loopback port that forwards every
//! connection to one target, and can cut the path: [`Relay::cut`] closes
//! every connection it carries and closes each new one at once (connection
//! refused, as far as the client's request goes) until [`Relay::restore`].
//! Between one client and a real server (a manager and etcd) it is a
//! partition of that client alone, while others still reach the server
//! directly.
//!
//! Runs on the test's tokio runtime; dropping it ends its listener and
//! every connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// See the module docs.
pub struct Relay {
    port: u16,
    cut: Arc<AtomicBool>,
    /// Bumped by every cut: each connection ends when it changes.
    cuts: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on `127.0.0.1:0` and forwards to `target` (`HOST:PORT`).
    pub async fn start(target: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let (cuts, _) = watch::channel(0);
        let task = tokio::spawn(serve(
            listener,
            target.to_string(),
            cut.clone(),
            cuts.clone(),
        ));
        Relay {
            port,
            cut,
            cuts,
            task,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Closes every connection and every new one until [`Relay::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The task owns the connections' JoinSet: aborting it ends them all.
        self.task.abort();
    }
}

async fn serve(
    listener: TcpListener,
    target: String,
    cut: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        // Subscribed before the cut is read: a cut after this line still
        // ends the connection.
        let mut cut_now = cuts.subscribe();
        if cut.load(Ordering::SeqCst) {
            drop(inbound);
            continue;
        }
        let target = target.clone();
        connections.spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(&target).await else {
                return;
            };
            tokio::select! {
                _ = cut_now.changed() => {}
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
            }
        });
    }
}
