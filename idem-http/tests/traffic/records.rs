//! What a record holds: a store that holds less than the layer's default, and codecs
//! that add to every stored response.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::key::StepName;
use idem_core::record::Lease;
use idem_core::store::{ClaimOutcome, ClaimRequest, RenewOutcome, WriteOutcome};
use idem_core::{Idempotency, Key, MemoryStore, Record, Store, StoreError};
use idem_http::BODY_NOT_STORED_HEADER;

use crate::common::{Effects, Server, app, client, layer, post};

/// The memory store, declaring a record limit like DynamoDB's 400 000-byte item.
#[derive(Clone)]
struct Capped {
    inner: MemoryStore,
    limit: usize,
}

#[async_trait]
impl Store for Capped {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.complete(lease, response).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    fn max_record_bytes(&self) -> Option<usize> {
        Some(self.limit)
    }
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_holds_less_than_the_default_still_replays_the_status() {
    // The layer's default (960 KiB) is over DynamoDB's item; the store's limit wins.
    let store = Capped {
        inner: MemoryStore::new(),
        limit: 400_000,
    };
    let effects = Effects::default();
    let server = Server::start(app(
        layer(Idempotency::new(store).into_dyn()),
        effects.clone(),
    ))
    .await;
    let url = server.url("/payments");
    let first = post(
        &client(),
        &url,
        Some("k-big"),
        "{}",
        &[("x-response-bytes", "500000")],
    )
    .await;
    assert_eq!((first.status, first.body.len()), (201, 500_000));
    let retry = post(&client(), &url, Some("k-big"), "{}", &[]).await;
    assert_eq!(
        retry.status, 201,
        "a payment that succeeded never looks failed: {retry:?}"
    );
    assert!(retry.replayed());
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    assert_eq!(retry.header("location"), first.header("location"));
    // Under the limit, the body is kept.
    let small = post(
        &client(),
        &url,
        Some("k-small"),
        "{}",
        &[("x-response-bytes", "300000")],
    )
    .await;
    let again = post(&client(), &url, Some("k-small"), "{}", &[]).await;
    assert_eq!((again.status, again.body.clone()), (201, small.body));
    assert_eq!(effects.runs(), 2);
}

/// A codec that wraps every value in a 200-byte envelope.
#[derive(Debug)]
struct Envelope;

impl idem_core::Codec for Envelope {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        let mut out = vec![b'#'; 200];
        out.extend_from_slice(&plain);
        Ok(out)
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        Ok(std::borrow::Cow::Borrowed(
            stored.get(200..).unwrap_or_default(),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_that_adds_much_still_replays_a_success_as_a_success() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(4000)
        .codec(Envelope)
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem), effects.clone())).await;
    let url = server.url("/payments");
    let first = post(
        &client(),
        &url,
        Some("k-env"),
        "{}",
        &[("x-response-bytes", "3800")],
    )
    .await;
    assert_eq!((first.status, first.body.len()), (201, 3800));
    let retry = post(&client(), &url, Some("k-env"), "{}", &[]).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    let small = post(
        &client(),
        &url,
        Some("k-small"),
        "{}",
        &[("x-response-bytes", "100")],
    )
    .await;
    let again = post(&client(), &url, Some("k-small"), "{}", &[]).await;
    assert_eq!(
        again.body, small.body,
        "under the room, kept whole through the codec"
    );
    assert_eq!(effects.runs(), 2);
}

/// A codec that doubles every value (hex, as some envelopes do).
#[derive(Debug)]
struct Hex;

impl idem_core::Codec for Hex {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        Ok(plain
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect())
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        let plain = stored
            .chunks(2)
            .map(|pair| {
                u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0)
            })
            .collect();
        Ok(std::borrow::Cow::Owned(plain))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_whose_overhead_grows_still_replays_a_success_as_a_success() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(4000)
        .codec(Hex)
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem), effects.clone())).await;
    let url = server.url("/payments");
    post(
        &client(),
        &url,
        Some("k-hex"),
        "{}",
        &[("x-response-bytes", "2500")],
    )
    .await;
    let retry = post(&client(), &url, Some("k-hex"), "{}", &[]).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    let small = post(
        &client(),
        &url,
        Some("k-hex-small"),
        "{}",
        &[("x-response-bytes", "500")],
    )
    .await;
    let again = post(&client(), &url, Some("k-hex-small"), "{}", &[]).await;
    assert_eq!(again.body, small.body);
}
