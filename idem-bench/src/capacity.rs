//! What each store call costs on DynamoDB in capacity units, and what a claim that reads
//! first changes: fresh and replayed, for stored results from 36 bytes to 350 KB.
//!
//! Every request of the store's client asks for `ReturnConsumedCapacity: TOTAL` (an SDK
//! interceptor sets it, so the store's own requests are measured) and the units each
//! answer reports are logged. A failed conditional write (a replay, an in-flight answer or
//! a mismatch on the write path) reports none: DynamoDB returns no consumed capacity with
//! `ConditionalCheckFailedException`, and bills it as a write of the item's size (at least
//! one unit); the table shows that size's units from the completion, which wrote the same
//! item, and says so.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeSerializationInterceptorContextMut,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use idem_core::store::{ClaimOutcome, ClaimRequest, WriteOutcome};
use idem_core::{Fingerprint, Key, Store};
use idem_dynamodb::DynamoDbStore;
use serde::Serialize;

use crate::target::BoxError;

/// The table of this measurement, deleted when it ends.
const TABLE: &str = "idem_bench_capacity";

/// Stored result sizes measured.
const SIZES: [usize; 6] = [36, 1_000, 4_000, 10_000, 100_000, 350_000];

/// One request and the units its answer reported (`None`: it reported none).
#[derive(Clone, Debug)]
struct Logged {
    operation: &'static str,
    units: Option<f64>,
}

/// Asks every request for its consumed capacity and logs what comes back.
#[derive(Clone, Debug, Default)]
struct CapacityMeter {
    log: Arc<Mutex<Vec<Logged>>>,
}

