//! `idem proxy`'s memory under slow clients, with its default limits: its resident set
//! (`VmRSS`, and its peak `VmHWM` from `/proc`) while thousands of clients hold
//! connections, once with heads that never end (slowloris), once with protected bodies
//! half sent and stalled; and whether a well-behaved client is still answered meanwhile.
//! Each attack runs against a proxy process of its own, so its peak is its own.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::reverse_proxy;
use crate::target::BoxError;

/// One attack's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SlowRow {
    pub(crate) attack: &'static str,
    pub(crate) clients: usize,
    /// Connections whose handshake completed: accepted by the proxy, or waiting in the
    /// system's backlog past `max_connections` (the rest timed out).
    pub(crate) connected: usize,
    /// Clients answered 503 before the attack ended (past `max_concurrent_requests`).
    pub(crate) answered: usize,
    pub(crate) idle_rss_mib: f64,
    pub(crate) rss_mib: f64,
    pub(crate) peak_rss_mib: f64,
    /// What a well-behaved request got during the attack.
    pub(crate) probe_status: u16,
}

/// Bytes of body each stalled client sends before it stops: half the default
/// `max_request_body`.
const SENT_BODY: usize = 512 * 1024;
/// How long the attack holds its connections before the figures are read.
const HOLD: Duration = Duration::from_secs(8);

pub(crate) async fn run(idem: &Path, clients: usize, dir: &Path) -> Result<Vec<SlowRow>, BoxError> {
    let upstream = reverse_proxy::upstream().await?;
    let store = |name: &str| {
        vec![
            "--store".to_owned(),
            format!("sqlite://{}", dir.join(format!("slow-{name}.db")).display()),
        ]
    };
    let mut rows = Vec::new();
    for attack in ["slow heads", "stalled bodies"] {
        let name = attack.replace(' ', "-");
        let (process, addr) =
            reverse_proxy::idem_proxy(idem, upstream, &store(&name), dir, &name).await?;
        let pid = process.id();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle = rss(pid)?.0;
        let body = Arc::new(vec![b'1'; SENT_BODY]);
        let counts = Arc::new(Counts::default());
        let mut tasks = Vec::with_capacity(clients);
        for i in 0..clients {
            let (body, counts) = (Arc::clone(&body), Arc::clone(&counts));
            tasks.push(tokio::spawn(async move {
                let _ = attacker(addr, attack, i, &body, &counts).await;
            }));
        }
        // The attack is under way: a well-behaved client asks meanwhile.
        tokio::time::sleep(HOLD / 2).await;
        let probe_status = probe(addr).await;
        tokio::time::sleep(HOLD / 2).await;
        let (now, peak) = rss(pid)?;
        let (connected, answered) = (
            counts.connected.load(Ordering::Relaxed),
            counts.answered.load(Ordering::Relaxed),
        );
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        let row = SlowRow {
            attack,
            clients,
            connected,
            answered,
            idle_rss_mib: idle,
            rss_mib: now,
            peak_rss_mib: peak,
            probe_status,
        };
        eprintln!(
            "  {attack} x{clients}: idle {idle:.1} MiB, {now:.1} MiB held, peak {peak:.1} MiB; a probe got {probe_status}"
        );
        rows.push(row);
        drop(process);
    }
    Ok(rows)
}

/// What the attack's clients learnt, counted as they go.
#[derive(Default)]
struct Counts {
    connected: AtomicUsize,
    answered: AtomicUsize,
}

/// One slow client, until it is aborted.
async fn attacker(
    addr: SocketAddr,
    attack: &'static str,
    i: usize,
    body: &[u8],
    counts: &Counts,
) -> Result<(), BoxError> {
    let connect = tokio::time::timeout(HOLD, TcpStream::connect(addr)).await;
    let Ok(Ok(mut stream)) = connect else {
        return Ok(());
    };
    counts.connected.fetch_add(1, Ordering::Relaxed);
    let head = match attack {
        "slow heads" => {
            "POST /payments HTTP/1.1\r\nHost: proxy\r\nx-account-id: slow\r\n".to_owned()
        }
        _ => format!(
            "POST /payments HTTP/1.1\r\nHost: proxy\r\nx-account-id: slow\r\nidempotency-key: slow-{i}\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            2 * body.len()
        ),
    };
    stream.write_all(head.as_bytes()).await?;
    if attack != "slow heads" {
        // Half the body; a proxy past its limit answers 503 before reading it.
        let _ = tokio::time::timeout(HOLD, stream.write_all(body)).await;
    }
    let mut answer = [0u8; 64];
    // A 503 the proxy sends before the attack ends.
    let read = tokio::time::timeout(HOLD, stream.read(&mut answer)).await;
    if matches!(read, Ok(Ok(n)) if answer[..n].starts_with(b"HTTP/1.1 503")) {
        counts.answered.fetch_add(1, Ordering::Relaxed);
    }
    // Held until aborted.
    std::future::pending::<()>().await;
    Ok(())
}

/// A well-behaved protected request: its status, or 0 when it got none in 5 s.
async fn probe(addr: SocketAddr) -> u16 {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client");
    client
        .post(format!("http://{addr}/payments"))
        .header("x-account-id", "probe")
        .header("idempotency-key", "probe")
        .body("{}")
        .send()
        .await
        .map_or(0, |response| response.status().as_u16())
}

/// `VmRSS` and `VmHWM` of process `pid`, in MiB.
fn rss(pid: u32) -> Result<(f64, f64), BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<f64, BoxError> {
        let line = status
            .lines()
            .find(|line| line.starts_with(name))
            .ok_or_else(|| format!("no {name} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .ok_or("an empty line")?
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

pub(crate) fn print(rows: &[SlowRow]) {
    if rows.is_empty() {
        return;
    }
    println!("\n`idem proxy` under slow clients (default limits)");
    println!(
        "| attack | clients | connected | answered | idle MiB | held MiB | peak MiB | a probe got |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
            row.attack,
            row.clients,
            row.connected,
            row.answered,
            row.idle_rss_mib,
            row.rss_mib,
            row.peak_rss_mib,
            row.probe_status
        );
    }
}
