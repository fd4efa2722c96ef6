//! A TCP proxy on 127.0.0.1 that injects faults between a store's client and its server.
//!
//! Faults, on command ([`FaultProxy::inject`]) or at seeded random points
//! ([`FaultProxy::set_rate`]):
//! - [`Fault::Delay`]: a request waits before it is forwarded;
//! - [`Fault::Refuse`]: new connections are closed at once;
//! - [`Fault::Blackhole`]: a connection stops forwarding and hangs until the client gives
//!   up (bounded by [`BLACKHOLE_LIMIT`]);
//! - [`Fault::CutAfterRequest`]: the request reaches the server, then the connection is
//!   cut before the answer comes back (the write landed, the client does not know);
//! - [`Fault::CutMidAnswer`]: half of the answer is forwarded, then the connection is cut.
//!
//! Every task ends by itself: with its connection, at the proxy's drop, or at a bound.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The longest a blackholed connection is held before the proxy closes it itself.
pub const BLACKHOLE_LIMIT: Duration = Duration::from_secs(10);
/// The longest an injected delay lasts.
pub const MAX_DELAY: Duration = Duration::from_millis(250);

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Forward a request late.
    Delay,
    /// Close a new connection at once.
    Refuse,
    /// Stop forwarding on a connection, holding it open.
    Blackhole,
    /// Forward a request, then cut the connection before its answer.
    CutAfterRequest,
    /// Forward half an answer, then cut the connection.
    CutMidAnswer,
}

impl Fault {
    /// Every kind, in a fixed order.
    pub const ALL: [Fault; 5] = [
        Fault::Delay,
        Fault::Refuse,
        Fault::Blackhole,
        Fault::CutAfterRequest,
        Fault::CutMidAnswer,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// How many faults of each kind the proxy injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounts {
    /// [`Fault::Delay`]
    pub delay: u64,
    /// [`Fault::Refuse`]
    pub refuse: u64,
    /// [`Fault::Blackhole`]
    pub blackhole: u64,
    /// [`Fault::CutAfterRequest`]
    pub cut_after_request: u64,
    /// [`Fault::CutMidAnswer`]
    pub cut_mid_answer: u64,
}

impl FaultCounts {
    /// All faults together.
    pub fn total(&self) -> u64 {
        self.delay + self.refuse + self.blackhole + self.cut_after_request + self.cut_mid_answer
    }

    /// The sum of two counts.
    pub fn plus(self, other: FaultCounts) -> FaultCounts {
        FaultCounts {
            delay: self.delay + other.delay,
            refuse: self.refuse + other.refuse,
            blackhole: self.blackhole + other.blackhole,
            cut_after_request: self.cut_after_request + other.cut_after_request,
            cut_mid_answer: self.cut_mid_answer + other.cut_mid_answer,
        }
    }
}

struct Control {
    /// Faults per forwarded request (and per new connection for `Refuse`), in millionths.
    rate_ppm: AtomicU64,
    /// One fault to inject at the next chance, on command.
    queued: Mutex<Vec<Fault>>,
    rng: Mutex<fastrand::Rng>,
    counts: [AtomicU64; 5],
    /// Bumped to cut every open connection.
    generation: watch::Sender<u64>,
    closed: AtomicBool,
}

impl Control {
    /// The fault to inject now among `kinds`, if any: a queued one first, else a random
    /// draw at the current rate.
    fn draw(&self, kinds: &[Fault]) -> Option<Fault> {
        {
            let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(at) = queued.iter().position(|fault| kinds.contains(fault)) {
                return Some(queued.remove(at));
            }
        }
        let rate = self.rate_ppm.load(Ordering::Relaxed);
        if rate == 0 {
            return None;
        }
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        if rng.u64(0..1_000_000) >= rate {
            return None;
        }
        Some(kinds[rng.usize(0..kinds.len())])
    }

    fn delay(&self) -> Duration {
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        Duration::from_millis(rng.u64(1..=MAX_DELAY.as_millis() as u64))
    }

