//! The keyed log hash is process-wide, so it gets a test binary of its own.

use idem_core::{Key, key::LogHashSecretError, key::MIN_LOG_HASH_SECRET, key::set_log_hash_secret};

#[test]
fn a_secret_keys_every_short_hash_once_and_for_all() {
    let key = Key::new("acct_42/payments.create", "order-1187").unwrap();
    let unkeyed = key.short_hash();
    assert_eq!(
        set_log_hash_secret(b"short"),
        Err(LogHashSecretError::TooShort {
            len: 5,
            min: MIN_LOG_HASH_SECRET
        })
    );
    assert_eq!(
        key.short_hash(),
        unkeyed,
        "a refused secret changes nothing"
    );

    set_log_hash_secret(b"0123456789abcdef-startup-secret").unwrap();
    let keyed = key.short_hash();
    assert_ne!(keyed, unkeyed);
    assert_eq!(keyed, key.short_hash(), "stable, so log lines correlate");
    assert_eq!(format!("{key:?}"), format!("Key(#{keyed})"));
    assert_eq!(keyed.to_string().len(), 8);
    let other = Key::new("acct_42/payments.create", "order-1188").unwrap();
    assert_ne!(other.short_hash(), keyed);

    assert_eq!(
        set_log_hash_secret(b"another secret of enough bytes"),
        Err(LogHashSecretError::AlreadySet)
    );
    assert_eq!(key.short_hash(), keyed, "the first secret stays");
}
