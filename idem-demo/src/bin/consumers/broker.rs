//! The brokers: making a stream or a queue, publishing the orders, asking what is still
//! pending, and the workers' side, a stream of deliveries wrapped in idem-consumer's
//! adapters.

use std::fmt;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use idem_consumer::Message;
use idem_consumer::nats::JetStreamMessage;
use idem_consumer::rabbitmq::RabbitMessage;
use idem_core::BoxError;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};

use crate::Mode;

/// JetStream's wait for an ack before it delivers a message again: short, so a killed
/// worker's messages come back within the demo. RabbitMQ needs none: it requeues a
/// connection's unacked messages as soon as the connection drops.
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(1);

/// How many messages a worker holds at once: the pull batch on JetStream, the prefetch
/// on RabbitMQ, and the deliveries each worker handles concurrently.
pub(crate) const PREFETCH: usize = 4;

/// The JetStream consumer the workers of one stream share.
const CONSUMER: &str = "billing";

/// The longest the parent waits for one broker operation.
const PATIENCE: Duration = Duration::from_secs(10);

/// A broker the demo runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Broker {
    /// NATS JetStream: a stream and a durable pull consumer.
    Nats,
    /// RabbitMQ: a classic queue.
    Rabbitmq,
}

impl Broker {
    /// The name on the command line and in file names.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::Rabbitmq => "rabbitmq",
        }
    }

    /// The stream or queue of `mode` for the parent process `pid`.
    pub(crate) fn source(self, mode: Mode, pid: u32) -> String {
        match self {
            Broker::Nats => format!("IDEM_DEMO_{pid}_{}", mode.code().to_uppercase()),
            Broker::Rabbitmq => format!("idem-demo.{pid}.{}", mode.code()),
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::Nats => "NATS JetStream",
            Broker::Rabbitmq => "RabbitMQ",
        })
    }
}

/// What each message carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Order {
    /// The order's id, also the message id (`Nats-Msg-Id`, AMQP `message_id`).
    pub(crate) order: String,
    /// The amount to apply.
    pub(crate) cents: u64,
}

/// `what` within [`PATIENCE`], its error said with what was being done.
async fn patiently<T, E: fmt::Display>(
    what: &str,
    operation: impl Future<Output = Result<T, E>>,
) -> Result<T, BoxError> {
    match tokio::time::timeout(PATIENCE, operation).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(format!("{what}: {err}").into()),
        Err(_) => Err(format!("{what}: no answer within {PATIENCE:?}").into()),
    }
}

/// The parent's connections to both brokers.
pub(crate) struct Brokers {
    jetstream: jetstream::Context,
    amqp: Connection,
    channel: Channel,
}

