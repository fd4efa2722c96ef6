//! The Redis Streams adapter (feature `redis`): [`RedisStream`], a consumer group's reader,
//! and [`RedisStreamMessage`].
//!
//! ```no_run
//! use idem_consumer::Consumer;
//! use idem_consumer::redis::{DeadLetters, RedisStream};
//! use idem_core::{Idempotency, MemoryStore, done};
//! use std::num::NonZeroUsize;
//! use std::time::Duration;
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let connection = client.get_multiplexed_async_connection().await?;
//! // The group `billing` of the stream `orders`, read as the consumer `billing-1`; dead
//! // letters go to the stream `orders:dead` with their reason.
//! let orders = RedisStream::new(connection, "orders", "billing", "billing-1", DeadLetters::to_stream("orders:dead"));
//! orders.create_group().await?;
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//! loop {
//!     // Entries another consumer left pending past the claim idle time first, then new ones.
//!     let batch = orders.next_batch(NonZeroUsize::new(16).unwrap(), Duration::from_millis(250)).await?;
//!     for settled in consumer.handle_batch(&batch, |_ctx, payload| async move { done(payload.len()) }).await {
//!         if let Err(err) = settled {
//!             tracing::warn!(error = %err, "not settled; the entry stays pending and is claimed again");
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! - The key is the entry id (`1733300000000-0`), stable across every delivery: Redis
//!   assigns it when the entry is added. A producer's own resend (an `XADD` retried after a
//!   lost answer) is a second entry and runs twice: producers that resend put an id of
//!   their own in the entry and the consumer keys by it
//!   ([`Consumer::key_from_payload`](crate::Consumer::key_from_payload)).
//! - The scope is `<stream>/<group>`: two groups of one stream each handle every entry once.
//! - The payload is the entry's [`payload_field`](RedisStream::payload_field) (`payload` by
//!   default); an entry without that field is handed over as a JSON object of all its
//!   fields, sorted by name (a field repeated in one entry keeps one value), values read
//!   as UTF-8 (lossily).
//! - [`RedisStream::next_batch`] first claims (`XAUTOCLAIM`) entries that stayed pending,
//!   unacknowledged, for the [`claim_idle`](RedisStream::claim_idle) time (30 s by
//!   default): a consumer that crashed, or a nak whose delay ran out. Then it reads new
//!   entries (`XREADGROUP ... >`). The delivery count is the group's own.
//! - An ack is `XACK`: the entry leaves the group's pending list (it stays in the stream
//!   until the stream is trimmed).
//! - A nak leaves the entry pending, with its idle time set so that it is claimed again
//!   after the delay (`XCLAIM ... IDLE`): a delay longer than the claim idle time is cut to
//!   it.
//! - While the work runs, and while an entry waits in a batch, it is marked in progress
//!   every third of the claim idle time (`XCLAIM ... JUSTID`, which resets its idle time
//!   without counting a delivery), so long work is not claimed by another consumer.
//! - Dead letters go where [`DeadLetters`] says: added to a stream of their own with the
//!   reason and the original's stream, group and id (then acked; a crash between the two
//!   can add a copy twice), or only acked, the entry staying in the stream.
//! - Marks and naks claim the entry for this consumer whoever holds it now (`XCLAIM`
//!   cannot check the owner): a consumer paused past the claim idle time takes back an
//!   entry another claimed meanwhile. The driver's lease still lets one of them run the
//!   work; the other is answered "in flight".
//! - Trim a stream (`XTRIM`, `MAXLEN`) only below the oldest pending entry: Redis drops a
//!   trimmed entry from the group's pending list, unhandled (logged when claimed).
//! - A blocking read holds the connection for `block`: keep it under the connection's
//!   response timeout (500 ms by default in redis-rs), and the acks that share the
//!   connection wait behind it.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionLike;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::{FromRedisValue, Value};

use crate::{DeadLetterReason, Message, SettleError, Settlement};

/// The field that carries the reason on a dead-lettered copy.
pub const DEAD_LETTER_REASON: &str = "idem-dead-letter-reason";
/// The field that carries the original's stream on a dead-lettered copy.
pub const ORIGINAL_STREAM: &str = "idem-original-stream";
/// The field that carries the group that dead-lettered the copy.
pub const ORIGINAL_GROUP: &str = "idem-original-group";
/// The field that carries the original's entry id on a dead-lettered copy.
pub const ORIGINAL_ID: &str = "idem-original-id";

/// How long an entry stays pending, unacknowledged and not marked in progress, before
/// another consumer of the group claims it, unless set.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);

