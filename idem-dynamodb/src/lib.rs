//! # idem-dynamodb
//!
//! The DynamoDB store for [idem](idem_core), over a configured
//! [`aws_sdk_dynamodb::Client`]. See [`DynamoDbStore`] for how each transition maps to a
//! conditional write, and for the clock trade-off.
//!
//! ```no_run
//! use idem_core::{Fingerprint, Idempotency, Key, done};
//! use idem_dynamodb::DynamoDbStore;
//!
//! # async fn run(client: aws_sdk_dynamodb::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(DynamoDbStore::new(client, "idem")?);
//! let key = Key::new("acct_42/payments.create", "order-1187")?;
//! let outcome = idem
//!     .execute(&key, Fingerprint::of_bytes("amount=500"), |_ctx| async {
//!         done("charged".to_string())
//!     })
//!     .await?;
//! # let _ = outcome;
//! # Ok(())
//! # }
//! ```
//!
//! ## The table
//!
//! One item per `(scope, key)`, partition key `pk` only; [`create_table`] makes it (and
//! shows the CloudFormation equivalent). Attributes, named in [`attributes`]:
//!
//! | attribute | type | holds |
//! |---|---|---|
//! | `pk` | S | `<prefix length>:<prefix><scope length>:<scope>:<key>` ([`idem_core::raw::storage_name`]) |
//! | `fp` | B | fingerprint (32 bytes) |
//! | `st` | S | `in_progress`, `completed` or `failed` |
//! | `tk` | N | fencing token |
//! | `at` | B | attempt id of the owner (16 bytes) |
//! | `lu`, `ca`, `ea` | N | lease end, creation, expiry (ms since the epoch, client clock) |
//! | `rs` | B | response (absent while in progress) |
//! | `stp` | M | checkpoints: step name to value (B) |
//! | `rz` | BOOL | whether the last claim was a takeover |
//! | `ttl` | N | TTL: epoch seconds, the later of expiry and lease end plus the skew margin |
//!
//! ## Permissions
//!
//! The IAM actions each user of the table needs, on the table itself
//! (`arn:aws:dynamodb:REGION:ACCOUNT:table/TABLE`); the store uses no index and no stream.
//! A refused action is `StoreError::Misconfigured` naming the operation, with DynamoDB's
//! own words, and nothing is written.
//!
//! | who | actions | what for |
//! |---|---|---|
//! | a service running work ([`DynamoDbStore`] as a `Store`) | `dynamodb:UpdateItem`, `dynamodb:GetItem`, `dynamodb:DeleteItem` | every claim and write is an `UpdateItem`; `GetItem` reads a record (`get`, claims that read first, and a refused write that DynamoDB answered without the item); `DeleteItem` only when a claim finds an absent record (retention over, no live lease) at the last fencing token, which it deletes before it starts the key again at token 1 |
//! | a purger (`purge_expired`: `idem purge`, or `idem proxy` with a purge interval) | `dynamodb:Scan`, `dynamodb:DeleteItem` | a scan of the prefix, then a conditional delete per absent item |
//! | an operator (`Admin`: `idem stats`, `list`, `inspect`, `release`, `delete`) | `dynamodb:Scan`, `dynamodb:GetItem`, `dynamodb:UpdateItem`, `dynamodb:DeleteItem` | listing and counting scan, and a listing reads each record of its page whole; `inspect` reads; `release` updates; `delete` deletes |
//! | whoever creates the table ([`create_table`], `idem migrate`) | `dynamodb:CreateTable`, `dynamodb:DescribeTable`, `dynamodb:UpdateTimeToLive` | creates it, waits until it is active, turns TTL on; grant all three before the first run: a table created without its TTL is left so by later runs |
//!
//! A service's policy, for a table named `idem`:
//!
//! ```json
//! {
//!   "Version": "2012-10-17",
//!   "Statement": [{
//!     "Effect": "Allow",
//!     "Action": ["dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:DeleteItem"],
//!     "Resource": "arn:aws:dynamodb:eu-west-1:123456789012:table/idem"
//!   }]
//! }
//! ```
//!
//! Without `dynamodb:DeleteItem` a service works normally except for a key whose token
//! reached the last one (2^53 - 1, which claims never reach in practice): once that record
//! is absent, every claim of the key is refused as misconfigured, writing nothing, until
//! the item is deleted by a purger, by `idem delete`, or by DynamoDB's TTL (which can lag
//! by days).
//!
//! ## Limits
//!
//! DynamoDB refuses items over 400 KB, so a record's response and checkpoints together are
//! capped at [`MAX_RECORD_BYTES`]: the driver keeps below it, checking the whole record
//! before it writes a result or a checkpoint (and stores a too-large value as the
//! execution's permanent failure, so the work never runs twice for it); the store refuses
//! a larger write with `StoreError::TooLarge`
//! before anything is written. Throttling and transient server errors are retryable
//! errors; failed conditions are outcomes (replay, in flight, fenced), never errors. A
//! table DynamoDB refuses (a bad name, a missing table, no access) is
//! `StoreError::Misconfigured` with DynamoDB's own words.
//!
//! ## Expiry
//!
//! DynamoDB's TTL deletes absent records by itself, lazily (typically within days); reads
//! and claims check presence themselves, so a late deletion changes nothing but storage.
//! `purge_expired` scans the table, each call going on from where the last one stopped,
//! with several conditional deletes in flight: a TTL-enabled table rarely needs it. A
//! table shared by many prefixes, or an operator who must list records, pays for a `Scan`
//! per call; a global secondary index on a prefix attribute would pay off beyond a few
//! hundred thousand items.
//!
//! ## What a replay costs
//!
//! By default a claim is one conditional write, so a replay is a failed condition, which
//! DynamoDB bills as a write sized by the stored item (one unit per started KB).
//! [`DynamoDbStoreBuilder::claim_reads_first`] makes it a strongly consistent read (one
//! unit per started 4 KB, at a fifth of a write unit's price) at the cost of a read before
//! every other claim; its docs say when that pays.
//!
//! ## Operating
//!
//! [`DynamoDbStore`] implements [`idem_core::Admin`], which the `idem` command drives
//! (`idem --store 'dynamodb://TABLE?region=eu-west-1' stats`). Listing and counting are a
//! paged, strongly consistent `Scan` filtered to the prefix: it consumes read capacity
//! for every item of the table, whatever the filter keeps (1 read capacity unit per 4 KB),
//! so an `idem stats` over a 1 GB table costs about 262 000 RCUs. Fine for an occasional look;
//! when a table holds millions of items, or many prefixes share it, a global secondary
//! index keyed by the prefix and sorted by creation would make listing read only the
//! store's own items. The release and the deletion are single conditional writes.
//!
//! ## Opening from a URL
//!
//! With the feature `url`, `BACKEND` reads `dynamodb://TABLE?region=...&endpoint=...`
//! URLs for [`idem_core::connect`], with the prefix option (checked before anything is
//! built), so a program that takes a store URL lists `&idem_dynamodb::BACKEND` among its
//! backends. Opening builds a client from the URL and the standard AWS environment
//! variables (`AWS_REGION` when the URL has no region, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) and sends nothing; migrating runs
//! [`create_table`]. The feature turns on the SDK's default HTTPS client, which the store
//! alone leaves to you.
//!
//! ```
//! # #[cfg(feature = "url")] {
//! use idem_core::connect::{self, ConnectOptions};
//!
//! let options = ConnectOptions::default().prefix("billing#");
//! let location = connect::parse_url("dynamodb://idem?region=eu-west-1", &options, &[&idem_dynamodb::BACKEND])?;
//! assert_eq!(location.backend(), "DynamoDB");
//! # }
//! # Ok::<(), idem_core::connect::UrlError>(())
//! ```
//!
//! ## Where things live
//!
//! Every transition is one conditional write, its expressions in `src/expressions.rs`:
//!
//! | operation | files |
//! |---|---|
//! | the store, its fenced writes (`fenced`, `expiry_write`), get | `src/store.rs` |
//! | claim | `src/store/claim.rs` (`conditional_claim`, `fresh`, `take_over`) |
//! | complete, fail | `src/store/finish.rs` (`finish`); a failed condition read in `src/refused.rs` |
//! | release, renew, checkpoint | `src/store/release.rs`, `src/store/renew.rs`, `src/store/checkpoint.rs` |
//! | purge_expired | `src/store/purge.rs` |
//! | list, stats, release_key, delete, raw | `src/admin.rs` |
//! | the item's attributes | `src/item.rs`; the table: `src/table.rs`; the builder: `src/builder.rs` |
//! | errors, URLs | `src/errors.rs`, `src/url.rs` (feature `url`) |
//!
//! The rule each operation follows, and the testkit case that checks it:
//! `docs/DESIGN.md` §2 and §6.4 in the repository.

#![warn(missing_docs)]

mod admin;
mod builder;
mod errors;
mod expressions;
mod item;
mod refused;
mod store;
mod table;
#[cfg(feature = "url")]
mod url;

/// The item's attribute names.
pub mod attributes {
    pub use crate::item::{
        ATTEMPT, CREATED_AT, EXPIRES_AT, FINGERPRINT, LEASE_UNTIL, PK, RESPONSE, RESUMED, STATE,
        STEPS, TOKEN, TTL,
    };
}

#[cfg(feature = "url")]
pub use crate::url::{BACKEND, DynamoDbBackend, DynamoDbLocation, DynamoDbUrlError, URL_SCHEMES};
pub use aws_sdk_dynamodb;
pub use builder::{DynamoDbStoreBuilder, PrefixError};
pub use store::{DEFAULT_SKEW_MARGIN, DynamoDbStore, MAX_RECORD_BYTES};
pub use table::{TableNameError, create_table};
