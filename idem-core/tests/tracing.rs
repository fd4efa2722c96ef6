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
            // Another request under the key: an error that is no replay.
            let mismatch = idem
                .execute(&secret, Fingerprint::of_bytes("other"), |_ctx| async {
                    Ok::<_, WorkError<()>>(1)
                })
                .await;
            assert!(mismatch.is_err());
            // A result too large to store, then its retry: the stored failure replayed.
            let small = Idempotency::builder(MemoryStore::new())
                .lease(LEASE)
                .heartbeat(Heartbeat::Off)
                .max_response_bytes(4)
                .build()
                .unwrap();
            let large = Key::new("exports", "large").unwrap();
            for _ in 0..2 {
                let _ = small
                    .execute(&large, fp(), |_ctx| async {
                        Ok::<_, WorkError<()>>("more than four bytes".to_string())
                    })
                    .await;
            }
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
    for outcome in ["mismatch", "replayed_failure"] {
        assert!(
            logs.contains(&format!("outcome=\"{outcome}\""))
                || logs.contains(&format!("outcome={outcome}")),
            "no span with outcome {outcome}:\n{logs}"
        );
    }
    assert!(
        !logs.contains("secret"),
        "the key or response leaked into the logs:\n{logs}"
    );
}

/// A memory store whose completions wait for a go-ahead, and which notes the span each
/// one runs in.
#[derive(Clone, Default)]
struct HeldCompletions {
    inner: MemoryStore,
    started: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
    spans: Arc<Mutex<Vec<Option<&'static str>>>>,
}

#[async_trait::async_trait]
impl idem_core::Store for HeldCompletions {
    async fn claim(
        &self,
        request: &idem_core::store::ClaimRequest,
    ) -> Result<idem_core::store::ClaimOutcome, idem_core::StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(
        &self,
        lease: &idem_core::record::Lease,
        response: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        let go = self.go.notified();
        self.started.notify_one();
        go.await;
        let span = tracing::Span::current().metadata().map(|meta| meta.name());
        self.spans.lock().unwrap().push(span);
        self.inner.complete(lease, response).await
    }
    async fn fail(
        &self,
        lease: &idem_core::record::Lease,
        response: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        self.inner.fail(lease, response).await
    }
    async fn release(
        &self,
        lease: &idem_core::record::Lease,
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        self.inner.release(lease).await
    }
    async fn renew(
        &self,
        lease: &idem_core::record::Lease,
        extend: Duration,
    ) -> Result<idem_core::store::RenewOutcome, idem_core::StoreError> {
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &idem_core::record::Lease,
        step: &idem_core::key::StepName,
        value: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<idem_core::Record>, idem_core::StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, idem_core::StoreError> {
        self.inner.purge_expired(limit).await
    }
}

/// A result's write that the caller left unfinished (a client that hung up) goes on in a
/// task of its own, still in the `idem.execute` span, so its logs say which execution
/// they belong to.
#[test]
fn a_write_finished_after_the_caller_left_stays_in_its_span() {
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(std::io::sink)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = HeldCompletions::default();
            let idem = Idempotency::builder(store.clone())
                .lease(LEASE)
                .heartbeat(Heartbeat::Off)
                .build()
                .unwrap();
            let key = Key::new("acct_7/payments.create", "left-1").unwrap();
            let execution = idem.execute(&key, fp(), |_ctx| async { Ok::<_, WorkError<()>>(7u8) });
            tokio::select! {
                _ = execution => panic!("the completion was held: execute cannot have ended"),
                () = store.started.notified() => {}
            }
            // `execute` is dropped with its completion under way; the write goes on.
            store.go.notify_one();
            for _ in 0..200 {
                if !store.spans.lock().unwrap().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(*store.spans.lock().unwrap(), vec![Some("idem.execute")]);
            let record = idem_core::Store::get(&store.inner, &key)
                .await
                .unwrap()
                .expect("the result was stored");
            assert_eq!(record.state, idem_core::record::State::Completed);
        });
    });
}