impl CapacityMeter {
    fn take(&self) -> Vec<Logged> {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Intercept for CapacityMeter {
    fn name(&self) -> &'static str {
        "idem-bench capacity meter"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        use aws_sdk_dynamodb::operation::{
            delete_item::DeleteItemInput, get_item::GetItemInput, update_item::UpdateItemInput,
        };
        let input = context.input_mut();
        let total = Some(ReturnConsumedCapacity::Total);
        if let Some(input) = input.downcast_mut::<UpdateItemInput>() {
            input.return_consumed_capacity = total;
        } else if let Some(input) = input.downcast_mut::<GetItemInput>() {
            input.return_consumed_capacity = total;
        } else if let Some(input) = input.downcast_mut::<DeleteItemInput>() {
            input.return_consumed_capacity = total;
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        use aws_sdk_dynamodb::operation::{
            delete_item::DeleteItemOutput, get_item::GetItemOutput, update_item::UpdateItemOutput,
        };
        let logged = match context.output_or_error() {
            Ok(output) => {
                if let Some(out) = output.downcast_ref::<UpdateItemOutput>() {
                    Logged {
                        operation: "UpdateItem",
                        units: out.consumed_capacity().and_then(|c| c.capacity_units()),
                    }
                } else if let Some(out) = output.downcast_ref::<GetItemOutput>() {
                    Logged {
                        operation: "GetItem",
                        units: out.consumed_capacity().and_then(|c| c.capacity_units()),
                    }
                } else if let Some(out) = output.downcast_ref::<DeleteItemOutput>() {
                    Logged {
                        operation: "DeleteItem",
                        units: out.consumed_capacity().and_then(|c| c.capacity_units()),
                    }
                } else {
                    Logged {
                        operation: "other",
                        units: None,
                    }
                }
            }
            Err(_) => Logged {
                operation: "failed condition",
                units: None,
            },
        };
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(logged);
        Ok(())
    }
}

/// One stored result size, on one claim path.
#[derive(Serialize)]
pub(crate) struct CapacityRow {
    /// `write first` (the default) or `read first` (`claim_reads_first(true)`).
    pub(crate) path: &'static str,
    pub(crate) result_bytes: usize,
    /// Requests and units of a fresh claim, e.g. `UpdateItem 1`.
    pub(crate) fresh_claim: String,
    pub(crate) fresh_claim_units: f64,
    /// Units of the completion that stored the result.
    pub(crate) complete_units: f64,
    /// Requests and units of a replay.
    pub(crate) replay: String,
    /// Write units for the write path (billed, not reported: the completion's units),
    /// read units for the read path.
    pub(crate) replay_units: f64,
    pub(crate) replay_unit_kind: &'static str,
    /// p50 over the timed calls (µs), fresh claim and replay.
    pub(crate) fresh_claim_p50_us: f64,
    pub(crate) replay_p50_us: f64,
}

fn describe(logged: &[Logged]) -> String {
    logged
        .iter()
        .map(|l| match l.units {
            Some(units) => format!("{} {units}", l.operation),
            None => l.operation.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

fn units(logged: &[Logged]) -> f64 {
    logged.iter().filter_map(|l| l.units).sum()
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples
        .get(samples.len() / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

async fn claimed(store: &DynamoDbStore, request: &ClaimRequest) -> Result<(), BoxError> {
    match store.claim(request).await? {
        ClaimOutcome::Claimed { lease, .. } => {
            let _ = lease;
            Ok(())
        }
        other => Err(format!("a fresh key answered {other:?}").into()),
    }
}

/// Measures both claim paths at every size, `timed` calls each for the latencies.
pub(crate) async fn run(timed: usize) -> Result<Vec<CapacityRow>, BoxError> {
    let Some(endpoint) = crate::service("IDEM_TEST_DYNAMODB_ENDPOINT")? else {
        return Ok(Vec::new());
    };
    let meter = CapacityMeter::default();
    let config = crate::backends::dynamodb_config(&endpoint)
        .to_builder()
        .interceptor(meter.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let _ = client.delete_table().table_name(TABLE).send().await;
    idem_dynamodb::create_table(&client, TABLE).await?;
    let mut rows = Vec::new();
    let lease = Duration::from_secs(60);
    let retention = Duration::from_secs(3600);
    for (path, read_first) in [("write first", false), ("read first", true)] {
        let store = DynamoDbStore::builder(client.clone(), TABLE)?
            .prefix(&format!("{}#{path}#", std::process::id()))?
            .claim_reads_first(read_first)
            .build();
        for size in SIZES {
            let result = vec![b'x'; size];
            let fingerprint = Fingerprint::of_bytes(format!("capacity {size}"));
            let request = |name: String| -> Result<ClaimRequest, BoxError> {
                Ok(ClaimRequest::new(
                    Key::new("bench/capacity", name)?,
                    fingerprint,
                    lease,
                    retention,
                ))
            };
            // One key, its units logged call by call.
            let first = request(format!("{size}-units"))?;
            meter.take();
            let ClaimOutcome::Claimed { lease: owned, .. } = store.claim(&first).await? else {
                return Err("a fresh key was not claimed".into());
            };
            let fresh = meter.take();
            if store.complete(&owned, &result).await? != WriteOutcome::Applied {
                return Err("the completion was fenced".into());
            }
            let complete = meter.take();
            let again = request(format!("{size}-units"))?;
            if !matches!(store.claim(&again).await?, ClaimOutcome::Replay { .. }) {
                return Err("a completed key did not replay".into());
            }
            let replay = meter.take();
            // Latencies: fresh claims of new keys, replays of the key above.
            let mut fresh_times = Vec::with_capacity(timed);
            for i in 0..timed {
                let request = request(format!("{size}-fresh-{i}"))?;
                let started = Instant::now();
                claimed(&store, &request).await?;
                fresh_times.push(started.elapsed());
            }
            let mut replay_times = Vec::with_capacity(timed);
            for _ in 0..timed {
                let started = Instant::now();
                let answer = store.claim(&again).await?;
                replay_times.push(started.elapsed());
                if !matches!(answer, ClaimOutcome::Replay { .. }) {
                    return Err("a completed key did not replay".into());
                }
            }
            meter.take();
            let (replay_units, replay_unit_kind) = if read_first {
                (units(&replay), "read")
            } else {
                // Reported by none: billed as a write of the stored item, which the
                // completion wrote.
                (units(&complete).max(1.0), "write (billed, not reported)")
            };
            let row = CapacityRow {
                path,
                result_bytes: size,
                fresh_claim: describe(&fresh),
                fresh_claim_units: units(&fresh),
                complete_units: units(&complete),
                replay: describe(&replay),
                replay_units,
                replay_unit_kind,
                fresh_claim_p50_us: p50(fresh_times),
                replay_p50_us: p50(replay_times),
            };
            eprintln!(
                "  {path:<11} {size:>7} B: fresh claim {} ({:.0} µs), complete {}, replay {} ({:.0} µs)",
                row.fresh_claim,
                row.fresh_claim_p50_us,
                describe(&complete),
                row.replay,
                row.replay_p50_us
            );
            rows.push(row);
        }
    }
    let _ = client.delete_table().table_name(TABLE).send().await;
    Ok(rows)
}

/// Prints the capacity table (nothing when it was not run).
pub(crate) fn print(rows: &[CapacityRow]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\n| claim path | stored result | fresh claim: requests and units | fresh claim p50 (µs) | completion: write units | replay: requests | replay: units | replay p50 (µs) |"
    );
    println!("|---|---:|---|---:|---:|---|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} B | {} | {:.0} | {} | {} | {} {} | {:.0} |",
            row.path,
            row.result_bytes,
            row.fresh_claim,
            row.fresh_claim_p50_us,
            row.complete_units,
            row.replay,
            row.replay_units,
            row.replay_unit_kind,
            row.replay_p50_us
        );
    }
}
