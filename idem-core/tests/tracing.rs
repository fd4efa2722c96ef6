//! What `execute` writes to `tracing`: a short hash of the key, never the key, the
//! fingerprint or the response.
//!
//! Alone in its own test binary: `tracing` caches per-callsite interest process-wide, so a
//! test elsewhere in the same process that reached these callsites first with no subscriber
//! would hide them from this one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Fingerprint, Heartbeat, Idempotency, Key, ManualClock, MemoryStore, WorkError};

const LEASE: Duration = Duration::from_secs(3);

fn fp() -> Fingerprint {
    Fingerprint::of_bytes("amount=500")
}

fn store() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::with_clock(clock.clone()), clock)
}

#[test]
fn traces_carry_a_short_hash_never_the_key() {
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let secret = Key::new("acct_secret/payments.create", "key-secret-1187").unwrap();
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (store, clock) = store();
            let idem = Idempotency::builder(store)
                .lease(LEASE)
                .heartbeat(Heartbeat::Off)
                .build()
                .unwrap();
            let _ = idem
                .execute(&secret, fp(), |_ctx| async {
                    Err::<u8, _>(WorkError::Unknown(()))
                })
                .await;
            clock.advance(LEASE);
            let _ = idem
                .execute(&secret, fp(), |_ctx| async {
                    Ok::<_, WorkError<()>>("response-secret".to_string())
                })
                .await;
            let _ = idem
                .execute(&secret, fp(), |_ctx| async {
                    Ok::<_, WorkError<()>>("response-secret".to_string())
                })
                .await;
        });
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains(&secret.short_hash().to_string()),
        "spans carry the short hash:\n{logs}"
    );
    assert!(
        logs.contains("outcome=\"executed\"") || logs.contains("outcome=executed"),
        "{logs}"
    );
    assert!(logs.contains("took over"), "{logs}");
    assert!(
        !logs.contains("secret"),
        "the key or response leaked into the logs:\n{logs}"
    );
}
