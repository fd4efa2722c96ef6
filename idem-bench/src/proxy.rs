//! A loopback TCP proxy that counts round trips: each time a connection's traffic turns
//! from server-to-client back to client-to-server is one request answered. Used for a
//! sequential counting pass only (under concurrency, pipelined requests would merge).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy to `upstream`; dropped, it stops accepting.
pub(crate) struct CountingProxy {
    pub(crate) addr: SocketAddr,
    turns: Arc<AtomicU64>,
    /// Bytes client to server, and server to client.
    bytes: Arc<[AtomicU64; 2]>,
    task: tokio::task::JoinHandle<()>,
}

/// PostgreSQL's bare `Sync` message: sqlx's pool sends it alone (a ping) when a connection
/// goes back to the pool, in the background, for idem and the raw baseline alike. It is
/// not part of any operation's own round trips, so the proxy can leave it out.
pub(crate) const POSTGRES_SYNC: &[u8] = b"S\x00\x00\x00\x04";

impl CountingProxy {
    /// A proxy to `upstream`; a turn that starts with exactly `ignored` is not counted.
    pub(crate) async fn start(
        upstream: SocketAddr,
        ignored: Option<&'static [u8]>,
    ) -> std::io::Result<Self> {
        assert!(
            upstream.ip().is_loopback(),
            "the bench only talks to loopback servers"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let turns = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let (counter, byte_counter) = (Arc::clone(&turns), Arc::clone(&bytes));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (counter, bytes) = (Arc::clone(&counter), Arc::clone(&byte_counter));
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, counter, bytes, ignored).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            turns,
            bytes,
            task,
        })
    }

    /// Round trips seen so far, over all connections.
    pub(crate) fn round_trips(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }

    /// Bytes relayed so far: (client to server, server to client).
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (
            self.bytes[0].load(Ordering::SeqCst),
            self.bytes[1].load(Ordering::SeqCst),
        )
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    turns: Arc<AtomicU64>,
    bytes: Arc<[AtomicU64; 2]>,
    ignored: Option<&'static [u8]>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // True while the last bytes went client to server: a new request starts a turn.
    let client_spoke_last = Arc::new(AtomicBool::new(false));
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = {
        let spoke = Arc::clone(&client_spoke_last);
        let bytes = Arc::clone(&bytes);
        async move {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                let n = match client_read.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let counted = ignored != Some(&buffer[..n]);
                if !spoke.swap(true, Ordering::SeqCst) && counted {
                    turns.fetch_add(1, Ordering::SeqCst);
                }
                if counted {
                    bytes[0].fetch_add(n as u64, Ordering::SeqCst);
                }
                if server_write.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        }
    };
    let down = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            client_spoke_last.store(false, Ordering::SeqCst);
            bytes[1].fetch_add(n as u64, Ordering::SeqCst);
            if client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(up, down);
}
