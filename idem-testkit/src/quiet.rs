//! Keeping a failing case's panic out of the test output when `run_all` reports it
//! instead.
//!
//! The panic hook is process-wide, so it cannot simply be swapped while a suite runs
//! (other tests run beside it). Instead a hook installed once stays silent for panics on a
//! thread that is polling a [`Quiet`] future, and defers to the previous hook otherwise.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

fn install_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// A future whose panics are not printed (they still unwind to whoever awaits it).
pub(crate) struct Quiet<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Quiet<F> {
    pub(crate) fn new(inner: F) -> Self {
        install_hook();
        Self {
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                QUIET.with(|quiet| quiet.set(self.0));
            }
        }
        // Restored on the way out, by a panic too.
        let _restore = Restore(QUIET.with(|quiet| quiet.replace(true)));
        self.inner.as_mut().poll(cx)
    }
}

/// Whether the code running now is quiet (a case inside `run_all`).
pub(crate) fn is_quiet() -> bool {
    QUIET.with(Cell::get)
}

/// `future`, quiet when `quiet` is set.
pub(crate) async fn maybe<F: Future>(quiet: bool, future: F) -> F::Output {
    if quiet {
        Quiet::new(future).await
    } else {
        future.await
    }
}

/// `tokio::spawn`, quiet when the spawning code runs quiet: the cases' own tasks stay out
/// of the output too.
pub(crate) fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    if QUIET.with(Cell::get) {
        tokio::spawn(Quiet::new(future))
    } else {
        tokio::spawn(future)
    }
}
