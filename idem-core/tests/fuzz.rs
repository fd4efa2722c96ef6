//! Fuzzing of everything idem-core parses from outside: keys and step names, JSON for
//! fingerprints, stored records, and ciphertexts. No input may panic or hang, and each
//! error is of a stable kind.
//!
//! `IDEM_FUZZ_CASES` sets the inputs per target (default 2 000, as CI runs it); the long
//! run in RELIABILITY.md uses 1 000 000.

use idem_core::record::ValuePart;
use idem_core::{
    Aes256GcmCodec, Codec, Fingerprint, Key, Record, StoreError, codec::StoredAt, key::KeyError,
    key::MAX_PART_LEN, key::StepName, raw::MAX_TOKEN,
};
use proptest::prelude::*;

// The same setting as `idem_testkit::fuzz_config`, which the other crates use; idem-core
// cannot depend on the testkit (the testkit depends on it).
fn config() -> ProptestConfig {
    let cases = std::env::var("IDEM_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig {
        cases,
        // Shrinking a million-case run's failure can take long; the seed is printed.
        max_shrink_iters: 1_000,
        ..ProptestConfig::default()
    }
}

/// Text with the characters keys break on: controls, quotes, braces, non-ASCII, and
/// lengths around the limit.
fn adversarial_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\\x00-\\x1f{}:\"\\\\é€😀a-z]{0,300}",
        (0usize..600).prop_map(|n| "k".repeat(n)),
        (250usize..260).prop_map(|n| "é".repeat(n / 2)),
    ]
}

/// What the rules say of a part, independently of the code under test.
fn valid_part(text: &str) -> bool {
    !text.is_empty() && text.len() <= MAX_PART_LEN && !text.chars().any(char::is_control)
}

/// JSON-like bytes: real JSON, deep nesting, huge numbers, duplicate keys, bad escapes and
/// invalid UTF-8 inside strings.
fn adversarial_json() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<Vec<u8>>(),
        (1usize..400)
            .prop_map(|depth| format!("{}1{}", "[".repeat(depth), "]".repeat(depth)).into_bytes()),
        (1usize..400).prop_map(|depth| "{\"a\":".repeat(depth).into_bytes()),
        "-?[0-9]{1,400}(\\.[0-9]{0,40})?([eE][+-]?[0-9]{1,6})?".prop_map(String::into_bytes),
        "\\{(\"[a-c]\":[0-9]{1,3},){0,6}\"[a-c]\":[0-9]{1,3}\\}".prop_map(String::into_bytes),
        "\"(\\\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\\\\x|[a-z]){0,12}\"".prop_map(String::into_bytes),
        any::<Vec<u8>>().prop_map(|bytes| {
            let mut out = b"{\"k\":\"".to_vec();
            out.extend(bytes);
            out.extend(b"\"}");
            out
        }),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn keys_and_step_names(scope in adversarial_text(), key in adversarial_text()) {
        match Key::new(scope.clone(), key.clone()) {
            Ok(made) => {
                prop_assert!(valid_part(&scope) && valid_part(&key));
                prop_assert_eq!(made.scope(), scope.as_str());
                prop_assert_eq!(format!("{made:?}"), format!("Key(#{})", made.short_hash()));
            }
            Err(err) => {
                prop_assert!(!(valid_part(&scope) && valid_part(&key)));
                let known = matches!(
                    err,
                    KeyError::Empty { .. } | KeyError::TooLong { .. } | KeyError::ControlCharacter { .. }
                );
                prop_assert!(known, "an unexpected kind: {err:?}");
            }
        }
        prop_assert_eq!(StepName::new(key.clone()).is_ok(), valid_part(&key));
    }

    #[test]
    fn fingerprints_of_json(bytes in adversarial_json()) {
        // serde_json refuses nesting beyond 128 levels and invalid UTF-8 with an error;
        // whatever parses has a fingerprint, the same for the same value.
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            let once = Fingerprint::of_json(&value);
            let reparsed: serde_json::Value =
                serde_json::from_slice(&serde_json::to_vec(&value).unwrap()).unwrap();
            let again = Fingerprint::of_json(&reparsed);
            match (once, again) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                (a, b) => prop_assert!(false, "unstable: {:?} then {:?}", a, b),
            }
        }
        let _ = Fingerprint::of_bytes(&bytes);
    }

    #[test]
    fn stored_records(
        fingerprint in proptest::collection::vec(any::<u8>(), 0..40),
        state in prop_oneof![Just(b"in_progress".to_vec()), Just(b"completed".to_vec()), any::<Vec<u8>>()],
        token in any::<i128>(),
        attempt in proptest::collection::vec(any::<u8>(), 0..20),
        times in any::<[i128; 3]>(),
        step in any::<Vec<u8>>(),
        response in proptest::option::of(any::<Vec<u8>>()),
    ) {
        let built = Record::parts(Key::new("fuzz", "record").unwrap())
            .fingerprint(&fingerprint)
            .state(&state)
            .token(token)
            .attempt(&attempt)
            .lease_until_millis(times[0])
            .created_at_millis(times[1])
            .expires_at_millis(times[2])
            .step(step, b"v".to_vec())
            .response(response)
            .build();
        match built {
            Ok(record) => {
                prop_assert_eq!(fingerprint.len(), 32);
                prop_assert_eq!(attempt.len(), 16);
                prop_assert!((1..=MAX_TOKEN).contains(&record.token));
            }
            Err(err) => {
                let is_corrupt = matches!(err, StoreError::Corrupt { key: Some(_), .. });
                prop_assert!(is_corrupt, "{err:?}");
            }
        }
    }

    #[test]
    fn ciphertexts(bytes in any::<Vec<u8>>(), header in any::<[u8; 5]>(), flip in any::<usize>()) {
        let codec = Aes256GcmCodec::new(1, [7; 32]);
        let key = Key::new("fuzz", "cipher").unwrap();
        let fingerprint = idem_core::Fingerprint::of_bytes("request");
        let at = StoredAt { key: &key, fingerprint: &fingerprint, part: ValuePart::Result };
        let mut forged = header.to_vec();
        forged[0] = 0xA1;
        forged.extend(&bytes);
        prop_assert!(codec.decode(&at, &bytes).is_err());
        prop_assert!(codec.decode(&at, &forged).is_err());
        let mut sealed = codec.encode(&at, bytes.clone()).unwrap();
        let at_byte = flip % sealed.len();
        sealed[at_byte] ^= 1;
        prop_assert!(codec.decode(&at, &sealed).is_err(), "a flipped bit at {at_byte} decoded");
    }
}
