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
use idem_consumer::redis::RedisStream;
use idem_consumer::sqs::SqsQueue;
use idem_core::BoxError;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;

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
    /// Redis Streams: a stream and a consumer group.
    Redis,
    /// Amazon SQS (a local SQS-compatible server): a standard queue.
    Sqs,
}

impl Broker {
    /// The name on the command line and in file names.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Broker::Nats => "nats",
            Broker::Rabbitmq => "rabbitmq",
            Broker::Redis => "redis",
            Broker::Sqs => "sqs",
        }
    }

    /// The stream or queue of `mode` for the parent process `pid`.
    pub(crate) fn source(self, mode: Mode, pid: u32) -> String {
        match self {
            Broker::Nats => format!("IDEM_DEMO_{pid}_{}", mode.code().to_uppercase()),
            Broker::Rabbitmq => format!("idem-demo.{pid}.{}", mode.code()),
            Broker::Redis => format!("idem-demo:{pid}:{}", mode.code()),
            Broker::Sqs => format!("idem-demo-{pid}-{}", mode.code()),
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Broker::Nats => "NATS JetStream",
            Broker::Rabbitmq => "RabbitMQ",
            Broker::Redis => "Redis Streams",
            Broker::Sqs => "SQS",
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

/// The parent's connections to every broker.
pub(crate) struct Brokers {
    jetstream: jetstream::Context,
    amqp: Connection,
    channel: Channel,
    redis: redis::aio::MultiplexedConnection,
    sqs: aws_sdk_sqs::Client,
    sqs_endpoint: String,
}

/// Where each broker is.
pub(crate) struct Urls {
    pub(crate) nats: String,
    pub(crate) amqp: String,
    pub(crate) redis: String,
    pub(crate) sqs: String,
}

impl Urls {
    /// The URL of `broker`.
    pub(crate) fn of(&self, broker: Broker) -> &str {
        match broker {
            Broker::Nats => &self.nats,
            Broker::Rabbitmq => &self.amqp,
            Broker::Redis => &self.redis,
            Broker::Sqs => &self.sqs,
        }
    }
}

/// An SQS client for the local server at `url` (static test credentials, one region).
pub(crate) fn sqs_client(url: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(Credentials::new("demo", "demo", None, None, "idem-demo"))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// The URL of the SQS queue `name` on the local server at `url`.
fn sqs_queue_url(url: &str, name: &str) -> String {
    format!("{}/000000000000/{name}", url.trim_end_matches('/'))
}

impl Brokers {
    /// Connects to every broker.
    pub(crate) async fn connect(urls: &Urls) -> Result<Self, BoxError> {
        let (nats_url, amqp_url) = (&urls.nats, &urls.amqp);
        let hint = "is it running? `eval \"$(scripts/services.sh start nats rabbitmq redis sqs)\"` starts them";
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
        let redis = patiently(
            &format!("cannot reach Redis at {} ({hint})", urls.redis),
            async {
                redis::Client::open(urls.redis.as_str())?
                    .get_multiplexed_async_connection()
                    .await
            },
        )
        .await?;
        let sqs = sqs_client(&urls.sqs);
        patiently(
            &format!("cannot reach SQS at {} ({hint})", urls.sqs),
            sqs.list_queues().send(),
        )
        .await?;
        Ok(Self {
            jetstream: jetstream::new(client),
            amqp,
            channel,
            redis,
            sqs,
            sqs_endpoint: urls.sqs.clone(),
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
            Broker::Redis => {
                let mut redis = self.redis.clone();
                patiently(
                    &format!("cannot create the Redis stream {source} and its group"),
                    redis::cmd("XGROUP")
                        .arg("CREATE")
                        .arg(source)
                        .arg(CONSUMER)
                        .arg("0")
                        .arg("MKSTREAM")
                        .query_async::<()>(&mut redis),
                )
                .await?;
            }
            Broker::Sqs => {
                for name in [source.to_owned(), format!("{source}-dead")] {
                    patiently(
                        &format!("cannot create the SQS queue {name}"),
                        self.sqs.create_queue().queue_name(&name).send(),
                    )
                    .await?;
                }
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
            Broker::Redis => {
                let mut pipeline = redis::pipe();
                for order in orders {
                    pipeline
                        .cmd("XADD")
                        .arg(source)
                        .arg("*")
                        .arg("payload")
                        .arg(serde_json::to_vec(order)?)
                        .ignore();
                }
                let mut redis = self.redis.clone();
                patiently(&what, pipeline.query_async::<()>(&mut redis)).await?;
            }
            Broker::Sqs => {
                let url = self.sqs_url(source);
                for chunk in orders.chunks(10) {
                    let mut batch = self.sqs.send_message_batch().queue_url(&url);
                    for (i, order) in chunk.iter().enumerate() {
                        batch = batch.entries(
                            aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                                .id(i.to_string())
                                .message_body(serde_json::to_string(order)?)
                                .build()?,
                        );
                    }
                    let sent = patiently(&what, batch.send()).await?;
                    if !sent.failed().is_empty() {
                        return Err(format!("{what}: {:?}", sent.failed()).into());
                    }
                }
            }
        }
        Ok(())
    }

    fn sqs_url(&self, source: &str) -> String {
        sqs_queue_url(&self.sqs_endpoint, source)
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
            Broker::Redis => {
                // The group's entries delivered and not acked, and those not delivered yet:
                // the stream's entries added less the group's entries read (Redis 7); where
                // a count is missing, whether the group has read up to the last entry.
                let mut redis = self.redis.clone();
                type Fields = std::collections::HashMap<String, redis::Value>;
                let stream: Fields = patiently(
                    &what,
                    redis::cmd("XINFO")
                        .arg("STREAM")
                        .arg(source)
                        .query_async(&mut redis),
                )
                .await?;
                let groups: Vec<Fields> = patiently(
                    &what,
                    redis::cmd("XINFO")
                        .arg("GROUPS")
                        .arg(source)
                        .query_async(&mut redis),
                )
                .await?;
                let number = |fields: &Fields, field: &str| match fields.get(field) {
                    Some(redis::Value::Int(n)) => u64::try_from(*n).ok(),
                    _ => None,
                };
                let text = |fields: &Fields, field: &str| match fields.get(field) {
                    Some(redis::Value::BulkString(bytes)) => Some(bytes.clone()),
                    Some(redis::Value::SimpleString(text)) => Some(text.clone().into_bytes()),
                    _ => None,
                };
                let Some(group) = groups.first() else {
                    return Err(format!("{what}: the stream has no group").into());
                };
                let unread = match (
                    number(&stream, "entries-added"),
                    number(group, "entries-read"),
                ) {
                    (Some(added), Some(read)) => added.saturating_sub(read),
                    _ => u64::from(
                        text(&stream, "last-generated-id") != text(group, "last-delivered-id"),
                    ),
                };
                Ok(number(group, "pending").unwrap_or(0) + unread)
            }
            Broker::Sqs => {
                use aws_sdk_sqs::types::QueueAttributeName;
                let attributes = patiently(
                    &what,
                    self.sqs
                        .get_queue_attributes()
                        .queue_url(self.sqs_url(source))
                        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                        .send(),
                )
                .await?;
                Ok(attributes
                    .attributes()
                    .map(|all| all.values().filter_map(|n| n.parse::<u64>().ok()).sum())
                    .unwrap_or(0))
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
            Broker::Redis => {
                let mut redis = self.redis.clone();
                let _ = tokio::time::timeout(
                    PATIENCE,
                    redis::cmd("DEL")
                        .arg(source)
                        .arg(format!("{source}:dead"))
                        .query_async::<()>(&mut redis),
                )
                .await;
            }
            Broker::Sqs => {
                for name in [source.to_owned(), format!("{source}-dead")] {
                    let _ = tokio::time::timeout(
                        PATIENCE,
                        self.sqs
                            .delete_queue()
                            .queue_url(self.sqs_url(&name))
                            .send(),
                    )
                    .await;
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
        Broker::Redis => {
            let connection = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            let reader = RedisStream::new(
                connection,
                source,
                CONSUMER,
                format!("worker-{}", std::process::id()),
                idem_consumer::redis::DeadLetters::to_stream(format!("{source}:dead")),
            )
            // As JetStream's ack wait: a killed worker's entries are claimed after it.
            .claim_idle(ACK_WAIT);
            let batches = futures_util::stream::unfold(reader, |reader| async move {
                let batch = reader
                    .next_batch(
                        NonZeroUsize::new(PREFETCH).unwrap(),
                        Duration::from_millis(250),
                    )
                    .await;
                Some((batch, reader))
            });
            Ok(one_by_one(batches))
        }
        Broker::Sqs => {
            let queue = SqsQueue::new(
                sqs_client(url),
                sqs_queue_url(url, source),
                idem_consumer::sqs::DeadLetters::send_to(sqs_queue_url(
                    url,
                    &format!("{source}-dead"),
                )),
            )
            // SQS's shortest: a killed worker's messages come back after it.
            .visibility(Duration::from_secs(1));
            let batches = futures_util::stream::unfold(queue, |queue| async move {
                let batch = queue.next_batch(PREFETCH, Duration::from_secs(1)).await;
                Some((batch, queue))
            });
            Ok(one_by_one(batches))
        }
    }
}

/// The deliveries of each batch, one after another.
fn one_by_one<M, E>(
    batches: impl futures_util::Stream<Item = Result<Vec<M>, E>> + Send + 'static,
) -> Deliveries
where
    M: Message + 'static,
    E: Into<BoxError>,
{
    batches
        .flat_map(|batch| {
            let items: Vec<Result<Box<dyn Message>, BoxError>> = match batch {
                Ok(batch) => batch
                    .into_iter()
                    .map(|message| Ok(Box::new(message) as Box<dyn Message>))
                    .collect(),
                Err(err) => vec![Err(err.into())],
            };
            futures_util::stream::iter(items)
        })
        .boxed()
}
