//! Handling deliveries: one ([`Consumer::handle`]), and a batch, each message settled on
//! its own, in order within its ordering group ([`Consumer::handle_batch`]).

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_core::{Context, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::Consumer;
use super::decision::Decision;
use super::progress::while_in_progress;
use crate::{Cause, Message, SettleError, Settled};

impl<S: Store + ?Sized + 'static> Consumer<S> {
    /// Runs `work` for one delivery, at most once per key across all deliveries, and
    /// settles the delivery with the broker as the table above says.
    ///
    /// - `work` gets the driver's [`Context`] (steps, derived keys, the fencing token)
    ///   and the payload.
    /// - The delivery is settled exactly once, after the answer is stored.
    /// - Everything runs in an `idem_consumer.handle` span (info level) with the
    ///   message's source and delivery count, and the `trace_id` and `parent_span_id` of
    ///   a valid W3C `traceparent` header the publisher set.
    /// - Dropping the returned future while `work` runs settles nothing, and the lease is
    ///   kept. A crash is the same. JetStream redelivers once its `ack_wait` ends, and that
    ///   delivery takes over when the lease ends. RabbitMQ has no acknowledgement timeout:
    ///   the delivery stays unacknowledged until its channel closes, so drop the channel,
    ///   or end the process, when you abandon a delivery.
    ///
    /// # Errors
    /// [`SettleError`] when the broker did not take the settlement; what was stored stays
    /// stored, and the broker's redelivery is answered from it.
    pub async fn handle<M, T, E, F, Fut>(
        &self,
        message: &M,
        work: F,
    ) -> Result<Settled<T, E>, SettleError>
    where
        M: Message + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let span = crate::trace::delivery_span(message);
        async {
            let decision = while_in_progress(message, self.decide(message, work)).await;
            self.settle(message, decision).await
        }
        .instrument(span)
        .await
    }

    /// [`Consumer::handle`] for each message of a batch, at most
    /// [`concurrency`](Consumer::concurrency) at a time, each under its own key; answers
    /// in the batch's order.
    ///
    /// - Each message is settled on its own: one failure never holds back, acks or
    ///   redelivers another, and a slow message never keeps the next from starting.
    /// - A message waiting for its turn is marked in progress with the broker
    ///   ([`Message::in_progress`]) as one that runs is, so it is not delivered again
    ///   while it waits.
    /// - Two deliveries of one message in a batch run it once: the second waits or is
    ///   retried as in flight, and a later delivery replays.
    /// - Messages of one ordering group ([`Message::ordering_key`]: an SQS FIFO queue's
    ///   message group) run one after another, in the batch's order; once one of them is
    ///   not acked, the ones after it are nak'd at once without running
    ///   ([`Cause::BehindUnacked`]), so that none overtakes it. Other groups go on.
    ///
    /// ```
    /// # use bytes::Bytes;
    /// # use idem_consumer::{Consumer, DeadLetterReason, Message, SettleError};
    /// # use idem_core::{Idempotency, MemoryStore, done};
    /// # use std::time::Duration;
    /// # struct Delivery(String, Bytes);
    /// # #[async_trait::async_trait]
    /// # impl Message for Delivery {
    /// #     fn id(&self) -> Option<&str> { Some(&self.0) }
    /// #     fn source(&self) -> &str { "payments" }
    /// #     fn payload(&self) -> &Bytes { &self.1 }
    /// #     async fn ack(&self) -> Result<(), SettleError> { Ok(()) }
    /// #     async fn nak(&self, _: Duration) -> Result<(), SettleError> { Ok(()) }
    /// #     async fn dead_letter(&self, _: DeadLetterReason) -> Result<(), SettleError> { Ok(()) }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    /// let batch: Vec<Delivery> = (0..10)
    ///     .map(|i| Delivery(format!("msg-{i}"), Bytes::from(format!("{i}"))))
    ///     .collect();
    /// let settled = consumer.handle_batch(&batch, |_ctx, payload| async move { done(payload.len()) }).await;
    /// assert!(settled.iter().all(|s| matches!(s, Ok(s) if s.is_acked())));
    /// # });
    /// ```
    pub async fn handle_batch<'m, M, T, E, F, Fut>(
        &self,
        messages: impl IntoIterator<Item = &'m M>,
        work: F,
    ) -> Vec<Result<Settled<T, E>, SettleError>>
    where
        M: Message + ?Sized + 'm,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        // `FuturesUnordered` of a method's futures rather than stream combinators over
        // closures: those make the future unprovably `Send` (rustc's "FnOnce is not
        // general enough"), and a consumer loop must be spawnable. Every message's future
        // starts at once, so each is marked in progress while it waits; the semaphore
        // bounds how many run.
        // A message behind an earlier one of its ordering group waits for that one's
        // settlement: a oneshot per message says whether it was acked.
        let permits = tokio::sync::Semaphore::new(self.concurrency.get());
        let mut last_of_group: std::collections::HashMap<String, oneshot::Receiver<bool>> =
            std::collections::HashMap::new();
        let mut running: futures_util::stream::FuturesUnordered<_> = messages
            .into_iter()
            .enumerate()
            .map(|(index, message)| {
                let (acked, turn) = oneshot::channel();
                let after = match message.ordering_key() {
                    Some(group) => last_of_group.insert(group.to_owned(), turn),
                    None => None,
                };
                self.handle_queued(index, message, &work, &permits, after, acked)
            })
            .collect();
        let mut settled = Vec::with_capacity(running.len());
        while let Some(answer) = running.next().await {
            settled.push(answer);
        }
        settled.sort_unstable_by_key(|(index, _)| *index);
        settled.into_iter().map(|(_, settled)| settled).collect()
    }

    /// [`Consumer::handle`] once a permit is free, marked in progress from the start,
    /// answered with the message's place in its batch.
    async fn handle_queued<M, T, E, F, Fut>(
        &self,
        index: usize,
        message: &M,
        work: &F,
        permits: &tokio::sync::Semaphore,
        after: Option<oneshot::Receiver<bool>>,
        acked: oneshot::Sender<bool>,
    ) -> (usize, Result<Settled<T, E>, SettleError>)
    where
        M: Message + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let span = crate::trace::delivery_span(message);
        let handled = async {
            let run = async {
                // Behind an earlier message of its ordering group: its turn comes once
                // that one is acked; if it was not, this one must not overtake it.
                if let Some(after) = after
                    && !after.await.unwrap_or(false)
                {
                    let behind = Decision::Nak {
                        delay: Duration::ZERO,
                        cause: Cause::BehindUnacked,
                    };
                    return (None, behind);
                }
                // Never closed: the semaphore lives as long as the batch.
                let permit = permits.acquire().await.ok();
                (permit, self.decide(message, work).await)
            };
            let (_permit, decision) = while_in_progress(message, run).await;
            let settled = self.settle(message, decision).await;
            let _ = acked.send(matches!(settled, Ok(Settled::Acked { .. })));
            settled
        };
        (index, handled.instrument(span).await)
    }
}
