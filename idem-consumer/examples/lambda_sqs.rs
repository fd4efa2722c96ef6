//! An AWS Lambda function for an SQS event source, charging each order once however often
//! SQS delivers it, and answering partial batch failures so only failed orders come back.
//!
//! Build it with cargo-lambda (`cargo lambda build --release --example lambda_sqs
//! --features lambda`) and turn on `ReportBatchItemFailures` in the event source mapping.
//! The memory store here lives and dies with one container: a deployed function uses a
//! shared store (idem-dynamodb's, say), built once outside the handler as this one is.
//! `tests/lambda_runtime.rs` runs this handler on the AWS Labs runtime against a local
//! Runtime API.

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use bytes::Bytes;
use idem_consumer::Consumer;
use idem_consumer::lambda::handle_sqs_event;
use idem_core::{Context, MemoryStore, WorkError, WorkResult};
use lambda_runtime::{Error, LambdaEvent, service_fn};

/// Charges one order: `{"order": "o-1", "cents": 500}`.
async fn charge(_ctx: Context, payload: Bytes) -> WorkResult<String, String> {
    let order: serde_json::Value = serde_json::from_slice(&payload)
        .map_err(|err| WorkError::Permanent(format!("not an order: {err}")))?;
    match order["cents"].as_i64() {
        Some(cents) if cents > 0 => Ok(format!("charged {cents} cents for {}", order["order"])),
        _ => Err(WorkError::Permanent(
            "an order without a positive amount".to_owned(),
        )),
    }
}

/// The function's handler: every record through the consumer, the failed ones answered.
pub(crate) async fn orders(
    consumer: &Consumer<MemoryStore>,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, Error> {
    Ok(handle_sqs_event(consumer, event.payload, charge).await)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let consumer = Consumer::new(idem_core::Idempotency::new(MemoryStore::new()));
    lambda_runtime::run(service_fn(|event| orders(&consumer, event))).await
}
