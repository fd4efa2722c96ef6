//! Several processes on one database file: a worker killed mid-work, and a race.
//!
//! A custom harness (`harness = false`): the binary runs the tests, and runs as a worker
//! process when `IDEM_SQLITE_WORKER` names a role.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idem_core::{
    Error, Fingerprint, Idempotency, Key, ManualClock, State, Store, Timestamp, WorkError,
};
use idem_sqlite::SqliteStore;
use rusqlite::Connection;

const ROLE: &str = "IDEM_SQLITE_WORKER";
const DB: &str = "IDEM_SQLITE_WORKER_DB";
const GO: &str = "IDEM_SQLITE_WORKER_GO";
/// The worker's lease: long, so only the parent's clock (moved forward) sees it expire.
const LEASE: Duration = Duration::from_secs(600);
const RACERS: usize = 6;
const RACE_KEYS: usize = 8;
/// Every wait in this file gives up after this long: nothing here hangs.
const PATIENCE: Duration = Duration::from_secs(60);

fn key(name: &str) -> Key {
    Key::new("shop/checkout", name).expect("valid")
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes("amount=500")
}

/// The side effects, counted in the database itself, not in any process's memory.
fn effects(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open the database");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, pid INTEGER NOT NULL)",
    )
    .expect("effects table");
    conn
}

fn record_effect(path: &Path, key: &str) {
    effects(path)
        .execute(
            "INSERT INTO effects VALUES (?1, ?2)",
            rusqlite::params![key, std::process::id()],
        )
        .expect("record the effect");
}

fn count_effects(path: &Path, key: &str) -> i64 {
    effects(path)
        .query_row(
            "SELECT count(*) FROM effects WHERE key = ?1",
            [key],
            |row| row.get(0),
        )
        .expect("count effects")
}

fn driver(store: SqliteStore) -> Idempotency<SqliteStore> {
    Idempotency::builder(store)
        .lease(LEASE)
        .build()
        .expect("valid settings")
}

// ---- worker roles -------------------------------------------------------------------

/// Debits (a checkpointed step), says so, then hangs until it is killed.
async fn worker_debit_then_hang(path: PathBuf) {
    let idem = driver(SqliteStore::open(&path).expect("open"));
    let _ = idem
        .execute(&key("crash"), fingerprint(), |ctx| async move {
            ctx.step("debit", || async {
                record_effect(&path, "crash");
                Ok::<_, WorkError<()>>(500_u64)
            })
            .await?;
            println!("debited");
            tokio::time::sleep(PATIENCE).await;
            Ok::<_, WorkError<()>>("worker".to_string())
        })
        .await;
}

/// Waits for the go signal, then races the other workers over the same keys.
async fn worker_race(path: PathBuf, go: PathBuf) {
    let idem = driver(SqliteStore::open(&path).expect("open"));
    let started = Instant::now();
    while !go.exists() {
        assert!(started.elapsed() < PATIENCE, "no go signal");
        std::thread::sleep(Duration::from_millis(1));
    }
    for n in 0..RACE_KEYS {
        let name = format!("race-{n}");
        let path = path.clone();
        let outcome = idem
            .execute(&key(&name), fingerprint(), |_ctx| async move {
                record_effect(&path, &name);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, WorkError<()>>(std::process::id())
            })
            .await;
        let word = match outcome {
            Ok(done) if done.replayed() => "replayed",
            Ok(_) => "executed",
            Err(Error::InFlight { .. }) => "in_flight",
            Err(other) => panic!("unexpected outcome: {other}"),
        };
        println!("race-{n} {word}");
    }
}

// ---- the tests --------------------------------------------------------------------------

