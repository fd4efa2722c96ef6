//! An operator's listing and count as a user the server refuses some of the store's keys:
//! the refusal is an error naming the configuration, never a record skipped as unreadable
//! (a count that quietly leaves out what it may not read would be wrong without a sign).

mod common;

use idem_core::{Admin, Key, Store, StoreError, admin::ListQuery};

#[tokio::test]
async fn keys_the_server_refuses_fail_a_listing_and_a_count() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let prefix = common::unique_prefix();
    let owner = common::standalone_in(&url, &prefix).await;
    let keys = ["allowed-0", "denied-0"].map(|name| Key::new("acl", name).unwrap());
    common::completed(&owner, &keys).await;
    let listed = owner.list(&ListQuery::new()).await.unwrap();
    assert_eq!(listed.records.len(), 2, "the owner reads both");

    // `SCAN` needs no key permission, so this user finds both keys but may read one.
    let user = format!("idem-keys-{}", std::process::id());
    let as_user =
        common::user_without(&url, &user, &format!("~{prefix}{{3:acl:allowed-*"), &[]).await;
    let restricted = common::standalone_in(&as_user, &prefix).await;
    // The user may read the allowed record: the refusal below is of the other one.
    let allowed = restricted.get(&keys[0]).await;
    let listed = restricted.list(&ListQuery::new()).await;
    let counted = restricted.stats(10).await;
    common::drop_user(&url, &user).await;

    assert!(matches!(allowed, Ok(Some(_))), "{allowed:?}");
    assert!(
        matches!(listed, Err(StoreError::Misconfigured { .. })),
        "{listed:?}"
    );
    assert!(
        matches!(counted, Err(StoreError::Misconfigured { .. })),
        "{counted:?}"
    );
}
