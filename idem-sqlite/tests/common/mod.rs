//! Fresh database files for tests, under Cargo's per-target temporary directory.

use std::path::PathBuf;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// This test process's directory. Directories of earlier runs are removed when it is made,
/// once they are an hour old: test processes run side by side
/// (cargo-nextest runs each test in a process of its own), so a younger directory may be
/// another process's, in use.
static DIR: LazyLock<PathBuf> = LazyLock::new(|| {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("idem-sqlite-tests");
    // The process id alone is reused within the hour by a busy run, whose new process
    // would read a dead one's files as fresh: the start time tells them apart.
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mine = root.join(format!("{}-{started}", std::process::id()));
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
    std::fs::create_dir_all(&mine).expect("a temporary directory for test databases");
    mine
});

/// A path no other test uses.
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) fn fresh_db_path() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    DIR.join(format!("{}.db", NEXT.fetch_add(1, Ordering::SeqCst)))
}
