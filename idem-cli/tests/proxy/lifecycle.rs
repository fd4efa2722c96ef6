//! The process: a second SIGTERM, a configuration mistake (its file, line and exit
//! code), and `--check`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use idem_testkit::Namespace;

use crate::support::{free_port, replica, wait_for};

#[test]
fn a_second_sigterm_stops_at_once() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let namespace = Namespace::fresh();
    let config = dir.join(format!("idem-proxy-term-{}.toml", namespace.as_str()));
    let db = dir.join(format!("idem-proxy-term-{}.db", namespace.as_str()));
    // A long shutdown delay: the first SIGTERM alone would keep it serving for a minute.
    std::fs::write(
        &config,
        format!(
            r#"
            upstream = "http://127.0.0.1:{}"
            store = "sqlite://{}"
            migrate = true
            shutdown_delay = "60s"
            "#,
            free_port(),
            db.display()
        ),
    )
    .unwrap();
    let (mut proxy, _, admin) = replica(&config, &[], dir.join("term.log"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(wait_for(
        &format!("http://{admin}/readyz"),
        Duration::from_secs(20),
    ));
    let pid = proxy.0.id().to_string();
    let term = || {
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
    };
    term();
    // The first one began a graceful shutdown: not ready, still running.
    let started = Instant::now();
    loop {
        let ready = runtime.block_on(async {
            reqwest::get(format!("http://{admin}/readyz"))
                .await
                .map(|r| r.status().as_u16())
                .ok()
        });
        if ready == Some(503) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not unready after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        proxy.0.try_wait().unwrap().is_none(),
        "gone before its delay"
    );
    term();
    let started = Instant::now();
    let code = loop {
        if let Some(code) = proxy.0.try_wait().unwrap() {
            break code;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no exit after a second SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code.code(), Some(143), "a cut shutdown is not a clean one");
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&db);
}

#[test]
fn a_configuration_mistake_names_the_file_and_line_and_exits_2() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let config = dir.join(format!(
        "idem-proxy-bad-{}.toml",
        Namespace::fresh().as_str()
    ));
    std::fs::write(
        &config,
        "upstream = \"http://127.0.0.1:1\"\n\n[[routes]]\nmethods = [\"POST\"]\npath = \"/payments\"\nscope = { header = \"x-account-id\" }\nlease = \"soon\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["proxy", "--check", "--config"])
        .arg(&config)
        .env_remove("IDEM_STORE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:7:9:", config.display())),
        "file, line and column: {stderr}"
    );
    assert!(stderr.contains("\"30s\""), "what to write: {stderr}");
    let _ = std::fs::remove_file(&config);
}

#[test]
fn check_opens_the_store_and_exits_without_serving() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let name = Namespace::fresh();
    let config = dir.join(format!("idem-proxy-check-{}.toml", name.as_str()));
    let db = dir.join(format!("idem-proxy-check-{}.db", name.as_str()));
    std::fs::write(
        &config,
        format!(
            "upstream = \"http://127.0.0.1:1\"\nstore = \"sqlite://{}\"\nmigrate = true\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[defaults]\nscope = {{ header = \"x-account-id\" }}\n[[routes]]\nmethods = [\"POST\"]\npath = \"/payments\"\n",
            db.display()
        ),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["proxy", "--check", "--config"])
        .arg(&config)
        .env_remove("IDEM_STORE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("listening on http://127.0.0.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("not serving"), "{stdout}");
    assert!(db.exists(), "migrate = true created the database");
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&db);
}