    fn count(&self, fault: Fault) {
        self.counts[fault.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// A fault-injecting TCP proxy in front of one server. Dropping it closes everything.
pub struct FaultProxy {
    addr: SocketAddr,
    control: Arc<Control>,
    tasks: JoinSet<()>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`, which must be a
    /// loopback address. `seed` drives every random choice.
    ///
    /// # Errors
    /// When `upstream` is not on loopback, or the port cannot be bound.
    pub async fn start(upstream: SocketAddr, seed: u64) -> std::io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the chaos proxy only forwards to loopback addresses",
            ));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control {
            rate_ppm: AtomicU64::new(0),
            queued: Mutex::new(Vec::new()),
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            counts: Default::default(),
            generation: watch::channel(0).0,
            closed: AtomicBool::new(false),
        });
        let mut tasks = JoinSet::new();
        let accepting = Arc::clone(&control);
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if accepting.closed.load(Ordering::Relaxed) {
                    return;
                }
                if accepting.draw(&[Fault::Refuse]).is_some() {
                    accepting.count(Fault::Refuse);
                    drop(client);
                    continue;
                }
                let control = Arc::clone(&accepting);
                connections.spawn(async move {
                    let _ = connection(client, upstream, control).await;
                });
                // Reap finished connections so the set does not grow.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            control,
            tasks,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Random faults on `parts_per_million` of requests (and of new connections, for
    /// refusals); 0 stops random faults.
    pub fn set_rate(&self, parts_per_million: u64) {
        self.control
            .rate_ppm
            .store(parts_per_million.min(1_000_000), Ordering::Relaxed);
    }

    /// Injects `fault` at the next chance (the next request, answer or connection).
    pub fn inject(&self, fault: Fault) {
        self.control
            .queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fault);
    }

    /// Cuts every open connection now (as a server restart does).
    pub fn cut_all(&self) {
        self.control.generation.send_modify(|g| *g += 1);
    }

    /// How many faults of each kind were injected so far.
    pub fn counts(&self) -> FaultCounts {
        let c = |fault: Fault| self.control.counts[fault.index()].load(Ordering::Relaxed);
        FaultCounts {
            delay: c(Fault::Delay),
            refuse: c(Fault::Refuse),
            blackhole: c(Fault::Blackhole),
            cut_after_request: c(Fault::CutAfterRequest),
            cut_mid_answer: c(Fault::CutMidAnswer),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.control.closed.store(true, Ordering::Relaxed);
        self.cut_all();
        self.tasks.abort_all();
    }
}

/// What the request side asks of the answer side.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AnswerFault {
    None,
    Drop,
    Half,
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    control: Arc<Control>,
) -> std::io::Result<()> {
    let server = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(upstream))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let (answer_fault_tx, answer_fault_rx) = watch::channel(AnswerFault::None);
    let mut cut = control.generation.subscribe();
    let requests = {
        let control = Arc::clone(&control);
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = client_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                let kinds = [
                    Fault::Delay,
                    Fault::Blackhole,
                    Fault::CutAfterRequest,
                    Fault::CutMidAnswer,
                ];
                match control.draw(&kinds) {
                    Some(Fault::Delay) => {
                        control.count(Fault::Delay);
                        tokio::time::sleep(control.delay()).await;
                    }
                    Some(Fault::Blackhole) => {
                        control.count(Fault::Blackhole);
                        // Hold the connection without forwarding until the client closes
                        // it or the limit passes.
                        let _ = tokio::time::timeout(BLACKHOLE_LIMIT, async {
                            while client_read.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                        })
                        .await;
                        return Ok(());
                    }
                    Some(fault @ (Fault::CutAfterRequest | Fault::CutMidAnswer)) => {
                        control.count(fault);
                        let _ = answer_fault_tx.send(if fault == Fault::CutAfterRequest {
                            AnswerFault::Drop
                        } else {
                            AnswerFault::Half
                        });
                    }
                    _ => {}
                }
                server_write.write_all(&buf[..n]).await?;
            }
        }
    };
    let answers = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            let fault = *answer_fault_rx.borrow();
            match fault {
                AnswerFault::Drop => return Ok(()),
                AnswerFault::Half => {
                    client_write.write_all(&buf[..n.div_ceil(2)]).await?;
                    return Ok(());
                }
                AnswerFault::None => {}
            }
            client_write.write_all(&buf[..n]).await?;
        }
    };
    // Whichever side ends (or a cut) ends the connection: both halves drop here.
    tokio::select! {
        result = requests => result,
        result = answers => result,
        _ = cut.changed() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback that answers each read with the same bytes.
    async fn echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, task)
    }

    async fn round_trip(proxy: &FaultProxy, payload: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(proxy.addr()).await?;
        stream.write_all(payload).await?;
        let mut answer = vec![0u8; payload.len()];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut answer))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?;
        read?;
        Ok(answer)
    }

    #[tokio::test]
    async fn forwards_and_injects_each_fault_on_command() {
        let (upstream, _server) = echo().await;
        let proxy = FaultProxy::start(upstream, 7).await.unwrap();
        assert_eq!(round_trip(&proxy, b"ping").await.unwrap(), b"ping");
        proxy.inject(Fault::CutAfterRequest);
        assert!(round_trip(&proxy, b"lost answer").await.is_err());
        proxy.inject(Fault::CutMidAnswer);
        assert!(round_trip(&proxy, b"half an answer").await.is_err());
        proxy.inject(Fault::Refuse);
        assert!(round_trip(&proxy, b"refused").await.is_err());
        proxy.inject(Fault::Blackhole);
        let hung = round_trip(&proxy, b"hangs").await.unwrap_err();
        assert_eq!(hung.kind(), std::io::ErrorKind::TimedOut);
        proxy.inject(Fault::Delay);
        assert_eq!(round_trip(&proxy, b"late").await.unwrap(), b"late");
        assert_eq!(
            proxy.counts(),
            FaultCounts {
                delay: 1,
                refuse: 1,
                blackhole: 1,
                cut_after_request: 1,
                cut_mid_answer: 1
            }
        );
        assert_eq!(
            round_trip(&proxy, b"healthy again").await.unwrap(),
            b"healthy again"
        );
    }

    #[tokio::test]
    async fn random_faults_follow_the_seed_and_stop_at_rate_zero() {
        let (upstream, _server) = echo().await;
        let proxy = FaultProxy::start(upstream, 42).await.unwrap();
        proxy.set_rate(200_000);
        let mut failures = 0;
        for _ in 0..40 {
            if round_trip(&proxy, b"x").await.is_err() {
                failures += 1;
            }
        }
        assert!(proxy.counts().total() > 0, "{:?}", proxy.counts());
        assert!(failures > 0);
        proxy.set_rate(0);
        for _ in 0..10 {
            assert_eq!(round_trip(&proxy, b"y").await.unwrap(), b"y");
        }
    }

    #[tokio::test]
    async fn refuses_to_forward_off_loopback() {
        let remote: SocketAddr = "192.0.2.1:5432".parse().unwrap();
        assert!(FaultProxy::start(remote, 1).await.is_err());
    }
}