/// Where dead letters go: a choice made once, so that none is dropped unawares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetters {
    /// Added (`XADD`) to this stream with the reason and the original's stream, group, id
    /// and fields, then acked.
    Stream {
        /// The dead-letter stream's key.
        key: String,
    },
    /// Only acked: the entry stays in its stream (until the stream is trimmed) and the
    /// reason is logged.
    Acknowledge,
}

impl DeadLetters {
    /// [`DeadLetters::Stream`] to `key`.
    pub fn to_stream(key: impl Into<String>) -> Self {
        DeadLetters::Stream { key: key.into() }
    }
}

/// Reading a stream's group failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Redis answered an error, or the connection failed; nothing was lost: what was read
    /// stays pending and is claimed again.
    #[error("Redis refused `{command}` on the stream: {source}")]
    Redis {
        /// The command.
        command: &'static str,
        /// Redis's error.
        #[source]
        source: redis::RedisError,
    },
}

#[derive(Clone)]
struct Setup {
    stream: String,
    group: String,
    consumer: String,
    /// `<stream>/<group>`: the scope.
    source: String,
    claim_idle: Duration,
    payload_field: String,
    dead_letters: DeadLetters,
}

/// A consumer group of a Redis stream, read as one consumer: the source of
/// [`RedisStreamMessage`]s. See the [module docs](self).
pub struct RedisStream<C> {
    connection: C,
    setup: Arc<Setup>,
    /// Where the next `XAUTOCLAIM` goes on scanning the pending list.
    cursor: Mutex<String>,
}

impl<C> fmt::Debug for RedisStream<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStream")
            .field("stream", &self.setup.stream)
            .field("group", &self.setup.group)
            .field("consumer", &self.setup.consumer)
            .field("claim_idle", &self.setup.claim_idle)
            .field("payload_field", &self.setup.payload_field)
            .field("dead_letters", &self.setup.dead_letters)
            .finish_non_exhaustive()
    }
}

