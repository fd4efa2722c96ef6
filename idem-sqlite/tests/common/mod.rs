//! Fresh database files for tests, under Cargo's per-target temporary directory.

use std::path::PathBuf;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// This test process's directory; directories of earlier runs are removed when it is made.
static DIR: LazyLock<PathBuf> = LazyLock::new(|| {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("idem-sqlite-tests");
    let mine = root.join(std::process::id().to_string());
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            if entry.path() != mine {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    std::fs::create_dir_all(&mine).expect("a temporary directory for test databases");
    mine
});

/// A path no other test uses.
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) fn fresh_db_path() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    DIR.join(format!("{}.db", NEXT.fetch_add(1, Ordering::SeqCst)))
}
