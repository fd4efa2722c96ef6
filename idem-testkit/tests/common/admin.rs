//! The `Admin` calls of a [`FlawedStore`](super::flawed_store::FlawedStore).

use async_trait::async_trait;
use idem_core::machine;
use idem_core::{
    Admin, Key, StoreError, admin::ListQuery, admin::Page, admin::ReleaseKeyOutcome, admin::Stats,
    raw::select_page, record::AttemptId,
};

use super::flaw::Flaw;
use super::flawed_store::FlawedStore;

#[async_trait]
impl Admin for FlawedStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let mut query = query.clone();
        if self.has(Flaw::ListForgetsTheCursor) {
            query.after = None;
        }
        select_page(self.records(), &query, self.clock.now())
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        Ok(Stats::tally(&self.records(), self.clock.now(), top_scopes))
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let attempt = AttemptId::random();
        Ok(self.apply(key, |record, now| {
            let mut step =
                machine::release_key(record, attempt, now).expect("no token at its limit");
            if let (true, Some(written), Some(before)) = (
                self.has(Flaw::ReleaseKeepsTheOwner),
                &mut step.write,
                record,
            ) {
                written.token = before.token;
                written.attempt = before.attempt;
            }
            step
        }))
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let name = self.name(key);
        Ok(self
            .backend
            .lock()
            .expect("not poisoned")
            .remove(&name)
            .is_some())
    }

    async fn raw(&self, key: &Key) -> Result<Option<idem_core::admin::RawRecord>, StoreError> {
        let name = self.name(key);
        let backend = self.backend.lock().expect("not poisoned");
        Ok(backend.get(&name).map(idem_core::raw::raw_of))
    }
}
