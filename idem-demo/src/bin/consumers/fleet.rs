//! The parent's side of its child processes: a fleet of the same command (the workers
//! of one queue, the schedulers of one mode), each read for its reports, killed with
//! SIGKILL and respawned, and stopped.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::report::{Report, Settle};

/// What a fleet's processes reported, summed over every process it ever ran.
#[derive(Default, Debug)]
pub(crate) struct Tally {
    /// Deliveries the broker marked as sent before.
    pub(crate) redeliveries: AtomicU64,
    /// Of those, deliveries acked as a replay of idem's stored result.
    pub(crate) replayed: AtomicU64,
    /// Of those, deliveries that applied their order (and were acked).
    pub(crate) applied: AtomicU64,
    /// Of those, deliveries put back for later (another worker held the order).
    pub(crate) retried: AtomicU64,
    /// Keys taken over from a killed process, once its lease ended.
    pub(crate) takeovers: AtomicU64,
    /// When a delivery was last put back: RabbitMQ holds it unacked while the nak's delay
    /// runs, so the queue looks empty until then.
    last_retry: Mutex<Option<Instant>>,
    /// What went wrong, as the processes said it (the first few).
    errors: Mutex<Vec<String>>,
}

impl Tally {
    fn count(&self, report: Report, member: &Member) {
        let add = |counter: &AtomicU64| counter.fetch_add(1, Ordering::Relaxed);
        match report {
            Report::Delivered { redelivered } => {
                member.busy.fetch_add(1, Ordering::SeqCst);
                if redelivered {
                    add(&self.redeliveries);
                }
            }
            Report::Settled {
                settle,
                redelivered,
            } => {
                member.busy.fetch_sub(1, Ordering::SeqCst);
                if settle == Settle::Retried {
                    *self
                        .last_retry
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                }
                match settle {
                    _ if !redelivered => {}
                    Settle::Replayed => {
                        add(&self.replayed);
                    }
                    Settle::Applied => {
                        add(&self.applied);
                    }
                    Settle::Retried => {
                        add(&self.retried);
                    }
                    Settle::DeadLettered | Settle::Unsettled => {}
                }
            }
            Report::TakenOver => {
                add(&self.takeovers);
            }
            Report::SlotStarted(_) => {
                member.busy.fetch_add(1, Ordering::SeqCst);
            }
            Report::SlotDone(_) => {
                member.busy.fetch_sub(1, Ordering::SeqCst);
            }
            Report::Failed(what) => self.error(what),
        }
    }

    /// Keeps an error to show at the end.
    pub(crate) fn error(&self, what: String) {
        let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        if errors.len() < 5 {
            errors.push(what);
        }
    }

    /// The errors kept.
    pub(crate) fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How long ago a delivery was last put back, if one ever was.
    pub(crate) fn since_last_retry(&self) -> Option<Duration> {
        self.last_retry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|at| at.elapsed())
    }
}

/// What the parent knows of one running process.
#[derive(Default, Debug)]
struct Member {
    /// Deliveries it got and has not settled, or a slot it started and has not committed.
    busy: AtomicI64,
}

/// One running process of a fleet.
struct Process {
    child: Child,
    /// Closing it tells the process to stop.
    stdin: Option<ChildStdin>,
    member: Arc<Member>,
}

/// Processes running the same command, replaced when killed.
pub(crate) struct Fleet {
    label: String,
    args: Vec<OsString>,
    processes: Vec<Process>,
    /// What they reported.
    pub(crate) tally: Arc<Tally>,
    /// SIGKILLs sent.
    pub(crate) kills: u64,
    /// SIGKILLs that hit a process mid-message or mid-slot.
    pub(crate) landed: u64,
}

impl Fleet {
    /// Starts `size` processes of this program with `args`.
    pub(crate) fn spawn(
        label: impl Into<String>,
        args: Vec<OsString>,
        size: usize,
    ) -> std::io::Result<Self> {
        let mut fleet = Self {
            label: label.into(),
            args,
            processes: Vec::with_capacity(size),
            tally: Arc::default(),
            kills: 0,
            landed: 0,
        };
        for _ in 0..size {
            let process = fleet.start()?;
            fleet.processes.push(process);
        }
        Ok(fleet)
    }

    /// The fleet's name, for messages.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    fn start(&self) -> std::io::Result<Process> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|err| {
                std::io::Error::new(err.kind(), format!("cannot start {}: {err}", self.label))
            })?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("a child without its stdout pipe"))?;
        let member = Arc::new(Member::default());
        let (reader, tally) = (Arc::clone(&member), Arc::clone(&self.tally));
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(report) = Report::parse(&line) {
                    tally.count(report, &reader);
                }
            }
        });
        Ok(Process {
            stdin: child.stdin.take(),
            child,
            member,
        })
    }

    /// Replaces the processes that exited on their own (a worker whose broker stream
    /// failed), keeping a note of it.
    pub(crate) fn respawn_exited(&mut self) -> std::io::Result<()> {
        for i in 0..self.processes.len() {
            if let Some(status) = self.processes[i].child.try_wait()? {
                self.tally.error(format!(
                    "{}: a process exited on its own ({status})",
                    self.label
                ));
                self.processes[i] = self.start()?;
            }
        }
        Ok(())
    }

    /// The processes holding unsettled messages or a slot in progress.
    pub(crate) fn busy(&self) -> Vec<usize> {
        (0..self.processes.len())
            .filter(|&i| self.processes[i].member.busy.load(Ordering::SeqCst) > 0)
            .collect()
    }

    /// True when no process holds an unsettled message.
    pub(crate) fn idle(&self) -> bool {
        self.busy().is_empty()
    }

    /// SIGKILLs process `i` (std's `Child::kill` is SIGKILL on Unix) and starts another
    /// in its place.
    pub(crate) fn kill(&mut self, i: usize) -> std::io::Result<()> {
        let landed = self.processes[i].member.busy.load(Ordering::SeqCst) > 0;
        let process = &mut self.processes[i];
        process.child.kill()?;
        process.child.wait()?;
        self.kills += 1;
        self.landed += u64::from(landed);
        self.processes[i] = self.start()?;
        Ok(())
    }

    /// Kills every process (those of a drained queue hold nothing).
    pub(crate) fn kill_all(&mut self) {
        for process in &mut self.processes {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
    }

    /// Asks every process to stop (their stdin closes) and waits up to `within`; kills
    /// the ones still running then. True when all stopped cleanly on their own.
    pub(crate) fn stop(&mut self, within: Duration) -> std::io::Result<bool> {
        for process in &mut self.processes {
            process.stdin = None;
        }
        let deadline = Instant::now() + within;
        let mut clean = true;
        for process in &mut self.processes {
            loop {
                if let Some(status) = process.child.try_wait()? {
                    clean &= status.success();
                    break;
                }
                if Instant::now() >= deadline {
                    clean = false;
                    process.child.kill()?;
                    process.child.wait()?;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(clean)
    }
}

impl Drop for Fleet {
    /// No process outlives the demo, whatever path it ends by.
    fn drop(&mut self) {
        self.kill_all();
    }
}
