//! One run: the first callers (with the run's faults), retries as new processes until a
//! result, a last retry that must replay it, then the checks on the ledger.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use idem_core::driver::Unstorable;
use idem_core::record::ValuePart;
use idem_core::{Error, Fingerprint, Key, Outcome, Store, WorkError, driver::InterruptedKind};
use tokio::sync::mpsc;
use tokio::task::JoinError;
use tokio::time::Instant;

use super::check::{self, Verdict};
use super::faults::{Fault, FaultPoint, Kill, PlacedFault, Process, ProcessStore, World};
use super::ledger::{Answer, End, Event};
use super::scenarios::{Expect, Probe, Scenario};
use super::target::ProcessFactory;
use super::{Timing, VirtualClock};
use idem_core::{Clock, SystemClock};

/// The most retries after the first callers, before a run counts as never finishing.
pub(crate) const MAX_RETRIES: u32 = 12;

/// What one run found.
pub(crate) struct RunOutcome {
    /// Every fault point reached, in order (the check process's left out).
    pub(crate) trace: Vec<FaultPoint>,
    pub(crate) verdict: Verdict,
    /// How each process's `execute` ended, for reading a violation.
    pub(crate) story: String,
}

pub(crate) async fn run(
    store: Arc<dyn Store>,
    processes: Option<ProcessFactory>,
    scenario: Scenario,
    plan: Vec<PlacedFault>,
    timing: Timing,
    key: Key,
    clock: Option<VirtualClock>,
) -> RunOutcome {
    // The run's clock: the virtual one the store reads, or the system's for a server
    // (whose clock runs on this machine too).
    let paused = clock.is_some();
    let processes = processes.zip(clock.clone());
    let clock: Arc<dyn Clock> = match clock {
        Some(clock) => Arc::new(clock),
        None => Arc::new(SystemClock),
    };
    let hangs_late = plan.iter().any(|f| f.fault == Fault::HangThenApply);
    // The tasks alive before the run (none on a virtual-time runner's own runtime).
    let baseline = alive_tasks();
    let timing = timing.striking(scenario, &plan);
    let world = World::new(store, processes, plan.clone(), timing, paused, clock);
    let caller = Caller {
        world: Arc::clone(&world),
        scenario,
        key,
        fingerprint: Fingerprint::of_bytes(scenario.name()),
    };
    let first = tokio::spawn(caller.clone().execute(Process::First));
    let duplicate = scenario.has_duplicate().then(|| {
        let caller = caller.clone();
        tokio::spawn(async move {
            // Just after the first, so that the first claims and the duplicate waits.
            tokio::time::sleep(Duration::from_millis(1)).await;
            caller.execute(Process::Duplicate).await
        })
    });
    // The client that retries beside a process cut off (paused, partitioned) while that
    // process still lives: it waits for a cut to ask for it.
    let racer = {
        let (caller, world) = (caller.clone(), Arc::clone(&world));
        tokio::spawn(async move {
            let at = world.racer_wanted().await;
            tokio::time::sleep_until(at).await;
            caller.execute(Process::Racer).await
        })
    };
    let _ = first.await;
    if let Some(duplicate) = duplicate {
        let _ = duplicate.await;
    }
    let mut racer = Some(racer);
    if world.racer_asked()
        && let Some(racer) = racer.take()
    {
        let _ = racer.await;
    }
    let mut retries = 0;
    while world.ledger.first_result().is_none() && retries < MAX_RETRIES {
        retries += 1;
        let end = caller.clone().execute(Process::Retry(retries)).await;
        if let End::Returned {
            answer:
                Answer::Error {
                    retry_after: Some(after),
                    ..
                },
            ..
        } = end
        {
            tokio::time::sleep(after + Duration::from_millis(5)).await;
        }
    }
    // A cut in a retry asks for the racer too: it runs beside that retry.
    if let Some(racer) = racer {
        if world.racer_asked() {
            let _ = racer.await;
        } else {
            racer.abort();
            let _ = racer.await;
        }
    }
    let left = if paused {
        drain(&world, baseline).await
    } else {
        0
    };
    // Copies that found no moment of their own (no later grant, a write still running when
    // its process ended) land now: the network delivers them late, not never.
    world.land_copies(|_| true).await;
    if world.ledger.first_result().is_some() {
        if hangs_late {
            // Let a hung write land before the check, as it would in time.
            tokio::time::sleep(timing.hang + timing.store_timeout).await;
        }
        caller.clone().execute(Process::Check).await;
        if scenario.expect() == Expect::Marked {
            stored_compensation(&world, &caller.key).await;
        }
        // What the check itself left behind (what was left before is reported already).
        if paused {
            drain(&world, baseline + left).await;
        }
    }
    world.end();
    let events = world.ledger.snapshot();
    let verdict = check::check(scenario, &timing, &events, retries, &plan);
    RunOutcome {
        trace: events
            .iter()
            .filter_map(|event| match event {
                Event::Reached(point) if point.process != Process::Check => Some(point.clone()),
                _ => None,
            })
            .collect(),
        verdict,
        story: story(&events, &plan),
    }
}

