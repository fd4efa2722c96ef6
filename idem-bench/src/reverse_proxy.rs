//! `idem proxy` against calling its upstream directly and against a plain reverse proxy
//! (nginx) in front of the same upstream: latency percentiles and throughput, for first
//! requests (fresh keys) and retries (replays of stored answers).
//!
//! The upstream is a small axum service on a thread and runtime of its own in this process
//! (apart from the load's), answering `201` with a JSON body of 60 bytes; nginx (`worker_processes auto`, keep-alive to the upstream) and the `idem`
//! binary run as processes of their own, as they are deployed. One client (reqwest, kept
//! alive connections) drives every target the same way: `clients` tasks, each sending its
//! next request when the last is answered, for `seconds`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use serde::Serialize;

use crate::target::BoxError;

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub(crate) target: String,
    pub(crate) requests: &'static str,
    pub(crate) clients: usize,
    pub(crate) per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

/// A process stopped when dropped: asked with SIGTERM first, so that nginx's master
/// stops its workers (a SIGKILLed master leaves them running, on the port) and `idem
/// proxy` shuts down as it would in service; killed if it has not ended 3 s later.
pub(crate) struct Process(Child);

impl Process {
    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let asked = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .is_ok_and(|status| status.success());
        if asked {
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if matches!(self.0.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) async fn upstream() -> Result<SocketAddr, BoxError> {
    let app = Router::new().route(
        "/payments",
        post(|| async {
            (
                axum::http::StatusCode::CREATED,
                [("content-type", "application/json")],
                r#"{"charge":"ch_1","amount":500,"currency":"EUR","ok":true}"#,
            )
        }),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the upstream's runtime");
        runtime.block_on(async move {
            let listener =
                tokio::net::TcpListener::from_std(listener).expect("the upstream's listener");
            let _ = axum::serve(listener, app).await;
        });
    });
    Ok(addr)
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn wait_until_answers(addr: SocketAddr) -> Result<(), BoxError> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{addr} did not accept connections within 10 s").into())
}

/// nginx in front of `upstream`, when it is installed.
async fn nginx(
    upstream: SocketAddr,
    dir: &Path,
) -> Result<Option<(Process, SocketAddr)>, BoxError> {
    let Some(binary) = ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!(
            "reverse proxy: nginx is not installed (apt-get install nginx): its rows are left out"
        );
        return Ok(None);
    };
    let port = free_port()?;
    let prefix = dir.join("nginx");
    std::fs::create_dir_all(prefix.join("logs"))?;
    let temp = prefix.display();
    let conf = format!(
        r#"worker_processes auto;
daemon off;
pid {temp}/nginx.pid;
error_log {temp}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  upstream service {{ server {upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://service;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"#
    );
    let path = prefix.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let child = Command::new(binary)
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let process = Process(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_until_answers(addr).await?;
    Ok(Some((process, addr)))
}

/// `idem proxy` in front of `upstream`, on `store` (URL and flags).
pub(crate) async fn idem_proxy(
    idem: &Path,
    upstream: SocketAddr,
    store: &[String],
    dir: &Path,
    name: &str,
) -> Result<(Process, SocketAddr), BoxError> {
    let config = dir.join(format!("proxy-{name}.toml"));
    let port = free_port()?;
    let admin = free_port()?;
    std::fs::write(
        &config,
        format!(
            r#"upstream = "http://{upstream}"
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin}"
migrate = true

[defaults]
scope = {{ header = "x-account-id" }}

[[routes]]
methods = ["POST"]
path = "/payments"
"#
        ),
    )?;
    let child = Command::new(idem)
        .args(store)
        .arg("proxy")
        .arg("--config")
        .arg(&config)
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_TABLE")
        .env_remove("IDEM_PREFIX")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(
            dir.join(format!("proxy-{name}.log")),
        )?)
        .spawn()?;
    let process = Process(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_until_answers(addr).await?;
    Ok((process, addr))
}

/// Which keys the requests carry.
#[derive(Clone, Copy)]
enum Keys {
    /// A new key each time: every request reaches the upstream.
    Fresh,
    /// One of `pool` keys answered before: every request is a replay.
    Replay { pool: u64 },
}

/// `clients` tasks sending requests to `addr` for `seconds`; requests a second and the
/// latency percentiles.
async fn load(
    addr: SocketAddr,
    clients: usize,
    seconds: f64,
    keys: Keys,
    run: &str,
) -> Result<(f64, f64, f64), BoxError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = format!("http://{addr}/payments");
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, next, run) = (
            client.clone(),
            url.clone(),
            Arc::clone(&next),
            run.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let key = match keys {
                    Keys::Fresh => format!("{run}-{n}"),
                    Keys::Replay { pool } => format!("{run}-{}", n % pool),
                };
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header("x-account-id", "acct_bench")
                    .header("idempotency-key", key)
                    .header("content-type", "application/json")
                    .body(r#"{"amount":500,"currency":"EUR"}"#)
                    .send()
                    .await?;
                let status = response.status();
                response.bytes().await?;
                if status.as_u16() != 201 {
                    return Err(format!("{url} answered {status}").into());
                }
                latencies.push(sent.elapsed());
            }
            Ok::<_, BoxError>(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    if all.is_empty() {
        return Err("no request completed".into());
    }
    all.sort();
    let pct = |p: f64| all[((all.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    Ok((all.len() as f64 / elapsed, pct(0.5), pct(0.99)))
}

/// Measures every target; `stores` are (name, `idem` flags naming the store).
pub(crate) async fn run(
    idem: &Path,
    stores: &[(String, Vec<String>)],
    clients: &[usize],
    seconds: f64,
    rounds: usize,
    dir: &Path,
) -> Result<Vec<Row>, BoxError> {
    let upstream = upstream().await?;
    let nginx = nginx(upstream, dir).await?;
    let mut targets: Vec<(String, SocketAddr, Vec<&'static str>, Option<Process>)> =
        vec![("direct".into(), upstream, vec!["any"], None)];
    if let Some((process, addr)) = nginx {
        targets.push(("nginx".into(), addr, vec!["any"], Some(process)));
    }
    for (name, flags) in stores {
        let (process, addr) = idem_proxy(idem, upstream, flags, dir, name).await?;
        targets.push((
            format!("idem proxy, {name}"),
            addr,
            vec!["fresh", "replay"],
            Some(process),
        ));
    }
    let pool = 1_000;
    let run_id = std::process::id();
    // Keys are made of the target's name: letters and digits only.
    let slug = |name: &str| -> String {
        name.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect()
    };
    // The replay pool: answered once through each proxy before any timing.
    for (name, addr, modes, _) in &targets {
        if modes.contains(&"replay") {
            load_pool(*addr, pool, &format!("{run_id}-{}-replay", slug(name))).await?;
        }
    }
    let mut rows = Vec::new();
    for &clients in clients {
        for (name, addr, modes, _) in &targets {
            for &mode in modes {
                let mut samples = Vec::new();
                for round in 0..rounds {
                    let keys = match mode {
                        "replay" => Keys::Replay { pool },
                        _ => Keys::Fresh,
                    };
                    let run = match mode {
                        "replay" => format!("{run_id}-{}-replay", slug(name)),
                        _ => format!("{run_id}-{}-{clients}-{round}", slug(name)),
                    };
                    samples.push(load(*addr, clients, seconds, keys, &run).await?);
                }
                // The round with the median throughput.
                samples.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (per_sec, p50_us, p99_us) = samples[samples.len() / 2];
                eprintln!(
                    "  {name} {mode} x{clients}: {per_sec:.0}/s, p50 {p50_us:.0} µs, p99 {p99_us:.0} µs"
                );
                rows.push(Row {
                    target: name.clone(),
                    requests: mode,
                    clients,
                    per_sec,
                    p50_us,
                    p99_us,
                });
            }
        }
    }
    drop(targets);
    Ok(rows)
}

/// Answers `pool` keys once, so that later requests with them are replays.
async fn load_pool(addr: SocketAddr, pool: u64, run: &str) -> Result<(), BoxError> {
    let client = reqwest::Client::new();
    for n in 0..pool {
        let response = client
            .post(format!("http://{addr}/payments"))
            .header("x-account-id", "acct_bench")
            .header("idempotency-key", format!("{run}-{n}"))
            .header("content-type", "application/json")
            .body(r#"{"amount":500,"currency":"EUR"}"#)
            .send()
            .await?;
        if response.status().as_u16() != 201 {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(format!("preparing the replay pool: {status}: {body}").into());
        }
    }
    Ok(())
}

pub(crate) fn print(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!("\n## idem proxy against direct calls and nginx\n");
    println!("| target | requests | clients | requests/s | p50 µs | p99 µs |");
    println!("|---|---|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} |",
            row.target, row.requests, row.clients, row.per_sec, row.p50_us, row.p99_us
        );
    }
}
