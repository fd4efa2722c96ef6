//! The Lambda example's handler on the AWS Labs runtime (`lambda_runtime::run`), against
//! a Lambda Runtime API served here on 127.0.0.1: the runtime fetches each invocation,
//! runs the handler, and posts its answer, as it does on AWS.
//!
//! The runtime reads its settings from the environment: the function runs in a process of
//! its own (this test binary again, told so by `IDEM_LAMBDA_FUNCTION`), as on AWS.

#[path = "../examples/lambda_sqs.rs"]
#[allow(dead_code)] // the example's `main`
mod example;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use idem_consumer::Consumer;
use idem_core::{Idempotency, MemoryStore};
use lambda_runtime::service_fn;
use tokio::sync::mpsc;

#[derive(Clone)]
struct RuntimeApi {
    invocations: Arc<Mutex<VecDeque<(String, serde_json::Value)>>>,
    answers: mpsc::UnboundedSender<(String, Result<serde_json::Value, String>)>,
}

async fn next(State(api): State<RuntimeApi>) -> (HeaderMap, String) {
    loop {
        let next = api.invocations.lock().unwrap().pop_front();
        if let Some((id, event)) = next {
            let deadline =
                SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(60);
            let mut headers = HeaderMap::new();
            headers.insert(
                "lambda-runtime-aws-request-id",
                HeaderValue::from_str(&id).unwrap(),
            );
            headers.insert(
                "lambda-runtime-deadline-ms",
                HeaderValue::from_str(&deadline.as_millis().to_string()).unwrap(),
            );
            headers.insert(
                "lambda-runtime-invoked-function-arn",
                HeaderValue::from_static("arn:aws:lambda:us-east-2:123456789012:function:orders"),
            );
            return (headers, event.to_string());
        }
        // Long polling, as the real API: the runtime waits for the next invocation.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn response(
    State(api): State<RuntimeApi>,
    Path(id): Path<String>,
    body: String,
) -> StatusCode {
    let _ = api
        .answers
        .send((id, serde_json::from_str(&body).map_err(|_| body)));
    StatusCode::ACCEPTED
}

async fn error(State(api): State<RuntimeApi>, Path(id): Path<String>, body: String) -> StatusCode {
    let _ = api.answers.send((id, Err(body)));
    StatusCode::ACCEPTED
}

fn sqs_event(records: &[(&str, &str)]) -> serde_json::Value {
    let records: Vec<_> = records
        .iter()
        .map(|(id, body)| {
            serde_json::json!({
                "messageId": id,
                "receiptHandle": format!("AQEB...{id}"),
                "body": body,
                "attributes": { "ApproximateReceiveCount": "1", "SentTimestamp": "1545082649183" },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-2:123456789012:orders",
                "awsRegion": "us-east-2"
            })
        })
        .collect();
    serde_json::json!({ "Records": records })
}

const TEST: &str = "the_runtime_answers_each_invocation_with_its_failed_records_only";

#[test]
fn the_runtime_answers_each_invocation_with_its_failed_records_only() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if std::env::var_os("IDEM_LAMBDA_FUNCTION").is_some() {
        // The function's process: the example's handler on the runtime, until killed.
        let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
        let ran = runtime.block_on(lambda_runtime::run(service_fn(|event| {
            example::orders(&consumer, event)
        })));
        panic!("the runtime stopped: {ran:?}");
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port on loopback");
    let address = listener.local_addr().unwrap();
    runtime.block_on(async move {
        let (answers, mut answered) = mpsc::unbounded_channel();
        let api = RuntimeApi {
            invocations: Arc::new(Mutex::new(VecDeque::from([
                (
                    "invocation-1".to_owned(),
                    sqs_event(&[
                        ("m-1", r#"{"order":"o-1","cents":500}"#),
                        ("m-2", r#"{"order":"o-2","cents":-1}"#),
                    ]),
                ),
                // SQS delivers m-1 again (its first answer was lost): a success again.
                (
                    "invocation-2".to_owned(),
                    sqs_event(&[("m-1", r#"{"order":"o-1","cents":500}"#)]),
                ),
            ]))),
            answers,
        };
        let app = Router::new()
            .route("/2018-06-01/runtime/invocation/next", get(next))
            .route(
                "/2018-06-01/runtime/invocation/{id}/response",
                post(response),
            )
            .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
            .with_state(api);
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let mut function = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture"])
            .env("IDEM_LAMBDA_FUNCTION", "1")
            .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
            .env("AWS_LAMBDA_FUNCTION_NAME", "orders")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "test")
            .kill_on_drop(true)
            .spawn()
            .expect("start the function's process");

        let mut got = Vec::new();
        for _ in 0..2 {
            let answer = tokio::time::timeout(Duration::from_secs(30), answered.recv())
                .await
                .expect("the runtime answers within the wait")
                .expect("the API is up");
            got.push(answer);
        }
        function.kill().await.expect("stop the function");
        server.abort();
        assert_eq!(got[0].0, "invocation-1");
        assert_eq!(
            got[0].1.as_ref().expect("a response, not an error"),
            &serde_json::json!({ "batchItemFailures": [{ "itemIdentifier": "m-2" }] })
        );
        assert_eq!(got[1].0, "invocation-2");
        assert_eq!(
            got[1].1.as_ref().expect("a response, not an error"),
            &serde_json::json!({ "batchItemFailures": [] })
        );
    });
}
