//! What the tests share: child processes killed when a test ends, free ports, waiting
//! for an answer, and one `idem proxy` replica.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when the test ends, however it ends.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `url` answers 200, for at most `patience`.
pub(crate) async fn wait_for(url: &str, patience: Duration) {
    let started = Instant::now();
    let client = reqwest::Client::new();
    while started.elapsed() < patience {
        if let Ok(response) = client.get(url).send().await
            && response.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} did not answer within {patience:?}");
}

/// One `idem proxy` replica; its address, read from what it prints.
pub(crate) fn replica(
    config: &Path,
    store: &[String],
    log: PathBuf,
) -> (Killed, SocketAddr, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(store)
        .args(["proxy", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_TABLE")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start idem proxy");
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    // "idem proxy: listening on http://ADDR (admin on http://ADDR), store ..."; the
    // migration's line may come first. Read on a thread of its own, waited for 30 s.
    let (lines, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().take(5) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(line) = said.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let line = line.expect("read the proxy's output");
        if let Some(rest) = line.strip_prefix("idem proxy: listening on http://") {
            let (addr, rest) = rest.split_once(' ').unwrap();
            let admin = rest
                .trim_start_matches("(admin on http://")
                .split_once(')')
                .unwrap()
                .0;
            return (child, addr.parse().unwrap(), admin.parse().unwrap());
        }
    }
    panic!("idem proxy did not say where it listens");
}
