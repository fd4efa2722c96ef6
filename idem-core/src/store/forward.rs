//! `Store` and `Admin` through `Arc`, `Box` and references, so that `Arc<dyn Store>` is a
//! store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    Key, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Expiry, store::RenewOutcome, store::WriteOutcome,
};

macro_rules! forward_store {
    ($($pointer:ty),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $pointer {
            async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
                (**self).claim(request).await
            }
            async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
                (**self).complete(lease, response).await
            }
            async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
                (**self).fail(lease, response).await
            }
            async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
                (**self).release(lease).await
            }
            async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
                (**self).renew(lease, extend).await
            }
            async fn checkpoint(&self, lease: &Lease, step: &StepName, value: &[u8]) -> Result<WriteOutcome, StoreError> {
                (**self).checkpoint(lease, step, value).await
            }
            async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
                (**self).get(key).await
            }
            async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
                (**self).purge_expired(limit).await
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
