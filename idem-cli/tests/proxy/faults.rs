//! TCP proxies in front of the replicas that drop answers or cut connections.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy in front of the replicas, in turn, that drops every `nth` answer: the
/// request goes through, the response is read and thrown away, the client's connection
/// is cut.
pub(crate) async fn fault_proxy(
    replicas: Vec<SocketAddr>,
    nth: usize,
    dropped: Arc<AtomicUsize>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut count = 0usize;
        while let Ok((mut client, _)) = listener.accept().await {
            count += 1;
            let target = replicas[count % replicas.len()];
            let drop_answer = count.is_multiple_of(nth);
            let dropped = Arc::clone(&dropped);
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(target).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.split();
                let (mut server_read, mut server_write) = server.split();
                let upload = async {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    // The client is done: so is the replica's side of the connection.
                    let _ = server_write.shutdown().await;
                };
                let download = async {
                    if drop_answer {
                        let mut buf = [0u8; 4096];
                        // The answer arrived; the client never sees it.
                        if matches!(server_read.read(&mut buf).await, Ok(n) if n > 0) {
                            dropped.fetch_add(1, Ordering::SeqCst);
                        }
                    } else {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    }
                    let _ = client_write.shutdown().await;
                };
                // Bounded: a connection lasts at most 30 s.
                let _ = tokio::time::timeout(Duration::from_secs(30), async {
                    tokio::join!(upload, download);
                })
                .await;
            });
        }
    });
    addr
}

/// A TCP proxy between the replicas and the upstream that cuts every `nth` connection
/// mid-answer: the upstream's response head and one byte of its body go through, then
/// both sides are closed.
pub(crate) async fn cutting_proxy(
    upstream: SocketAddr,
    nth: usize,
    cut: Arc<AtomicUsize>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut count = 0usize;
        while let Ok((mut replica, _)) = listener.accept().await {
            count += 1;
            let cut_this = count.is_multiple_of(nth);
            let cut = Arc::clone(&cut);
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut replica_read, mut replica_write) = replica.split();
                let (mut server_read, mut server_write) = server.split();
                let upload = async {
                    let _ = tokio::io::copy(&mut replica_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                };
                let download = async {
                    if !cut_this {
                        let _ = tokio::io::copy(&mut server_read, &mut replica_write).await;
                        return;
                    }
                    // The head, then one byte of the body, then nothing.
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 1];
                    while let Ok(1) = server_read.read(&mut buf).await {
                        seen.push(buf[0]);
                        let _ = replica_write.write_all(&buf).await;
                        if let Some(head) = seen.windows(4).position(|w| w == b"\r\n\r\n")
                            && seen.len() > head + 4
                        {
                            cut.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                    }
                };
                // Bounded: a connection lasts at most 30 s; a cut one ends at the cut.
                let _ = tokio::time::timeout(Duration::from_secs(30), async {
                    if cut_this {
                        tokio::select! {
                            () = upload => {}
                            () = download => {}
                        }
                    } else {
                        tokio::join!(upload, download);
                    }
                })
                .await;
            });
        }
    });
    addr
}
