//! The namespaces the suite hands store factories.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A namespace name chosen by the suite for one store: a table, a key prefix, a
/// directory, whatever the store isolates its records by.
///
/// - Fresh for every case (and every generated sequence), unique within the test process
///   and, with a tag drawn per process, across processes that reuse a process id: a store
///   on a shared server must see nothing outside it.
/// - Only lower-case ASCII letters, digits and `_`, starting with a letter, at most 24
///   bytes: valid as a PostgreSQL table name, a Redis or DynamoDB key prefix, a file name.
/// - Use it verbatim (as the whole prefix or table name): the namespace case hands two
///   stores names that are prefixes of each other (`t12_3_` and `t12_3_1`) and checks
///   that their records, replays and purges never cross, which only reaches your
///   encoding if the name does.
///
/// ```
/// use idem_core::MemoryStore;
/// use idem_testkit::Namespace;
///
/// // A store with nothing to isolate ignores it.
/// let factory = |_namespace: Namespace| async { MemoryStore::new() };
/// # let _ = factory;
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Namespace(String);

/// Five letters drawn once per process from the clock: a test process that gets the
/// process id of an earlier one (a runner starts thousands, and ids wrap) must not meet
/// the records that one left on a shared server, which live as long as their retention.
fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let mut left = nanos ^ (nanos >> 29);
        (0..5)
            .map(|_| {
                let letter = (b'a' + (left % 26) as u8) as char;
                left /= 26;
                letter
            })
            .collect()
    })
}

impl Namespace {
    /// A name no other namespace of this process has had. Fresh names end with `_`, so
    /// none is ever the prefix-colliding twin (the name with `1` appended) of another.
    pub fn fresh() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Self(format!(
            "t{}{}_{}_",
            std::process::id(),
            process_tag(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ))
    }

    /// This name with `1` appended: it has this one as a prefix.
    pub(crate) fn extended(&self) -> Self {
        Self(format!("{}1", self.0))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Namespace {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<Namespace> for String {
    fn from(namespace: Namespace) -> Self {
        namespace.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_names_are_valid_everywhere_and_never_each_others_twin() {
        let names: Vec<_> = (0..200).map(|_| Namespace::fresh()).collect();
        for name in &names {
            let text = name.as_str();
            assert!(text.len() <= 24, "{text}");
            assert!(text.starts_with(|c: char| c.is_ascii_lowercase()));
            assert!(
                text.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            );
            let twin = name.extended();
            assert!(twin.as_str().starts_with(text));
            assert!(names.iter().all(|other| *other != twin));
        }
    }
}