/// Reads the compensation stored beside a failure marker from the record itself, into
/// the ledger: the marker's answer (an `idem_core::Error`) does not carry it. Nothing is
/// recorded when the record holds no such failure (the check finds the compensation
/// missing then).
async fn stored_compensation(world: &World, key: &Key) {
    let Ok(Some(record)) = world.inner.get(key).await else {
        return;
    };
    let compensation = record
        .response
        .as_deref()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(bytes).ok())
        .and_then(|mut failure| failure.get_mut("compensation").map(serde_json::Value::take))
        .and_then(|compensation| serde_json::from_value(compensation).ok());
    if let Some(compensation) = compensation {
        world.ledger.push(Event::StoredCompensation(compensation));
    }
}

/// How each process ended, and which planned faults never struck (their point was not
/// reached in this run).
fn story(events: &[Event], plan: &[PlacedFault]) -> String {
    let mut story = events
        .iter()
        .filter_map(|event| match event {
            Event::Ended { process, end } => Some(format!("{process}: {end}")),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("; ");
    for planned in plan {
        let struck = events
            .iter()
            .any(|event| matches!(event, Event::Faulted(f) if f.point.same_place(&planned.point)));
        if !struck {
            story.push_str(&format!(" [not reached: {}]", planned.point));
        }
    }
    story
}

/// What every process of a run calls with.
#[derive(Clone)]
struct Caller {
    world: Arc<World>,
    scenario: Scenario,
    key: Key,
    fingerprint: Fingerprint,
}

impl Caller {
    /// Runs one process's `execute` in a task of its own, and drops it when a fault says
    /// so: records and answers how it ended.
    async fn execute(self, process: Process) -> End {
        let world = Arc::clone(&self.world);
        let (supervisor, mut requests) = mpsc::unbounded_channel();
        world.supervise(process, Some(supervisor));
        let (end, recorded) = self.supervise(process, &mut requests).await;
        // Later requests (from a task of this process that outlived it) are answered at
        // once: the execution is already over.
        world.supervise(process, None);
        drop(requests);
        if !recorded {
            world.ledger.push(Event::Ended {
                process,
                end: end.clone(),
            });
        }
        // The copies of its calls the network delivers late land now.
        world
            .land_copies(|copy| !copy.after_grant && copy.from == process)
            .await;
        end
    }

    /// The end, and whether it is already in the ledger.
    async fn supervise(
        self,
        process: Process,
        requests: &mut mpsc::UnboundedReceiver<super::faults::KillRequest>,
    ) -> (End, bool) {
        let world = Arc::clone(&self.world);
        let timing = world.timing;
        let store = ProcessStore {
            process,
            world: Arc::clone(&world),
        };
        let idem = match self.scenario.driver(&timing, store) {
            Ok(idem) => idem,
            Err(err) => return (End::Setup(err.to_string()), false),
        };
        let probe = Probe {
            process,
            world: Arc::clone(&world),
            store: Arc::new(ProcessStore {
                process,
                world: Arc::clone(&world),
            }),
        };
        let work = self.scenario.work(probe);
        let (key, fingerprint) = (self.key, self.fingerprint);
        let raw = self.scenario.raw();
        let started = Instant::now();
        let mut task = tokio::spawn(async move {
            if raw {
                let work = move |ctx| async move { raw_result(work(ctx).await) };
                idem.execute_bytes(&key, fingerprint, work)
                    .await
                    .map(raw_answer)
            } else {
                idem.execute(&key, fingerprint, work).await.map(answer)
            }
        });
        let limit = watchdog(self.scenario, &timing);
        tokio::select! {
            biased;
            joined = &mut task => (ended(joined, started.elapsed()), false),
            Some(request) = requests.recv() => {
                task.abort();
                let end = match (&mut task).await {
                    // It answered before it could be dropped: the caller has that answer.
                    Ok(answer) => End::Returned { answer: answer.unwrap_or_else(error_answer), took: started.elapsed() },
                    Err(err) if err.is_panic() => ended(Err(err), started.elapsed()),
                    Err(_) => match request.kill {
                        Kill::Crash => End::Crashed,
                        Kill::Drop => End::Dropped { work_returned: world.ledger.work_returned(process) },
                    },
                };
                // Recorded before the faulting call goes on, so the ledger has it first.
                world.ledger.push(Event::Ended { process, end: end.clone() });
                let _ = request.done.send(());
                (end, true)
            }
            () = tokio::time::sleep(limit) => {
                task.abort();
                let _ = (&mut task).await;
                (End::DidNotReturn(limit), false)
            }
        }
    }
}

/// The tasks alive on this runtime.
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Lets every task the processes left behind finish before the check: a compensation or a
/// result's write the driver moved to a task of its own when its caller went away, a
/// call still hanging, a paused process's work. Their effects belong to the run. Only the
/// tasks of crashed processes, parked until the run ends, may stay; any other still alive
/// after far longer than any of them may take is recorded (`Event::Lingered`), and
/// answered: how many.
///
/// Only under paused time: a server's client keeps tasks of its own (connections, pools)
/// that come and go, so there the count says nothing.
async fn drain(world: &World, baseline: usize) -> usize {
    let timing = world.timing;
    let bound = timing.lease * 6 + timing.hang + timing.stall * 2 + timing.store_timeout * 8;
    let tick = (timing.lease / 8).max(Duration::from_millis(1));
    let lingering = || alive_tasks().saturating_sub(baseline + world.parked_tasks());
    let started = tokio::time::Instant::now();
    while lingering() > 0 {
        if started.elapsed() >= bound {
            let tasks = lingering();
            world.ledger.push(Event::Lingered {
                tasks,
                after: started.elapsed(),
            });
            return tasks;
        }
        tokio::time::sleep(tick).await;
    }
    0
}

/// How long an `execute` may go on before the explorer gives up on it: far past any
/// bound, so that only one that never returns meets it.
fn watchdog(scenario: Scenario, timing: &Timing) -> Duration {
    let write = timing.lease + timing.store_timeout + Duration::from_millis(500);
    scenario.wait(timing).unwrap_or_default()
        + timing.hang
        + timing.stall * 2
        + timing.lease * 4
        + write * 40
}

fn ended(joined: Result<Result<Answer, Error>, JoinError>, took: Duration) -> End {
    match joined {
        Ok(result) => End::Returned {
            answer: result.unwrap_or_else(error_answer),
            took,
        },
        Err(err) if err.is_panic() => {
            let panic = err.into_panic();
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned());
            End::Panicked(message)
        }
        Err(err) => End::Panicked(format!("the task ended without an answer: {err}")),
    }
}

fn answer(outcome: Outcome<String, String>) -> Answer {
    match outcome {
        Outcome::Completed { value, replayed } => Answer::Completed { value, replayed },
        Outcome::Failed { error, replayed } => Answer::Failed { error, replayed },
        Outcome::Compensated {
            error,
            compensation,
            replayed,
        } => Answer::Compensated {
            error,
            compensation,
            replayed,
        },
        Outcome::Retryable(error) => Answer::Retryable(error),
        Outcome::Unknown(error) => Answer::Unknown(error),
        other => Answer::Error {
            name: "outcome",
            text: format!("an outcome the explorer does not know: {other:?}"),
            retry_after: None,
            fine: false,
        },
    }
}

/// The leading bytes of every raw failure: not UTF-8, so that only a driver that keeps
/// every byte replays them.
const RAW_FAILURE: &[u8] = b"\xff\x00";

/// The work's result as raw bytes, its failure behind [`RAW_FAILURE`].
fn raw_result(result: Result<String, WorkError<String>>) -> Result<Vec<u8>, WorkError<Vec<u8>>> {
    let raw = |error: String| [RAW_FAILURE, error.as_bytes()].concat();
    match result {
        Ok(value) => Ok(value.into_bytes()),
        Err(WorkError::Permanent(error)) => Err(WorkError::Permanent(raw(error))),
        Err(WorkError::Retryable(error)) => Err(WorkError::Retryable(raw(error))),
        Err(WorkError::Unknown(error)) => Err(WorkError::Unknown(raw(error))),
        Err(WorkError::Interrupted(interrupted)) => Err(WorkError::Interrupted(interrupted)),
        Err(other) => Err(WorkError::Permanent(raw(format!("{other:?}")))),
    }
}

/// A raw outcome as an answer, its bytes escaped: a failure that lost a byte reads
/// differently from one that kept them all.
fn raw_answer(outcome: Outcome<Vec<u8>, Vec<u8>>) -> Answer {
    let text = |bytes: Vec<u8>| bytes.escape_ascii().to_string();
    match outcome {
        Outcome::Completed { value, replayed } => Answer::Completed {
            value: text(value),
            replayed,
        },
        Outcome::Failed { error, replayed } => Answer::Failed {
            error: text(error),
            replayed,
        },
        Outcome::Compensated {
            error,
            compensation,
            replayed,
        } => Answer::Compensated {
            error: text(error),
            compensation,
            replayed,
        },
        Outcome::Retryable(error) => Answer::Retryable(text(error)),
        Outcome::Unknown(error) => Answer::Unknown(text(error)),
        other => Answer::Error {
            name: "outcome",
            text: format!("an outcome the explorer does not know: {other:?}"),
            retry_after: None,
            fine: false,
        },
    }
}

/// An error as an answer: which one, and whether a correct driver may answer it under
/// faults (it promises nothing about the work's result, and a retry can do better).
fn error_answer(err: Error) -> Answer {
    // Stored failures: what every caller and every replay must agree on.
    let marked = match &err {
        Error::Unstorable {
            part: ValuePart::Step(step),
            reason: Unstorable::TooLarge { size, limit },
            replayed,
            ..
        } => Some((
            format!("step `{step}` is {size} bytes, over {limit}"),
            *replayed,
        )),
        Error::Unstorable {
            part: part @ (ValuePart::Result | ValuePart::Failure),
            reason: Unstorable::TooLarge { size, limit },
            replayed,
            ..
        } => Some((format!("{part} is {size} bytes, over {limit}"), *replayed)),
        Error::Unstorable {
            part: what,
            reason: Unstorable::Unserializable,
            replayed,
            ..
        } => Some((format!("{what} does not serialise"), *replayed)),
        _ => None,
    };
    if let Some((text, replayed)) = marked {
        return Answer::Marked { text, replayed };
    }
    let (name, fine, retry_after) = match &err {
        Error::InFlight { retry_after } => ("in flight", true, Some(*retry_after)),
        Error::LeaseLost => ("lease lost", true, None),
        Error::Store(_) => ("store", true, None),
        Error::CompensationPending { .. } => ("compensation pending", true, None),
        Error::Interrupted(interrupted) if interrupted.kind() == InterruptedKind::LeaseLost => {
            ("interrupted: lease lost", true, None)
        }
        Error::Interrupted(interrupted) => (
            "interrupted",
            matches!(
                interrupted.kind(),
                InterruptedKind::LeaseLost | InterruptedKind::Store | InterruptedKind::Compensating
            ),
            None,
        ),
        Error::Mismatch => ("mismatch", false, None),
        Error::Decode(_) => ("decode", false, None),
        Error::Codec { .. } => ("codec", false, None),
        _ => ("other", false, None),
    };
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    Answer::Error {
        name,
        text,
        retry_after,
        fine,
    }
}
