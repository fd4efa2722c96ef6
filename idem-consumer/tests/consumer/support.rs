//! The consumer under test: the memory store, a lease of 30 s.

use std::time::Duration;

use idem_consumer::Consumer;
use idem_core::{Idempotency, MemoryStore};

pub(crate) const LEASE: Duration = Duration::from_secs(30);

pub(crate) fn consumer() -> Consumer<MemoryStore> {
    Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(LEASE)
            .build()
            .unwrap(),
    )
}
