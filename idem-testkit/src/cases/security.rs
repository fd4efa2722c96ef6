//! Driver-level security scenarios on any store: encryption at rest, key policies, key
//! budgets and provider keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::record::ValuePart;
use idem_core::{
    Aes256GcmCodec, Codec, Error, Fingerprint, Idempotency, KeyPolicy, Outcome, Store, WorkError,
    codec::CodecError, codec::StoredAt, driver::Provider, driver::TokenBucket, key::StepName,
    store::WriteOutcome,
};

use crate::Capabilities;
use crate::cases::driver::builder;
use crate::support::{HOUR, SHORT_LEASE, claimed, get_some, key, let_time_pass, ok};

const OLD_KEY: [u8; 32] = [0x11; 32];
const NEW_KEY: [u8; 32] = [0x22; 32];
const SECRET_RESULT: &str = "Ada Lovelace, card ending 4242";
const SECRET_STEP: &str = "iban DE89 3704 0044 0532 0130 00";
const SECRET_FAILURE: &str = "declined for Ada Lovelace";

fn encrypted(store: Arc<dyn Store>, codec: Aes256GcmCodec) -> Idempotency<Arc<dyn Store>> {
    builder(store, SHORT_LEASE)
        .codec(codec)
        .build()
        .expect("valid driver settings")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

pub(crate) async fn encrypted_values_are_not_plaintext_at_rest(store: Arc<dyn Store>) {
    let old = encrypted(Arc::clone(&store), Aes256GcmCodec::new(1, OLD_KEY));
    let (done, failed) = (key("payments", "sealed"), key("payments", "sealed-failure"));
    let fingerprint = Fingerprint::of_bytes("req");
    let first = old
        .execute(&done, fingerprint, |ctx| async move {
            let iban: String = ctx
                .step("lookup", || async {
                    Ok::<_, WorkError<String>>(SECRET_STEP.to_string())
                })
                .await?;
            Ok::<_, WorkError<String>>(format!("{SECRET_RESULT} / {}", iban.len()))
        })
        .await
        .expect("an encrypted execution completes");
    assert!(!first.replayed());
    let refused = old
        .execute(&failed, fingerprint, |_ctx| async {
            Err::<String, _>(WorkError::Permanent(SECRET_FAILURE.to_string()))
        })
        .await
        .expect("an encrypted failure is stored");
    assert!(matches!(refused, Outcome::Failed { .. }), "{refused:?}");

    let record = get_some(store.as_ref(), &done).await;
    let response = record
        .response
        .as_deref()
        .expect("a completed record has a response");
    assert!(
        !contains(response, SECRET_RESULT) && !contains(response, "Ada"),
        "the stored result holds the plaintext"
    );
    assert_eq!(response[1..5], 1u32.to_be_bytes(), "key id 1 in the header");
    let step = record
        .steps
        .get("lookup")
        .expect("the step is checkpointed");
    assert!(
        !contains(step, "DE89"),
        "the stored checkpoint holds the plaintext"
    );
    let failure = get_some(store.as_ref(), &failed).await;
    let failure = failure
        .response
        .as_deref()
        .expect("a failed record has a response");
    assert!(
        !contains(failure, "Lovelace"),
        "the stored failure holds the plaintext"
    );

    // Rotation: the new key encrypts, the old one still decodes.
    let rotated = encrypted(
        Arc::clone(&store),
        Aes256GcmCodec::new(2, NEW_KEY)
            .with_old_key(1, OLD_KEY)
            .expect("distinct ids"),
    );
    let runs = AtomicUsize::new(0);
    let replay = rotated
        .execute(&done, fingerprint, |_ctx| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<String>>("never".to_string())
        })
        .await
        .expect("the old key still decodes after rotation");
    assert_eq!(
        replay,
        Outcome::Completed {
            value: first.clone().value().expect("completed"),
            replayed: true
        }
    );
    let fresh = key("payments", "sealed-after-rotation");
    rotated
        .execute(&fresh, fingerprint, |_ctx| async {
            Ok::<_, WorkError<String>>(SECRET_RESULT.to_string())
        })
        .await
        .expect("a new record after rotation");
    let record = get_some(store.as_ref(), &fresh).await;
    assert_eq!(
        record.response.as_deref().expect("completed")[1..5],
        2u32.to_be_bytes(),
        "new records use the newest key"
    );

    // The old key retired while its records live: a typed error, never a rerun.
    let retired = encrypted(Arc::clone(&store), Aes256GcmCodec::new(2, NEW_KEY));
    let answer = retired
        .execute(&done, fingerprint, |_ctx| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<String>>("never".to_string())
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(Error::Codec {
                source: CodecError::UnknownKeyId { id: 1 },
                ..
            })
        ),
        "a retired key: {answer:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the work never ran again");
}

