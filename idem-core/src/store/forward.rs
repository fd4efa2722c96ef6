//! `Store` and `Admin` through `Arc`, `Box` and references, so that `Arc<dyn Store>` is a
//! store.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Key, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Expiry, store::RenewOutcome, store::WriteOutcome,
};

/// What an `#[async_trait]` method of `Store` returns.
type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

// Each method hands on the pointee's boxed future as it is, rather than boxing a future
// that awaits it: a store call through `Arc<dyn Store>` (the driver's) costs one
// allocation, not two.
macro_rules! forward_store {
    ($($pointer:ty),*) => {$(
        impl<S: Store + ?Sized> Store for $pointer {
            fn claim<'s, 'r, 'f>(&'s self, request: &'r ClaimRequest) -> Answer<'f, ClaimOutcome>
            where 's: 'f, 'r: 'f, Self: 'f {
                (**self).claim(request)
            }
            fn complete<'s, 'l, 'v, 'f>(&'s self, lease: &'l Lease, response: &'v [u8]) -> Answer<'f, WriteOutcome>
            where 's: 'f, 'l: 'f, 'v: 'f, Self: 'f {
                (**self).complete(lease, response)
            }
            fn fail<'s, 'l, 'v, 'f>(&'s self, lease: &'l Lease, response: &'v [u8]) -> Answer<'f, WriteOutcome>
            where 's: 'f, 'l: 'f, 'v: 'f, Self: 'f {
                (**self).fail(lease, response)
            }
            fn release<'s, 'l, 'f>(&'s self, lease: &'l Lease) -> Answer<'f, WriteOutcome>
            where 's: 'f, 'l: 'f, Self: 'f {
                (**self).release(lease)
            }
            fn renew<'s, 'l, 'f>(&'s self, lease: &'l Lease, extend: Duration) -> Answer<'f, RenewOutcome>
            where 's: 'f, 'l: 'f, Self: 'f {
                (**self).renew(lease, extend)
            }
            fn checkpoint<'s, 'l, 'n, 'v, 'f>(&'s self, lease: &'l Lease, step: &'n StepName, value: &'v [u8]) -> Answer<'f, WriteOutcome>
            where 's: 'f, 'l: 'f, 'n: 'f, 'v: 'f, Self: 'f {
                (**self).checkpoint(lease, step, value)
            }
            fn get<'s, 'k, 'f>(&'s self, key: &'k Key) -> Answer<'f, Option<Record>>
            where 's: 'f, 'k: 'f, Self: 'f {
                (**self).get(key)
            }
            fn purge_expired<'s, 'f>(&'s self, limit: usize) -> Answer<'f, usize>
            where 's: 'f, Self: 'f {
                (**self).purge_expired(limit)
            }
            fn expiry(&self) -> Expiry {
                (**self).expiry()
            }
            fn max_record_bytes(&self) -> Option<usize> {
                (**self).max_record_bytes()
            }
        }
    )*};
}

forward_store!(Arc<S>, Box<S>, &S);

macro_rules! forward_admin {
    ($($pointer:ty),*) => {$(
        #[async_trait]
        impl<S: crate::Admin + ?Sized> crate::Admin for $pointer {
            async fn list(&self, query: &crate::admin::ListQuery) -> Result<crate::admin::Page, StoreError> {
                (**self).list(query).await
            }
            async fn stats(&self, top_scopes: usize) -> Result<crate::admin::Stats, StoreError> {
                (**self).stats(top_scopes).await
            }
            async fn release_key(&self, key: &Key) -> Result<crate::admin::ReleaseKeyOutcome, StoreError> {
                (**self).release_key(key).await
            }
            async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
                (**self).delete(key).await
            }
            async fn raw(&self, key: &Key) -> Result<Option<crate::admin::RawRecord>, StoreError> {
                (**self).raw(key).await
            }
        }
    )*};
}

forward_admin!(Arc<S>, Box<S>, &S);
