//! The consumer loop: [`Source`], [`Consumer::run`] and its [`RunReport`], and
//! [`StreamSource`] for brokers whose client hands out a stream of deliveries.

use std::future::Future;
use std::num::NonZeroUsize;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::Fuse;
use futures_util::{FutureExt, Stream, StreamExt};
use idem_core::{Context, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Consumer, Message, SettleError, Settled};

/// Where [`Consumer::run`] gets its deliveries: a broker's reader. Implemented by the
/// adapters' readers (`redis::RedisStream`, `sqs::SqsQueue`) and by [`StreamSource`] over
/// any stream of deliveries (a JetStream pull consumer's messages, a lapin consumer).
#[async_trait::async_trait]
pub trait Source: Send + Sync {
    /// One delivery.
    type Message: Message;
    /// Why receiving failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// True when `error` means no delivery will ever come from this source again (a
    /// subscription the broker closed): [`Consumer::run`] stops instead of asking again.
    /// The default is false.
    fn is_end(error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// The next deliveries: waits a while (a long poll) for the first, and answers an
    /// empty batch when none came.
    ///
    /// - Dropping the future stops the wait; whatever the broker handed out meanwhile is
    ///   delivered again once its acknowledgement timeout ends.
    ///
    /// # Errors
    /// The broker refused or could not be reached; [`Consumer::run`] waits its backoff
    /// and asks again.
    async fn next_batch(&self) -> Result<Vec<Self::Message>, Self::Error>;
}

/// What [`Consumer::run`] did, counted per delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Deliveries acked after the work ran.
    pub acked: u64,
    /// Deliveries acked with a stored answer, the work not run.
    pub replayed: u64,
    /// Deliveries nak'd, to come again.
    pub retried: u64,
    /// Deliveries sent to the dead-letter path.
    pub dead_lettered: u64,
    /// Deliveries the broker did not take a settlement for (they come again).
    pub unsettled: u64,
    /// Batches the source failed to receive.
    pub receive_errors: u64,
}

impl RunReport {
    fn count<T, E>(&mut self, settled: &Result<Settled<T, E>, SettleError>) {
        match settled {
            Ok(Settled::Acked { replayed: true, .. }) => self.replayed += 1,
            Ok(Settled::Acked { .. }) => self.acked += 1,
            Ok(Settled::Retried { .. }) => self.retried += 1,
            Ok(Settled::DeadLettered { .. }) => self.dead_lettered += 1,
            Err(_) => self.unsettled += 1,
        }
    }
}