/// Writes `bytes` as the completed result of a fresh record under `k`.
async fn plant(store: &dyn Store, k: &idem_core::Key, fingerprint: Fingerprint, bytes: &[u8]) {
    let request = idem_core::store::ClaimRequest::new(k.clone(), fingerprint, HOUR, HOUR);
    let (lease, _, _) = claimed(store, &request).await;
    let written = ok(store.complete(&lease, bytes).await, "complete");
    assert_eq!(written, WriteOutcome::Applied);
}

pub(crate) async fn encrypted_records_refuse_copies_and_tampering(
    store: Arc<dyn Store>,
    caps: &Capabilities,
) {
    let codec = Aes256GcmCodec::new(1, OLD_KEY);
    let idem = encrypted(Arc::clone(&store), Aes256GcmCodec::new(1, OLD_KEY));
    let fingerprint = Fingerprint::of_bytes("req");
    let runs = AtomicUsize::new(0);
    let work = |_ctx| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, WorkError<String>>("would run again".to_string())
    };
    let original = key("payments", "original");
    idem.execute(&original, fingerprint, |_ctx| async {
        Ok::<_, WorkError<String>>(SECRET_RESULT.to_string())
    })
    .await
    .expect("the original completes");
    let sealed = get_some(store.as_ref(), &original)
        .await
        .response
        .expect("completed");

    let at = |k, part| StoredAt {
        key: k,
        fingerprint: &fingerprint,
        part,
    };
    let copied = key("payments", "copied");
    let flipped = key("payments", "flipped");
    let swapped = key("payments", "failure-as-result");
    let plain = key("payments", "plaintext");
    plant(store.as_ref(), &copied, fingerprint, &sealed).await;
    let mut tampered = codec
        .encode(&at(&flipped, ValuePart::Result), b"\"ok\"".to_vec())
        .expect("encodes");
    let last = tampered.len() - 1;
    tampered[last] ^= 0x01;
    plant(store.as_ref(), &flipped, fingerprint, &tampered).await;
    let failure_bytes = codec
        .encode(&at(&swapped, ValuePart::Failure), b"\"ok\"".to_vec())
        .expect("encodes");
    plant(store.as_ref(), &swapped, fingerprint, &failure_bytes).await;
    plant(store.as_ref(), &plain, fingerprint, b"\"written in clear\"").await;
    // A later lifetime of a key, for another request, holding the earlier request's
    // ciphertext: it answers the earlier request, not this one.
    let relived = key("payments", "another-lifetime");
    let later_request = Fingerprint::of_bytes("another request");
    let earlier = codec
        .encode(&at(&relived, ValuePart::Result), b"\"ok\"".to_vec())
        .expect("encodes");
    plant(store.as_ref(), &relived, later_request, &earlier).await;
    let answer = idem.execute(&relived, later_request, work).await;
    assert!(
        matches!(
            answer,
            Err(Error::Codec {
                source: CodecError::Unauthentic { id: 1 },
                ..
            })
        ),
        "another request's ciphertext under the same key: {answer:?}"
    );

    for (k, what) in [
        (&copied, "a ciphertext copied from another record"),
        (&flipped, "a ciphertext with one bit flipped"),
        (&swapped, "a failure's ciphertext stored as a result"),
    ] {
        let answer = idem.execute(k, fingerprint, work).await;
        assert!(
            matches!(
                answer,
                Err(Error::Codec {
                    source: CodecError::Unauthentic { id: 1 },
                    ..
                })
            ),
            "{what}: {answer:?}"
        );
        assert!(
            get_some(store.as_ref(), k).await.response.is_some(),
            "{what}: the record stays for an operator to inspect"
        );
    }
    let answer = idem.execute(&plain, fingerprint, work).await;
    assert!(
        matches!(
            answer,
            Err(Error::Codec {
                source: CodecError::Malformed { .. },
                ..
            })
        ),
        "plaintext under an encrypting codec: {answer:?}"
    );
    let lenient = encrypted(
        Arc::clone(&store),
        Aes256GcmCodec::new(1, OLD_KEY).allow_plaintext_reads(),
    );
    let read = lenient
        .execute(&plain, fingerprint, work)
        .await
        .expect("plaintext reads when allowed");
    assert_eq!(read.value().as_deref(), Some("written in clear"));

    // A tampered checkpoint met by a takeover: an error, and the step does not run again.
    let resumed = key("payments", "tampered-step");
    let request =
        idem_core::store::ClaimRequest::new(resumed.clone(), fingerprint, SHORT_LEASE, HOUR);
    let (lease, _, _) = claimed(store.as_ref(), &request).await;
    let step = StepName::new("charge").expect("valid step name");
    let mut bad = codec
        .encode(
            &at(&resumed, ValuePart::Step("charge".into())),
            b"\"ch_1\"".to_vec(),
        )
        .expect("encodes");
    bad[10] ^= 0x80;
    let written = ok(store.checkpoint(&lease, &step, &bad).await, "checkpoint");
    assert_eq!(written, WriteOutcome::Applied);
    let_time_pass(caps, SHORT_LEASE).await;
    let runs = &runs;
    let answer = idem
        .execute(&resumed, fingerprint, |ctx| async move {
            let charge: String = ctx
                .step("charge", || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, WorkError<String>>("ch_2".to_string())
                })
                .await?;
            Ok::<_, WorkError<String>>(charge)
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(Error::Codec {
                source: CodecError::Unauthentic { .. },
                ..
            })
        ),
        "a tampered checkpoint: {answer:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no work and no step ran on undecodable data"
    );
}

