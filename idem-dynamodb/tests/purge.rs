//! `purge_expired` in batches: each call goes on from where the last one stopped, deletes
//! every absent record of its prefix once and nothing else, and a call that is dropped
//! midway leaves the next one to finish the pass.

mod common;

use std::time::Duration;

use idem_core::{Admin, Key, Store, store::ClaimOutcome, store::ClaimRequest};

const HOUR: Duration = Duration::from_secs(3600);

/// 40 absent records and 20 present ones, interleaved; the keys of each.
async fn seed(store: &impl Store) -> (Vec<Key>, Vec<Key>) {
    let (mut absent, mut present) = (Vec::new(), Vec::new());
    for i in 0..60 {
        let key = Key::new("purge", format!("k{i}")).unwrap();
        let keep = i % 3 == 0;
        let life = if keep { HOUR } else { Duration::ZERO };
        let request = ClaimRequest::new(
            key.clone(),
            idem_core::Fingerprint::of_bytes("f"),
            life,
            life,
        );
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        if keep {
            present.push(key);
        } else {
            absent.push(key);
        }
    }
    (absent, present)
}

/// Every absent record is gone from the table, every present one is still there.
async fn assert_only_absent_purged(store: &impl Admin, absent: &[Key], present: &[Key]) {
    for key in absent {
        assert!(store.raw(key).await.unwrap().is_none(), "{key:?} was left");
    }
    for key in present {
        assert!(
            store.get(key).await.unwrap().is_some(),
            "{key:?} was purged"
        );
    }
}

/// Purges in batches of 7 until a batch comes back short; what each batch answered.
async fn purge_in_batches_of_7(store: &impl Store) -> Vec<usize> {
    let mut answers = Vec::new();
    loop {
        let purged = store.purge_expired(7).await.unwrap();
        answers.push(purged);
        if purged < 7 {
            return answers;
        }
    }
}

#[tokio::test]
async fn batches_go_on_from_where_the_last_one_stopped() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = common::store(&endpoint).await;
    let (absent, present) = seed(&store).await;
    let answers = purge_in_batches_of_7(&store).await;
    // One pass, each record met once: full batches, then the rest.
    assert_eq!(answers, vec![7, 7, 7, 7, 7, 5]);
    assert_only_absent_purged(&store, &absent, &present).await;
    assert_eq!(
        store.purge_expired(1000).await.unwrap(),
        0,
        "a new pass finds none"
    );
}

#[tokio::test]
async fn a_dropped_call_leaves_the_next_to_finish_the_pass() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = common::store(&endpoint).await;
    let (absent, present) = seed(&store).await;
    // Dropped at its first wait, and again a little later.
    for wait in [Duration::ZERO, Duration::from_millis(3)] {
        let _ = tokio::time::timeout(wait, store.purge_expired(7)).await;
    }
    // The rest of the pass, from wherever the dropped calls left the position: every
    // absent record was there before they ran, so none may have been passed over.
    while store.purge_expired(7).await.unwrap() == 7 {}
    assert_only_absent_purged(&store, &absent, &present).await;
}

/// A table whose `Scan` takes several pages (DynamoDB reads at most 1 MB a page, here
/// mostly large records of another prefix): a purge with room for every absent record
/// deletes them all in one call, across the pages, and batches still meet each once.
#[tokio::test]
async fn a_purge_goes_across_the_scans_pages() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    // Twelve records of 300 KB under another prefix: about four pages.
    let other = common::store(&endpoint).await;
    let large: Vec<Key> = (0..12)
        .map(|i| Key::new("large", format!("k{i}")).unwrap())
        .collect();
    for key in &large {
        let request = ClaimRequest::new(
            key.clone(),
            idem_core::Fingerprint::of_bytes("f"),
            HOUR,
            HOUR,
        );
        let ClaimOutcome::Claimed { lease, .. } = other.claim(&request).await.unwrap() else {
            panic!("a fresh claim");
        };
        assert_eq!(
            other.complete(&lease, &vec![7; 300_000]).await.unwrap(),
            idem_core::store::WriteOutcome::Applied
        );
    }
    // In a task of its own, so that the large records go however it ends: DynamoDB Local
    // keeps what the tests write while it runs, 3.6 MB more for every later test.
    let purged = tokio::spawn(purge_across_pages(endpoint)).await;
    let mut deleted = Vec::new();
    for key in &large {
        deleted.push(other.delete(key).await);
    }
    // The purge's own failure first: a purge that took the large records too would
    // otherwise show only as a failed cleanup.
    if let Err(failed) = purged {
        std::panic::resume_unwind(failed.into_panic());
    }
    for (key, deleted) in large.iter().zip(deleted) {
        assert!(deleted.unwrap(), "{key:?} of another prefix was purged");
    }
}

async fn purge_across_pages(endpoint: String) {
    let operations = common::Operations::default();
    let recorded = || {
        idem_dynamodb::DynamoDbStore::builder(operations.client(&endpoint), &common::table())
            .unwrap()
            .prefix(&common::unique_prefix())
            .unwrap()
            .skew_margin(Duration::ZERO)
            .build()
    };

    let store = recorded();
    let (absent, present) = seed(&store).await;
    operations.take();
    assert_eq!(store.purge_expired(1000).await.unwrap(), absent.len());
    let sent = operations.take();
    // Deletes on a page before the last, then a scan on: the purge went across pages.
    let first_delete = sent.iter().position(|op| op == "DeleteItem");
    let last_scan = sent.iter().rposition(|op| op == "Scan");
    assert!(
        matches!((first_delete, last_scan), (Some(delete), Some(scan)) if delete < scan),
        "no page with a purgeable record before the last: the test shows nothing ({sent:?})"
    );
    assert_only_absent_purged(&store, &absent, &present).await;

    // Again in batches of 7, which stop inside pages and go on from them.
    let store = recorded();
    let (absent, present) = seed(&store).await;
    let answers = purge_in_batches_of_7(&store).await;
    assert_eq!(answers.iter().sum::<usize>(), absent.len(), "{answers:?}");
    assert_only_absent_purged(&store, &absent, &present).await;
}
