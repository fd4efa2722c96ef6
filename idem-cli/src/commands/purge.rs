//! `idem purge`: deletes expired records in batches until none is left.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use idem_core::connect::Location;
use idem_core::store::Expiry;
use indicatif::{ProgressBar, ProgressStyle};

use super::Store;
use crate::cli::PurgeArgs;
use crate::failure::Failure;

pub(super) async fn run(
    store: &Store,
    target: &dyn Location,
    args: &PurgeArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    if store.expiry() == Expiry::Vanishes {
        writeln!(
            out,
            "nothing to purge: {target} deletes expired records itself (each key expires at the end of its retention or its lease, whichever is later)"
        )?;
        return Ok(());
    }
    let batch = usize::try_from(args.batch).unwrap_or(usize::MAX);
    let most = args.max.unwrap_or(u64::MAX);
    let bar = progress(store, target).await?;
    let started = Instant::now();
    let mut purged: u64 = 0;
    while purged < most {
        let limit = batch.min(usize::try_from(most - purged).unwrap_or(usize::MAX));
        let deleted = match store.purge_expired(limit).await {
            Ok(deleted) => deleted,
            Err(err) => {
                bar.abandon();
                // What was deleted stays deleted: say how far it got.
                eprintln!("idem: purged {purged} expired records before the store failed");
                return Err(Failure::store(target)(err));
            }
        };
        purged += deleted as u64;
        bar.inc(deleted as u64);
        if deleted == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    let took = started.elapsed();
    let rate = if took > Duration::from_millis(1) {
        format!(", {:.0} per second", purged as f64 / took.as_secs_f64())
    } else {
        String::new()
    };
    writeln!(
        out,
        "purged {purged} expired records from {target} in {:.1} s{rate}",
        took.as_secs_f64()
    )?;
    Ok(())
}

/// A progress bar on a terminal (sized by the store's own count of expired records), and
/// nothing otherwise: scripts and logs get the final count only.
async fn progress(store: &Store, target: &dyn Location) -> Result<ProgressBar, Failure> {
    if !std::io::stderr().is_terminal() {
        return Ok(ProgressBar::hidden());
    }
    let expected = store.stats(0).await.map_err(Failure::store(target))?.absent;
    let bar = ProgressBar::new(expected);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} expired records purged, {per_sec}, {eta} left",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    Ok(bar)
}