impl<C> RedisStream<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The group `group` of `stream`, read as `consumer` (a name per process: two
    /// processes under one name share their pending entries).
    pub fn new(
        connection: C,
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
        dead_letters: DeadLetters,
    ) -> Self {
        let (stream, group) = (stream.into(), group.into());
        Self {
            connection,
            setup: Arc::new(Setup {
                source: format!("{stream}/{group}"),
                stream,
                group,
                consumer: consumer.into(),
                claim_idle: DEFAULT_CLAIM_IDLE,
                payload_field: "payload".to_owned(),
                dead_letters,
            }),
            cursor: Mutex::new("0-0".to_owned()),
        }
    }

    /// How long an entry stays pending before another consumer claims it. Longer than a
    /// pause of the process (a GC, a deploy's stop), and longer than the driver's lease
    /// makes a claim find the lease ended. From 100 ms (marks in progress every third of
    /// it) to a day.
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.setup_mut().claim_idle = idle.clamp(
            Duration::from_millis(100),
            Duration::from_secs(24 * 60 * 60),
        );
        self
    }

    /// The entry's field that is the payload (`payload` by default).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.setup_mut().payload_field = field.into();
        self
    }

    fn setup_mut(&mut self) -> &mut Setup {
        Arc::make_mut(&mut self.setup)
    }

    /// Creates the group at the start of the stream (and the stream if it does not exist):
    /// `XGROUP CREATE <stream> <group> 0 MKSTREAM`. A group that exists is left as it is.
    ///
    /// # Errors
    /// [`StreamError::Redis`] when Redis refuses.
    pub async fn create_group(&self) -> Result<(), StreamError> {
        let mut connection = self.connection.clone();
        let created: Result<Value, _> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.setup.stream)
            .arg(&self.setup.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut connection)
            .await;
        match created {
            Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
            Err(source) => Err(StreamError::Redis {
                command: "XGROUP CREATE",
                source,
            }),
            Ok(_) => Ok(()),
        }
    }

    /// Up to `count` entries: those pending past the claim idle time first, claimed for
    /// this consumer, then new ones, waiting up to `block` for a new one when none was
    /// claimed (zero: no wait).
    ///
    /// # Errors
    /// [`StreamError::Redis`] when Redis refuses or the connection fails.
    pub async fn next_batch(
        &self,
        count: NonZeroUsize,
        block: Duration,
    ) -> Result<Vec<RedisStreamMessage<C>>, StreamError> {
        let mut batch = self.reclaim(count.get()).await?;
        let room = count.get() - batch.len();
        if room == 0 {
            return Ok(batch);
        }
        let mut connection = self.connection.clone();
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(&self.setup.group)
            .arg(&self.setup.consumer)
            .arg("COUNT")
            .arg(room);
        if batch.is_empty() && !block.is_zero() {
            // A block past an hour is an hour (Redis refuses what overflows its clock).
            read.arg("BLOCK")
                .arg(millis(block.min(Duration::from_secs(60 * 60))));
        }
        read.arg("STREAMS").arg(&self.setup.stream).arg(">");
        let reply: Option<StreamReadReply> =
            read.query_async(&mut connection)
                .await
                .map_err(|source| StreamError::Redis {
                    command: "XREADGROUP",
                    source,
                })?;
        for key in reply.map(|reply| reply.keys).unwrap_or_default() {
            for entry in key.ids {
                batch.push(self.message(entry, Some(1)));
            }
        }
        Ok(batch)
    }

    /// Claims up to `count` entries pending past the claim idle time, with their delivery
    /// counts.
    async fn reclaim(&self, count: usize) -> Result<Vec<RedisStreamMessage<C>>, StreamError> {
        let mut connection = self.connection.clone();
        let start = self
            .cursor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&self.setup.stream)
            .arg(&self.setup.group)
            .arg(&self.setup.consumer)
            .arg(millis(self.setup.claim_idle))
            .arg(&start)
            .arg("COUNT")
            .arg(count)
            .query_async(&mut connection)
            .await
            .map_err(|source| StreamError::Redis {
                command: "XAUTOCLAIM",
                source,
            })?;
        *self.cursor.lock().unwrap_or_else(|e| e.into_inner()) = reply.next_stream_id;
        if !reply.deleted_ids.is_empty() {
            // Trimmed or deleted while pending: Redis dropped them from the group's
            // pending list, and no one can handle them any more.
            tracing::warn!(
                stream = %self.setup.stream,
                group = %self.setup.group,
                entries = reply.deleted_ids.len(),
                "idem-consumer: pending entries were trimmed from the stream before they were handled; trim only below the oldest pending entry"
            );
        }
        if reply.claimed.is_empty() {
            return Ok(Vec::new());
        }
        let counts = self.delivery_counts(&reply.claimed).await;
        Ok(reply
            .claimed
            .into_iter()
            .map(|entry| {
                let delivered = counts.get(&entry.id).copied();
                self.message(entry, delivered)
            })
            .collect())
    }

    /// The group's delivery count of each claimed entry: one `XPENDING <id> <id> 1` each,
    /// in one pipeline (a range over them would also list this consumer's other pending
    /// entries, and run out of its count before the claimed ones). `None` for all when it
    /// fails: the entries are handled without a count rather than left for another claim.
    async fn delivery_counts(&self, claimed: &[StreamId]) -> BTreeMap<String, u64> {
        let mut pipeline = redis::pipe();
        for entry in claimed {
            pipeline
                .cmd("XPENDING")
                .arg(&self.setup.stream)
                .arg(&self.setup.group)
                .arg(&entry.id)
                .arg(&entry.id)
                .arg(1);
        }
        let mut connection = self.connection.clone();
        // Each: the id, its consumer, its idle time, its delivery count.
        type Pending = Vec<(String, String, u64, u64)>;
        let answers: Result<Vec<Pending>, _> = pipeline.query_async(&mut connection).await;
        match answers {
            Ok(answers) => answers
                .into_iter()
                .flatten()
                .map(|(id, _consumer, _idle, delivered)| (id, delivered))
                .collect(),
            Err(err) => {
                tracing::warn!(error = %err, "idem-consumer: could not read the claimed entries' delivery counts");
                BTreeMap::new()
            }
        }
    }

    fn message(&self, entry: StreamId, delivered: Option<u64>) -> RedisStreamMessage<C> {
        let fields: BTreeMap<String, Vec<u8>> = entry
            .map
            .into_iter()
            .map(|(field, value)| {
                let bytes = Vec::<u8>::from_redis_value(value).unwrap_or_default();
                (field, bytes)
            })
            .collect();
        let payload = match fields.get(&self.setup.payload_field) {
            Some(payload) => Bytes::from(payload.clone()),
            None => {
                let object: BTreeMap<&str, String> = fields
                    .iter()
                    .map(|(field, value)| {
                        (field.as_str(), String::from_utf8_lossy(value).into_owned())
                    })
                    .collect();
                Bytes::from(serde_json::to_vec(&object).unwrap_or_default())
            }
        };
        RedisStreamMessage {
            connection: self.connection.clone(),
            setup: Arc::clone(&self.setup),
            id: entry.id,
            payload,
            fields,
            delivered,
        }
    }
}

