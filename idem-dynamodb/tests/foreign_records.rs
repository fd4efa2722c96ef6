//! Items idem did not write, put in the table by hand: never absent, never a panic, always
//! a typed error naming the key's hash.

mod common;

use std::sync::Arc;

use idem_core::{Admin, Key, admin::ListQuery, raw::storage_name};
use idem_dynamodb::aws_sdk_dynamodb::primitives::Blob;
use idem_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use idem_testkit::assert_foreign_record_is_refused;

#[tokio::test]
async fn foreign_items_are_refused_not_absent() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let store = common::store_in(&endpoint, &prefix).await;
    let client = store.client().clone();
    let store: Arc<dyn Admin> = Arc::new(store);
    let n = |v: &str| AttributeValue::N(v.to_owned());
    let b = |v: Vec<u8>| AttributeValue::B(Blob::new(v));
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let good = [
        ("fp", b(vec![0; 32])),
        ("st", s("in_progress")),
        ("tk", n("1")),
        ("at", b(vec![0; 16])),
        ("lu", n("1")),
        ("ca", n("1")),
        ("ea", n("4102444800000")),
    ];
    let with = |field: &'static str, value: Option<AttributeValue>| {
        let mut item: Vec<_> = good.iter().filter(|(f, _)| *f != field).cloned().collect();
        if let Some(value) = value {
            item.push((field, value));
        }
        item
    };
    let cases = [
        ("an unknown state", with("st", Some(s("paused")))),
        ("a token that is text", with("tk", Some(s("abc")))),
        (
            "a token beyond 2^53 - 1",
            with("tk", Some(n("9007199254740993"))),
        ),
        ("a missing expiry", with("ea", None)),
        ("a fingerprint that is text", with("fp", Some(s("abc")))),
        ("steps that are a number", with("stp", Some(n("3")))),
    ];
    for (i, (what, attributes)) in cases.into_iter().enumerate() {
        let key = Key::new("foreign", format!("case-{i}")).unwrap();
        let pk = storage_name::namespaced_key_name(&prefix, &key);
        let mut put = client
            .put_item()
            .table_name(common::table())
            .item("pk", s(&pk));
        for (name, value) in attributes {
            put = put.item(name, value);
        }
        put.send().await.unwrap();
        assert_foreign_record_is_refused(Arc::clone(&store), &key, what).await;
    }

    // An operator's count and listing skip what they cannot read instead of failing on
    // it. The count reads no steps, so the item whose steps are a number counts as a
    // record; the listing reads its page whole and skips that one too.
    let stats = store.stats(10).await.unwrap();
    assert_eq!((stats.total, stats.unreadable), (1, 5), "{stats:?}");
    let page = store.list(&ListQuery::new()).await.unwrap();
    assert!(page.records.is_empty(), "{:?}", page.records);
}