fn spawn_worker(role: &str, path: &Path, go: Option<&Path>) -> Child {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .env(ROLE, role)
        .env(DB, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(go) = go {
        command.env(GO, go);
    }
    command.spawn().expect("spawn a worker process")
}

/// Waits for a worker to exit, killing it if it overstays.
fn wait_bounded(child: &mut Child) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for a worker") {
            return status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("a worker did not finish in {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

async fn a_worker_killed_mid_work_is_taken_over_once() {
    let path = common::fresh_db_path();
    let _ = effects(&path);
    let mut worker = spawn_worker("debit-then-hang", &path, None);
    let stdout = worker.stdout.take().expect("piped stdout");
    let (lines, said) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let first = said.recv_timeout(PATIENCE).expect("the worker debits");
    assert_eq!(first, "debited");
    worker.kill().expect("SIGKILL the worker mid-work");
    worker.wait().expect("reap the worker");

    // While the dead worker's lease is live, a retry is told the payment is in flight.
    let idem = driver(SqliteStore::open(&path).expect("open"));
    let runs = std::sync::atomic::AtomicUsize::new(0);
    let retry = idem
        .execute(&key("crash"), fingerprint(), |_ctx| async {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, WorkError<()>>("too early".to_string())
        })
        .await;
    assert!(matches!(retry, Err(Error::InFlight { .. })), "{retry:?}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);

    // Once it has expired (this process's clock moved past the lease), a retry takes over
    // and resumes after the debit.
    let later = ManualClock::starting_at(Timestamp::now().saturating_add(LEASE));
    let idem = driver(
        SqliteStore::builder(&path)
            .clock(later)
            .build()
            .expect("open"),
    );
    let done = idem
        .execute(&key("crash"), fingerprint(), |ctx| {
            let path = path.clone();
            async move {
                assert!(ctx.resumed(), "a takeover");
                let debit: u64 = ctx
                    .step("debit", || async {
                        record_effect(&path, "crash");
                        Ok::<_, WorkError<()>>(999)
                    })
                    .await?;
                Ok::<_, WorkError<()>>(format!("recovered, debit {debit}"))
            }
        })
        .await
        .expect("the takeover finishes");
    let done = done.value().expect("the takeover completed");
    assert_eq!(
        done, "recovered, debit 500",
        "the dead worker's checkpoint was reused"
    );
    assert_eq!(
        count_effects(&path, "crash"),
        1,
        "the debit happened exactly once"
    );
    let record = idem
        .store()
        .get(&key("crash"))
        .await
        .unwrap()
        .expect("a record");
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.token, 2);
    let replay = idem
        .execute(&key("crash"), fingerprint(), |_ctx| async {
            Ok::<_, WorkError<()>>(String::new())
        })
        .await
        .unwrap();
    assert!(replay.replayed());
    assert_eq!(replay.value(), Some(done));
}

async fn processes_racing_one_key_run_the_work_once() {
    let path = common::fresh_db_path();
    let _ = effects(&path);
    let _ = SqliteStore::open(&path).expect("create the schema before the race");
    let go = path.with_extension("go");
    let mut workers: Vec<Child> = (0..RACERS)
        .map(|_| spawn_worker("race", &path, Some(&go)))
        .collect();
    std::fs::write(&go, b"go").expect("the go signal");
    let mut executed = [0; RACE_KEYS];
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for worker in &mut workers {
        let mut out = String::new();
        std::io::Read::read_to_string(worker.stdout.as_mut().expect("piped"), &mut out)
            .expect("worker output");
        assert!(wait_bounded(worker).success(), "a worker failed:\n{out}");
        for line in out.lines() {
            let (name, word) = line.split_once(' ').expect("'key outcome'");
            let n: usize = name
                .trim_start_matches("race-")
                .parse()
                .expect("a key number");
            executed[n] += usize::from(word == "executed");
            *tally.entry(word.to_owned()).or_default() += 1;
        }
    }
    println!("  {RACERS} processes x {RACE_KEYS} keys: {tally:?}");
    for (n, executions) in executed.iter().enumerate() {
        assert_eq!(
            *executions, 1,
            "race-{n}: executions reported by {RACERS} processes"
        );
        assert_eq!(
            count_effects(&path, &format!("race-{n}")),
            1,
            "race-{n}: side effects in the table"
        );
    }
}

fn main() -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Ok(role) = std::env::var(ROLE) {
        let path = PathBuf::from(std::env::var(DB).expect("worker database"));
        match role.as_str() {
            "debit-then-hang" => runtime.block_on(worker_debit_then_hang(path)),
            "race" => runtime.block_on(worker_race(
                path,
                PathBuf::from(std::env::var(GO).expect("go")),
            )),
            other => panic!("unknown worker role {other}"),
        }
        return ExitCode::SUCCESS;
    }
    type Test = fn(&tokio::runtime::Runtime);
    let tests: [(&str, Test); 2] = [
        ("a_worker_killed_mid_work_is_taken_over_once", |rt| {
            rt.block_on(a_worker_killed_mid_work_is_taken_over_once())
        }),
        ("processes_racing_one_key_run_the_work_once", |rt| {
            rt.block_on(processes_racing_one_key_run_the_work_once())
        }),
    ];
    // The test harness's own arguments, as cargo test and cargo-nextest pass them:
    // `--list` (nextest asks for `name: test` lines; none are ignored), and a filter
    // (a name, exact with `--exact`), `--skip NAME`; other flags change nothing.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let listing = args.iter().any(|a| a == "--list");
    let exact = args.iter().any(|a| a == "--exact");
    let ignored_only = args.iter().any(|a| a == "--ignored");
    // The first argument that is neither a flag nor a flag's value (`--format terse`).
    let takes_value = [
        "--format",
        "--test-threads",
        "--logfile",
        "--color",
        "--skip",
        "-Z",
    ];
    let filter = args
        .iter()
        .enumerate()
        .find(|(i, a)| {
            !a.starts_with('-') && (*i == 0 || !takes_value.contains(&args[i - 1].as_str()))
        })
        .map(|(_, a)| a.clone());
    let chosen: Vec<(&str, Test)> = tests
        .into_iter()
        .filter(|(name, _)| match &filter {
            None => true,
            Some(f) if exact => name == f,
            Some(f) => name.contains(f.as_str()),
        })
        .filter(|(name, _)| {
            !args
                .windows(2)
                .any(|pair| pair[0] == "--skip" && name.contains(pair[1].as_str()))
        })
        .filter(|_| !ignored_only)
        .collect();
    if listing {
        for (name, _) in &chosen {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let mut failed = 0;
    for (name, test) in &chosen {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&runtime))).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        failed += usize::from(!ok);
    }
    println!("{} passed, {failed} failed", chosen.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
