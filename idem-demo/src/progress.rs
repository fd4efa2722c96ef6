//! A one-line progress bar on stderr, drawn only when stderr is a terminal.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct Progress {
    label: &'static str,
    total: usize,
    done: AtomicUsize,
    draw: bool,
}

impl Progress {
    pub(crate) fn new(label: &'static str, total: usize) -> Self {
        let draw = std::io::stderr().is_terminal() && total >= 200;
        Self {
            label,
            total,
            done: AtomicUsize::new(0),
            draw,
        }
    }

    pub(crate) fn tick(&self) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let step = (self.total / 100).max(1);
        if self.draw && (done % step == 0 || done == self.total) {
            let width = 30;
            let filled = done * width / self.total.max(1);
            let _ = write!(
                std::io::stderr(),
                "\r  {:<12} [{}{}] {done}/{}",
                self.label,
                "#".repeat(filled),
                ".".repeat(width - filled),
                self.total
            );
        }
    }

    pub(crate) fn finish(&self) {
        if self.draw {
            let _ = writeln!(std::io::stderr());
        }
    }
}