pub(crate) async fn key_policies_and_budgets_refuse_before_storing(store: Arc<dyn Store>) {
    let policed = Idempotency::builder(Arc::clone(&store))
        .lease(HOUR)
        .key_policy(KeyPolicy::uuid())
        .build()
        .expect("valid driver settings");
    let fingerprint = Fingerprint::of_bytes("req");
    let guessable = key("payments", "order-1");
    let answer = policed
        .execute(&guessable, fingerprint, |_ctx| async {
            Ok::<_, WorkError<String>>("never".to_string())
        })
        .await;
    assert!(
        matches!(answer, Err(Error::KeyRefused(_))),
        "a key the policy refuses: {answer:?}"
    );
    assert!(
        ok(store.get(&guessable).await, "get").is_none(),
        "a refused key stores nothing"
    );

    let budgeted = Idempotency::builder(Arc::clone(&store))
        .lease(HOUR)
        .key_budget(TokenBucket::new(2, HOUR))
        .build()
        .expect("valid driver settings");
    let runs = AtomicUsize::new(0);
    let work = |_ctx| async {
        Ok::<_, WorkError<String>>(format!("r{}", runs.fetch_add(1, Ordering::SeqCst)))
    };
    let (a, b, c) = (
        key("tenant-a/pay", "k1"),
        key("tenant-a/pay", "k2"),
        key("tenant-a/pay", "k3"),
    );
    budgeted
        .execute(&a, fingerprint, work)
        .await
        .expect("1st new key");
    // A replay is not a new key: it gives its token back.
    for _ in 0..3 {
        let replay = budgeted
            .execute(&a, fingerprint, work)
            .await
            .expect("replay");
        assert!(replay.replayed());
    }
    budgeted
        .execute(&b, fingerprint, work)
        .await
        .expect("2nd new key");
    let flood = budgeted.execute(&c, fingerprint, work).await;
    match flood {
        Err(Error::KeyBudgetExhausted { retry_after }) => {
            assert!(retry_after > Duration::ZERO && retry_after <= HOUR)
        }
        other => panic!("a 3rd new key within the period: {other:?}"),
    }
    assert!(
        ok(store.get(&c).await, "get").is_none(),
        "a refused new key stores nothing"
    );
    let replay = budgeted
        .execute(&a, fingerprint, work)
        .await
        .expect("keys with a record still replay once the budget is spent");
    assert!(replay.replayed());
    let other_scope = key("tenant-b/pay", "k1");
    budgeted
        .execute(&other_scope, fingerprint, work)
        .await
        .expect("another scope has its own budget");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

pub(crate) async fn provider_keys_survive_takeovers(store: Arc<dyn Store>, caps: &Capabilities) {
    let idem = builder(store, SHORT_LEASE)
        .build()
        .expect("valid driver settings");
    let k = key("acct_42/payments.create", "provider-keys");
    let fingerprint = Fingerprint::of_bytes("500 EUR");
    let sent = |ctx: idem_core::Context| {
        [Provider::STRIPE, Provider::ADYEN, Provider::PAYPAL]
            .map(|provider| ctx.provider_key(provider, "charge"))
    };
    let first = idem
        .execute(&k, fingerprint, |ctx| async move {
            Err::<(), _>(WorkError::Unknown(sent(ctx)))
        })
        .await
        .expect("attempt 1 times out at the provider");
    let Outcome::Unknown(first) = first else {
        panic!("attempt 1: {first:?}")
    };
    let_time_pass(caps, SHORT_LEASE).await;
    let second = idem
        .execute(&k, fingerprint, |ctx| async move {
            assert!(ctx.resumed(), "attempt 2 took over");
            Ok::<_, WorkError<[String; 3]>>(sent(ctx))
        })
        .await
        .expect("attempt 2 takes over")
        .value()
        .expect("attempt 2 completes");
    assert_eq!(
        first, second,
        "a takeover sends each provider the same identifier"
    );
    let [stripe, adyen, paypal] = second;
    assert!(stripe.len() <= 255 && adyen.len() <= 80);
    assert_eq!(paypal.len(), 36);
    assert_ne!(stripe, paypal);
    let other = idem
        .execute(
            &key("acct_42/payments.create", "provider-keys-2"),
            fingerprint,
            |ctx| async move {
                Ok::<_, WorkError<String>>(ctx.provider_key(Provider::STRIPE, "charge"))
            },
        )
        .await
        .expect("another key")
        .value()
        .expect("completes");
    assert_ne!(other, stripe, "another key, another identifier");
}