impl Brokers {
    /// Connects to both brokers.
    pub(crate) async fn connect(nats_url: &str, amqp_url: &str) -> Result<Self, BoxError> {
        let hint =
            "is it running? `eval \"$(scripts/services.sh start nats rabbitmq)\"` starts both";
        let client = patiently(
            &format!("cannot reach NATS at {nats_url} ({hint})"),
            async_nats::connect(nats_url),
        )
        .await?;
        let amqp = patiently(
            &format!("cannot reach RabbitMQ at {amqp_url} ({hint})"),
            Connection::connect(amqp_url, ConnectionProperties::default()),
        )
        .await?;
        let channel = patiently("cannot open a RabbitMQ channel", amqp.create_channel()).await?;
        patiently(
            "RabbitMQ refused publisher confirms",
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok(Self {
            jetstream: jetstream::new(client),
            amqp,
            channel,
        })
    }

    /// Makes `source` afresh: a stream with its pull consumer, or a queue.
    pub(crate) async fn prepare(&self, broker: Broker, source: &str) -> Result<(), BoxError> {
        self.delete(broker, source).await;
        match broker {
            Broker::Nats => {
                let stream = patiently(
                    &format!("cannot create the JetStream stream {source}"),
                    self.jetstream.create_stream(jetstream::stream::Config {
                        name: source.to_owned(),
                        subjects: vec![format!("{source}.orders")],
                        storage: jetstream::stream::StorageType::Memory,
                        ..Default::default()
                    }),
                )
                .await?;
                patiently(
                    &format!("cannot create the pull consumer of {source}"),
                    stream.create_consumer(jetstream::consumer::pull::Config {
                        durable_name: Some(CONSUMER.to_owned()),
                        ack_wait: ACK_WAIT,
                        ..Default::default()
                    }),
                )
                .await?;
            }
            Broker::Rabbitmq => {
                patiently(
                    &format!("cannot declare the RabbitMQ queue {source}"),
                    self.channel.queue_declare(
                        source.into(),
                        QueueDeclareOptions::default(),
                        FieldTable::default(),
                    ),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Publishes the orders to `source`, each with its id as the message id, and waits
    /// until the broker has stored them all.
    pub(crate) async fn publish(
        &self,
        broker: Broker,
        source: &str,
        orders: &[Order],
    ) -> Result<(), BoxError> {
        let what = format!("cannot publish to {source}");
        match broker {
            Broker::Nats => {
                let mut acks = Vec::with_capacity(orders.len());
                for order in orders {
                    let mut headers = HeaderMap::new();
                    headers.insert(async_nats::header::NATS_MESSAGE_ID, order.order.as_str());
                    acks.push(
                        patiently(
                            &what,
                            self.jetstream.publish_with_headers(
                                format!("{source}.orders"),
                                headers,
                                serde_json::to_vec(order)?.into(),
                            ),
                        )
                        .await?,
                    );
                }
                for ack in acks {
                    patiently(&what, ack.into_future()).await?;
                }
            }
            Broker::Rabbitmq => {
                for order in orders {
                    let properties = BasicProperties::default()
                        .with_message_id(order.order.as_str().into())
                        .with_content_type("application/json".into());
                    patiently(
                        &what,
                        self.channel.basic_publish(
                            "".into(),
                            source.into(),
                            BasicPublishOptions::default(),
                            &serde_json::to_vec(order)?,
                            properties,
                        ),
                    )
                    .await?;
                }
                patiently(&what, self.channel.wait_for_confirms()).await?;
            }
        }
        Ok(())
    }

    /// Messages the broker still has to deliver or see acked: on JetStream, those not
    /// delivered yet and those awaiting an ack; on RabbitMQ, those ready in the queue
    /// (its unacked ones are with the workers, who report them).
    pub(crate) async fn pending(&self, broker: Broker, source: &str) -> Result<u64, BoxError> {
        let what = format!("cannot read the state of {source}");
        match broker {
            Broker::Nats => {
                let stream = patiently(&what, self.jetstream.get_stream(source)).await?;
                let mut consumer: PullConsumer =
                    patiently(&what, stream.get_consumer(CONSUMER)).await?;
                let info = patiently(&what, consumer.info()).await?;
                Ok(info.num_pending + info.num_ack_pending as u64)
            }
            Broker::Rabbitmq => {
                // A channel of its own: a failed passive declare closes its channel.
                let channel = patiently(&what, self.amqp.create_channel()).await?;
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                };
                let queue = patiently(
                    &what,
                    channel.queue_declare(source.into(), passive, FieldTable::default()),
                )
                .await?;
                let _ = channel.close(200, "done".into()).await;
                Ok(u64::from(queue.message_count()))
            }
        }
    }

    /// Deletes `source` if it exists (a leftover of an earlier run, or this run's).
    pub(crate) async fn delete(&self, broker: Broker, source: &str) {
        match broker {
            Broker::Nats => {
                let _ = tokio::time::timeout(PATIENCE, self.jetstream.delete_stream(source)).await;
            }
            Broker::Rabbitmq => {
                // On a channel of its own: deleting a missing queue is fine, but a failure
                // would close the publishing channel.
                if let Ok(Ok(channel)) =
                    tokio::time::timeout(PATIENCE, self.amqp.create_channel()).await
                {
                    let _ = tokio::time::timeout(
                        PATIENCE,
                        channel.queue_delete(source.into(), QueueDeleteOptions::default()),
                    )
                    .await;
                    let _ = channel.close(200, "done".into()).await;
                }
            }
        }
    }
}

/// A worker's deliveries from `source`, as idem-consumer's messages.
pub(crate) type Deliveries = BoxStream<'static, Result<Box<dyn Message>, BoxError>>;

/// Connects a worker to `source` and starts consuming, holding at most [`PREFETCH`]
/// messages at once.
pub(crate) async fn deliveries(
    broker: Broker,
    url: &str,
    source: &str,
) -> Result<Deliveries, BoxError> {
    match broker {
        Broker::Nats => {
            let client = async_nats::connect(url).await?;
            let jetstream = jetstream::new(client);
            let stream = jetstream.get_stream(source).await?;
            let consumer: PullConsumer = stream.get_consumer(CONSUMER).await?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(PREFETCH)
                .messages()
                .await?;
            Ok(messages
                .map(|message| match message {
                    Ok(message) => Ok(Box::new(JetStreamMessage::new(message)) as Box<dyn Message>),
                    Err(err) => Err(err.into()),
                })
                .boxed())
        }
        Broker::Rabbitmq => {
            let connection = Connection::connect(url, ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            channel
                .basic_qos(PREFETCH as u16, BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    source.into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            let queue = source.to_owned();
            Ok(consumer
                .map(move |delivery| {
                    // The stream owns the connection: it lives as long as the worker consumes.
                    let _connection = &connection;
                    match delivery {
                        Ok(delivery) => Ok(Box::new(RabbitMessage::new(delivery, queue.as_str()))
                            as Box<dyn Message>),
                        Err(err) => Err(err.into()),
                    }
                })
                .boxed())
        }
    }
}