impl<S: Store + ?Sized + 'static> Consumer<S> {
    /// Handles every delivery of `source` ([`Consumer::handle_batch`], batch after batch)
    /// until `shutdown` completes, then stops gracefully.
    ///
    /// - Shutdown stops fetching at once; a batch being handled runs to its end and every
    ///   delivery of it is settled before `run` returns. A receive cut off by shutdown may
    ///   have been handed messages: they come back after the broker's acknowledgement
    ///   timeout (an SQS receive counts toward `maxReceiveCount`). A batch can take several
    ///   [`Consumer::work_timeout`]s (an ordering group's messages run one after another)
    ///   and its store calls are not limited: keep batches small enough for the platform's
    ///   grace period (a Kubernetes pod's 30 s by default).
    /// - A source that ended ([`Source::is_end`]: a subscription the broker closed) stops
    ///   `run`, counted in [`RunReport::receive_errors`].
    /// - A receive that fails is logged and retried after the consumer's backoff, growing
    ///   with each failure in a row, until shutdown.
    /// - A settlement the broker refused is counted ([`RunReport::unsettled`]) and logged:
    ///   the broker delivers the message again, and the stored answer is replayed.
    ///
    /// ```no_run
    /// # use idem_consumer::Consumer;
    /// # use idem_consumer::redis::{DeadLetters, RedisStream};
    /// # use idem_core::{Idempotency, MemoryStore, done};
    /// # async fn consume(connection: redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
    /// let orders = RedisStream::new(connection, "orders", "billing", "billing-1", DeadLetters::to_stream("orders:dead"));
    /// orders.create_group().await?;
    /// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    /// // A SIGTERM handler (tokio's `signal` feature) sends on `stop`.
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let shutdown = async { stopped.await.ok(); };
    /// let report = consumer.run(&orders, |_ctx, payload| async move { done(payload.len()) }, shutdown).await;
    /// println!("stopped: {report:?}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run<Src, T, E, F, Fut>(
        &self,
        source: &Src,
        work: F,
        shutdown: impl Future<Output = ()>,
    ) -> RunReport
    where
        Src: Source + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let mut report = RunReport::default();
        let mut failures_in_a_row = 0u64;
        tokio::pin!(shutdown);
        loop {
            let batch = tokio::select! {
                biased;
                () = &mut shutdown => break,
                batch = source.next_batch() => batch,
            };
            match batch {
                Ok(batch) => {
                    failures_in_a_row = 0;
                    for settled in self.handle_batch(&batch, &work).await {
                        if let Err(err) = &settled {
                            tracing::warn!(error = %err, "idem-consumer: a settlement was not taken; the broker delivers the message again");
                        }
                        report.count(&settled);
                    }
                }
                Err(err) if Src::is_end(&err) => {
                    tracing::error!(error = %err, "idem-consumer: the source ended; run stops");
                    report.receive_errors += 1;
                    break;
                }
                Err(err) => {
                    failures_in_a_row += 1;
                    report.receive_errors += 1;
                    let delay = self.retry_delay(failures_in_a_row);
                    tracing::warn!(error = %err, ?delay, "idem-consumer: receiving failed; trying again");
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        report
    }
}

/// A [`Source`] over a stream of deliveries: each batch is the next delivery (waiting
/// for it, at most `wait`), and the ones after it that are ready at once, up to `max`.
///
/// ```no_run
/// # use futures_util::StreamExt;
/// # use idem_consumer::{Consumer, StreamSource};
/// # use idem_consumer::nats::{DeadLetters, JetStreamSource};
/// # use idem_core::{Idempotency, MemoryStore, done};
/// # use std::num::NonZeroUsize;
/// # use std::time::Duration;
/// # async fn consume(pull: async_nats::jetstream::consumer::PullConsumer) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let checked = JetStreamSource::new(pull.cached_info(), DeadLetters::publish_to("DLQ.orders"))?;
/// let messages = pull.messages().await?.map(move |message| message.map(|m| checked.wrap(m)));
/// let source = StreamSource::new(messages, NonZeroUsize::new(16).unwrap(), Duration::from_secs(1));
/// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
/// // A SIGTERM handler (tokio's `signal` feature) sends on `stop`.
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let shutdown = async { stopped.await.ok(); };
/// consumer.run(&source, |_ctx, payload| async move { done(payload.len()) }, shutdown).await;
/// # Ok(())
/// # }
/// ```
pub struct StreamSource<St> {
    // Fused: a stream that ended answers its end again, instead of being polled past it.
    stream: tokio::sync::Mutex<Fuse<St>>,
    max: NonZeroUsize,
    wait: Duration,
}

impl<St> std::fmt::Debug for StreamSource<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSource")
            .field("max", &self.max)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl<St> StreamSource<St> {
    /// Batches of at most `max` deliveries from `stream`, waiting at most `wait` for the
    /// first of each.
    pub fn new(stream: St, max: NonZeroUsize, wait: Duration) -> Self
    where
        St: Stream,
    {
        Self {
            stream: tokio::sync::Mutex::new(stream.fuse()),
            max,
            // An empty batch at once would make the loop spin.
            wait: wait.max(Duration::from_millis(1)),
        }
    }
}

/// The stream behind a [`StreamSource`] ended: the broker closed the subscription.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamSourceError<E> {
    /// The client answered an error instead of a delivery.
    #[error("the broker's client failed: {0}")]
    Client(#[source] E),
    /// The stream ended; nothing more will come from it.
    #[error("the stream of deliveries ended; subscribe again")]
    Ended,
}

#[async_trait::async_trait]
impl<St, M, E> Source for StreamSource<St>
where
    St: Stream<Item = Result<M, E>> + Unpin + Send,
    M: Message + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    type Message = M;
    type Error = StreamSourceError<E>;

    fn is_end(error: &StreamSourceError<E>) -> bool {
        matches!(error, StreamSourceError::Ended)
    }

    async fn next_batch(&self) -> Result<Vec<M>, StreamSourceError<E>> {
        let mut stream = self.stream.lock().await;
        let first = match tokio::time::timeout(self.wait, stream.next()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(None) => return Err(StreamSourceError::Ended),
            Ok(Some(first)) => first.map_err(StreamSourceError::Client)?,
        };
        let mut batch = vec![first];
        while batch.len() < self.max.get() {
            match stream.next().now_or_never() {
                Some(Some(Ok(message))) => batch.push(message),
                Some(Some(Err(err))) => {
                    // The deliveries before it are handled; the client goes on or ends.
                    tracing::warn!(error = %err, "idem-consumer: the broker's client failed between deliveries");
                    break;
                }
                // The end, or nothing ready: the next call meets it.
                _ => break,
            }
        }
        Ok(batch)
    }
}
