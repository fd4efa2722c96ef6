//! `idem release` and `idem delete`: the two commands that change a record. Both show the
//! record and ask before changing it.

use std::io::{BufRead, IsTerminal, Write};

use idem_core::connect::Location;
use idem_core::raw::MAX_TOKEN;
use idem_core::{Key, State, Timestamp, admin::ReleaseKeyOutcome};

use super::Store;
use super::inspect::{details, not_found};
use crate::cli::ChangeArgs;
use crate::failure::Failure;

pub(super) async fn release(
    store: &Store,
    target: &dyn Location,
    key: &Key,
    args: &ChangeArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let Some(record) = store.get(key).await.map_err(Failure::store(target))? else {
        return Err(not_found(target, key));
    };
    let now = Timestamp::now();
    if record.state != State::InProgress {
        return Err(refused(record.state, record.token));
    }
    // Refused before asking: no release can pass the last token, whatever the answer.
    // The record is shown first: its steps tell whether deleting it is safe.
    if record.token >= MAX_TOKEN {
        write!(out, "{}", details(&record, None, now))?;
        out.flush()?;
        return Err(at_last_token(record.lease_is_live(now)));
    }
    let owner = if record.lease_is_live(now) {
        "Its lease is live: the owner may still be working; it will be fenced (its writes refused)."
    } else {
        "Its lease has ended: if its owner is still working, it will be fenced (its writes refused)."
    };
    write!(out, "{}", details(&record, None, now))?;
    out.flush()?;
    confirm(
        &format!("{owner} The next retry with this key will run the work. Release it?"),
        args.yes,
    )?;
    match store.release_key(key).await.map_err(Failure::store(target))? {
        ReleaseKeyOutcome::Released { token } => {
            let resume = match record.steps.len() {
                0 => "runs the work from the start (no checkpoints)".to_owned(),
                _ => format!(
                    "skips the checkpointed steps ({})",
                    record.steps.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            };
            writeln!(
                out,
                "released: token {} -> {token}. The attempt that held it is fenced; the next retry with this key takes it over at once and {resume}.",
                record.token
            )?;
            Ok(())
        }
        ReleaseKeyOutcome::Finished(state) => Err(refused(state, record.token)),
        ReleaseKeyOutcome::NotFound => Err(not_found(target, key)),
        _ => Err(Failure::Refused {
            what: "the store answered in a way this version of idem does not know; nothing was assumed".into(),
        }),
    }
}

pub(super) async fn delete(
    store: &Store,
    target: &dyn Location,
    key: &Key,
    args: &ChangeArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let record = store.get(key).await.map_err(Failure::store(target))?;
    let now = Timestamp::now();
    let Some(record) = record else {
        // Nothing a claim can see; an expired record may still sit there awaiting purge,
        // and deleting it changes nothing anyone observes.
        return if store.delete(key).await.map_err(Failure::store(target))? {
            writeln!(out, "deleted an expired record that was awaiting purge")?;
            Ok(())
        } else {
            Err(not_found(target, key))
        };
    };
    let consequence = match record.state {
        State::Completed => {
            "It is COMPLETED: retries now get its stored result. After deletion the next request with this key runs the work AGAIN (a second charge, if the first one happened)."
        }
        State::Failed => {
            "It FAILED: retries now get the stored failure. After deletion the next request with this key runs the work again."
        }
        _ if record.token >= MAX_TOKEN => {
            "It is IN PROGRESS at the last fencing token, which no release can pass: its owner, if still working, will be fenced, and the next request with this key runs the work again from the start, at token 1 (checkpoints are deleted too)."
        }
        _ if record.lease_is_live(now) => {
            "It is IN PROGRESS with a live lease: its owner will be fenced, and the next request with this key runs the work again from the start (checkpoints are deleted too). `idem release` keeps the checkpoints."
        }
        _ => {
            "It is IN PROGRESS, lease ended: the next request with this key runs the work again from the start (checkpoints are deleted too). `idem release` keeps the checkpoints."
        }
    };
    write!(
        out,
        "{}",
        details(&record, record.response.as_ref().map(Vec::len), now)
    )?;
    out.flush()?;
    confirm(&format!("Delete it? {consequence}"), args.yes)?;
    if store.delete(key).await.map_err(Failure::store(target))? {
        writeln!(
            out,
            "deleted: the record ({}, token {}) is gone; the next request with this key starts afresh.",
            record.state.as_str(),
            record.token
        )?;
        Ok(())
    } else {
        Err(not_found(target, key))
    }
}

fn refused(state: State, token: u64) -> Failure {
    Failure::Refused {
        what: format!(
            "refused: the record is {} (token {token}), so there is nothing to release, and nothing changed. Retries get its stored {}. Only if you know its effect did not happen, `idem delete` it so that the next request runs the work again.",
            state.as_str(),
            if state == State::Failed {
                "failure"
            } else {
                "result"
            }
        ),
    }
}

/// The refusal of a release at the last token: no next token could fence the owner.
fn at_last_token(lease_is_live: bool) -> Failure {
    let now = match lease_is_live {
        true => "Its lease is live: retries are told it is in flight.",
        false => {
            "Its lease has ended: retries are refused as corrupt until its retention ends, when the next request starts it again at token 1."
        }
    };
    Failure::Refused {
        what: format!(
            "refused: the record's token is the last one ({MAX_TOKEN}), past which no release can fence its owner, so nothing changed. {now} Its owner, if still running, can still complete it. Once no worker runs it, `idem delete` it: the next request starts it again at token 1, running the work from the start (its checkpoints go with it). If its steps show the effect happened, do not delete it: reconcile with the provider (RUNBOOK.md, stuck records)."
        ),
    }
}

/// Asks on the terminal, unless `yes`. Without a terminal and without `yes`, refuses.
fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::NotConfirmed {
            what: "not confirmed: there is no terminal to ask on; pass --yes to go ahead without asking. Nothing changed.".into(),
        });
    }
    let mut stderr = std::io::stderr();
    write!(stderr, "{question} [y/N] ")?;
    stderr.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::NotConfirmed {
            what: "not confirmed. Nothing changed.".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_points_to_delete() {
        let text = refused(State::Completed, 3).to_string();
        assert!(text.contains("completed (token 3)"), "{text}");
        assert!(text.contains("idem delete"), "{text}");
        assert!(
            refused(State::Failed, 1)
                .to_string()
                .contains("stored failure")
        );
    }

    #[test]
    fn yes_skips_the_question() {
        assert!(confirm("Delete?", true).is_ok());
    }
}