/// Batches of up to 16 entries, blocking up to 250 ms for a new one (under redis-rs's
/// default response timeout); call [`RedisStream::next_batch`] for others.
#[async_trait::async_trait]
impl<C> crate::Source for RedisStream<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Message = RedisStreamMessage<C>;
    type Error = StreamError;

    async fn next_batch(&self) -> Result<Vec<Self::Message>, StreamError> {
        RedisStream::next_batch(
            self,
            NonZeroUsize::new(16).unwrap(),
            Duration::from_millis(250),
        )
        .await
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An entry read from a consumer group, as a [`Message`].
pub struct RedisStreamMessage<C> {
    connection: C,
    setup: Arc<Setup>,
    id: String,
    payload: Bytes,
    fields: BTreeMap<String, Vec<u8>>,
    delivered: Option<u64>,
}

impl<C> fmt::Debug for RedisStreamMessage<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamMessage")
            .field("stream", &self.setup.stream)
            .field("group", &self.setup.group)
            .field("id", &self.id)
            .field("delivered", &self.delivered)
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

impl<C> RedisStreamMessage<C> {
    /// The entry's fields.
    pub fn fields(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.fields
    }
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> RedisStreamMessage<C> {
    /// `XCLAIM` of this entry for this consumer with `options` (`IDLE n`, `JUSTID`).
    async fn reclaim(&self, action: Settlement, idle: Duration) -> Result<(), SettleError> {
        let mut connection = self.connection.clone();
        let claimed: Vec<String> = redis::cmd("XCLAIM")
            .arg(&self.setup.stream)
            .arg(&self.setup.group)
            .arg(&self.setup.consumer)
            .arg(0)
            .arg(&self.id)
            .arg("IDLE")
            .arg(millis(idle))
            .arg("JUSTID")
            .query_async(&mut connection)
            .await
            .map_err(|err| SettleError::broker(action, err))?;
        if claimed.is_empty() {
            // Acked meanwhile, by this consumer or another that claimed it.
            return Err(SettleError::AlreadySettled { action });
        }
        Ok(())
    }

    async fn acknowledge(&self, action: Settlement) -> Result<(), SettleError> {
        let mut connection = self.connection.clone();
        let acked: u64 = redis::cmd("XACK")
            .arg(&self.setup.stream)
            .arg(&self.setup.group)
            .arg(&self.id)
            .query_async(&mut connection)
            .await
            .map_err(|err| SettleError::broker(action, err))?;
        if acked == 0 {
            return Err(SettleError::AlreadySettled { action });
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl<C: ConnectionLike + Clone + Send + Sync + 'static> Message for RedisStreamMessage<C> {
    fn id(&self) -> Option<&str> {
        Some(&self.id)
    }

    fn source(&self) -> &str {
        &self.setup.source
    }

    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        std::str::from_utf8(self.fields.get(name)?).ok()
    }

    fn delivery_count(&self) -> Option<u64> {
        self.delivered
    }

    fn progress_interval(&self) -> Option<Duration> {
        Some(self.setup.claim_idle / 3)
    }

    async fn in_progress(&self) -> Result<(), SettleError> {
        self.reclaim(Settlement::InProgress, Duration::ZERO).await
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.acknowledge(Settlement::Ack).await
    }

    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        // Idle for the claim time less the delay: claimable once the delay has passed.
        let idle = self.setup.claim_idle.saturating_sub(delay);
        self.reclaim(Settlement::Nak, idle).await
    }

    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        let action = Settlement::DeadLetter;
        match &self.setup.dead_letters {
            DeadLetters::Stream { key } => {
                let mut add = redis::cmd("XADD");
                add.arg(key)
                    .arg("*")
                    .arg(DEAD_LETTER_REASON)
                    .arg(reason.as_str())
                    .arg(ORIGINAL_STREAM)
                    .arg(&self.setup.stream)
                    .arg(ORIGINAL_GROUP)
                    .arg(&self.setup.group)
                    .arg(ORIGINAL_ID)
                    .arg(&self.id);
                for (field, value) in &self.fields {
                    add.arg(field).arg(value);
                }
                let mut connection = self.connection.clone();
                let _: String = add
                    .query_async(&mut connection)
                    .await
                    .map_err(|err| SettleError::broker(action, err))?;
            }
            DeadLetters::Acknowledge => {
                tracing::warn!(stream = %self.setup.stream, group = %self.setup.group, %reason, "idem-consumer: acknowledging a dead letter, which stays in its stream");
            }
        }
        self.acknowledge(action).await
    }
}
