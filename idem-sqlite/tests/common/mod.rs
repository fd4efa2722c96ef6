//! Fresh database files for tests, under Cargo's per-target temporary directory.

use std::path::PathBuf;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// This test process's directory, emptied when it is made. Directories of earlier runs are
/// removed then too, once they are an hour old: test processes run side by side
/// (cargo-nextest runs each test in a process of its own), so a younger directory may be
/// another process's, in use.
static DIR: LazyLock<PathBuf> = LazyLock::new(|| {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("idem-sqlite-tests");
    let mine = root.join(std::process::id().to_string());
    let stale = |entry: &std::fs::DirEntry| {
        entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600))
    };
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            if entry.path() != mine && stale(&entry) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    // A directory already under this process's id is a dead process's (ids are reused,
    // and a busy run reuses them within the hour): its files would be read as fresh.
    let _ = std::fs::remove_dir_all(&mine);
    std::fs::create_dir_all(&mine).expect("a temporary directory for test databases");
    mine
});

/// A path no other test uses.
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) fn fresh_db_path() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    DIR.join(format!("{}.db", NEXT.fetch_add(1, Ordering::SeqCst)))
}
