//! What a worker or a scheduler tells the parent: one line on its stdout per event.
//!
//! A line is one `write` to a pipe, so it reaches the parent even when the process is
//! SIGKILLed right after: the parent knows which processes hold unsettled messages (a
//! kill there lands mid-message) and counts redeliveries, replays and takeovers.

use std::io::Write;

use tokio::sync::watch;

/// How a delivery was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Acked after its effect was applied by this delivery.
    Applied,
    /// Acked as a replay of the result idem stored for an earlier delivery.
    Replayed,
    /// Put back for a later delivery (another worker holds the order, or a failure).
    Retried,
    /// Sent to the dead-letter path.
    DeadLettered,
    /// The broker did not take the settlement; it delivers the message again.
    Unsettled,
}

impl Settle {
    fn code(self) -> &'static str {
        match self {
            Settle::Applied => "applied",
            Settle::Replayed => "replayed",
            Settle::Retried => "retried",
            Settle::DeadLettered => "dead",
            Settle::Unsettled => "unsettled",
        }
    }

    fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "applied" => Settle::Applied,
            "replayed" => Settle::Replayed,
            "retried" => Settle::Retried,
            "dead" => Settle::DeadLettered,
            "unsettled" => Settle::Unsettled,
            _ => return None,
        })
    }
}

/// One event a child reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// A delivery reached the worker's code; `redelivered` when the broker sent it before.
    Delivered {
        /// The broker marked it as a redelivery.
        redelivered: bool,
    },
    /// A delivery the worker got was settled; `redelivered` as it was delivered.
    Settled {
        /// How.
        settle: Settle,
        /// The broker marked the delivery as a redelivery.
        redelivered: bool,
    },
    /// The work took over a key whose lease a killed process left to expire.
    TakenOver,
    /// A scheduler began a slot's work (the slot's time, in ms since the Unix epoch).
    SlotStarted(u64),
    /// A scheduler committed a slot's effect.
    SlotDone(u64),
    /// Something went wrong that the parent shows at the end.
    Failed(String),
}

impl Report {
    /// Writes the report as one line on stdout. A parent that is gone is no error: the
    /// child is about to be stopped anyway.
    pub(crate) fn send(&self) {
        let line = match self {
            Report::Delivered { redelivered } => format!("d {}\n", u8::from(*redelivered)),
            Report::Settled {
                settle,
                redelivered,
            } => format!("s {} {}\n", settle.code(), u8::from(*redelivered)),
            Report::TakenOver => "t\n".to_owned(),
            Report::SlotStarted(slot) => format!("r {slot}\n"),
            Report::SlotDone(slot) => format!("c {slot}\n"),
            // One line, whatever the error says.
            Report::Failed(what) => format!("e {}\n", what.replace('\n', " ")),
        };
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(line.as_bytes());
        let _ = stdout.flush();
    }

    /// Reads a line [`Report::send`] wrote.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        Some(match kind {
            "d" => Report::Delivered {
                redelivered: rest == "1",
            },
            "s" => {
                let (settle, redelivered) = rest.split_once(' ')?;
                Report::Settled {
                    settle: Settle::parse(settle)?,
                    redelivered: redelivered == "1",
                }
            }
            "t" => Report::TakenOver,
            "r" => Report::SlotStarted(rest.parse().ok()?),
            "c" => Report::SlotDone(rest.parse().ok()?),
            "e" => Report::Failed(rest.to_owned()),
            _ => return None,
        })
    }
}

/// Becomes true when the parent closes the child's stdin: time to stop (and a child
/// whose parent died stops too, instead of consuming on its own).
pub(crate) fn stop_signal() -> watch::Receiver<bool> {
    let (stop, stopped) = watch::channel(false);
    std::thread::spawn(move || {
        // Reads until end of file; whatever the parent writes is ignored.
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = stop.send(true);
    });
    stopped
}
