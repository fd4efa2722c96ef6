//! One module per subcommand; [`run`] dispatches.

mod change;
mod inspect;
mod list;
mod proxy;
mod purge;
mod stats;

use std::io::Write;

use idem_core::Key;

use crate::cli::{Cli, Command};
use crate::connect;
use crate::failure::Failure;
use crate::target;

/// Runs the command `cli` names, writing its answer to `out`.
pub(crate) async fn run(cli: Cli, out: &mut dyn Write) -> Result<(), Failure> {
    if let Command::Proxy(args) = &cli.command {
        return proxy::run(&cli.store, args, out).await;
    }
    let target = target::parse(
        cli.store.store.as_deref(),
        cli.store.table.as_deref(),
        cli.store.prefix.as_deref(),
    )?;
    let target = &*target;
    let open = || async { connect::open(target).await };
    // Keys are checked before connecting: a typo costs nothing.
    let keyed = |scope: &str, key: &str| Key::new(scope, key).map_err(Failure::from);
    match cli.command {
        Command::Migrate => {
            let said = connect::migrate(target).await?;
            writeln!(out, "{said}")?;
            Ok(())
        }
        Command::Stats(args) => stats::run(&*open().await?, target, &args, out).await,
        Command::List(args) => list::run(&*open().await?, target, &args, out).await,
        Command::Inspect(args) => {
            let key = keyed(&args.scope, &args.key)?;
            inspect::run(&*open().await?, target, &key, &args, out).await
        }
        Command::Release(args) => {
            let key = keyed(&args.scope, &args.key)?;
            change::release(&*open().await?, target, &key, &args, out).await
        }
        Command::Delete(args) => {
            let key = keyed(&args.scope, &args.key)?;
            change::delete(&*open().await?, target, &key, &args, out).await
        }
        Command::Purge(args) => purge::run(&*open().await?, target, &args, out).await,
        Command::Proxy(_) => unreachable!("dispatched above"),
    }
}

/// The store as the subcommands take it.
type Store = dyn idem_core::Admin;
