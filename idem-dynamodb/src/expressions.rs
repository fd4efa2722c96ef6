//! The condition and update expressions, kept together so they can be read as the
//! state machine's rules.

use std::collections::HashMap;

use crate::item::NAMES;

/// Claim of a key with no record or an absent one (expired, and no lease live within the
/// skew margin): a fresh record. `ADD` continues the token of an absent record still
/// stored, or starts it at 1.
pub(crate) const FRESH_CONDITION: &str = "attribute_not_exists(#pk) \
     OR (#ea <= :now AND NOT (#st = :in_progress AND #lu > :cutoff))";
pub(crate) const FRESH_UPDATE: &str = "SET #fp = :fp, #st = :in_progress, #at = :at, #lu = :lu, \
     #ca = :now, #ea = :ea, #ttl = :ttl, #stp = :no_steps, #rz = :false \
     ADD #tk :one REMOVE #rs";

/// Takeover of an expired lease, as a compare-and-set on the token that was read.
pub(crate) const TAKEOVER_CONDITION: &str = "#tk = :seen_token AND #at = :seen_attempt \
     AND #st = :in_progress AND #fp = :fp AND #lu <= :cutoff AND #ea > :now";
pub(crate) const TAKEOVER_UPDATE: &str =
    "SET #tk = :token, #at = :at, #lu = :lu, #ttl = :ttl, #rz = :true";

/// Every write after a claim: the owner's token and attempt, in progress, present
/// (unexpired, or held by a lease live within the skew margin).
pub(crate) const FENCE: &str = "#tk = :token AND #at = :at AND #st = :in_progress \
     AND (#ea > :now OR #lu > :cutoff)";
/// complete and fail, beside the fence: the creation time the write assumes.
pub(crate) const FINISH_CREATED: &str = "#ca = :ca";
/// complete and fail: a result stored late is kept one retention after now, so the expiry
/// moves to `max(expires_at, now + (expires_at - created_at))`, which is
/// `expires_at + :late` with `:late = max(0, now - created_at)` (exact for the item, whose
/// creation time the condition checks). The TTL moves by `:late_s`, the same in seconds
/// rounded up, so it still covers the expiry.
pub(crate) const FINISH_UPDATE: &str = "SET #st = :terminal, #rs = :response, \
     #ea = #ea + :late, #ttl = #ttl + :late_s";
/// A release, beside the fence, when the record holds no step: nothing took effect, so
/// the record's lifetime ends too and the next claim is fresh under any fingerprint. The
/// lease ends at the cutoff, not now: its owner let go, so no claim waits out the skew
/// margin for it, and the record is absent at once.
pub(crate) const RELEASE_WITHOUT_STEPS: &str = "(attribute_not_exists(#stp) OR size(#stp) = :zero)";
pub(crate) const RELEASE_FORGET_UPDATE: &str = "SET #lu = :cutoff, #ea = :now";
/// A release of a record with steps, beside the fence: kept for a takeover, its expiry
/// as it was.
pub(crate) const RELEASE_UPDATE: &str = "SET #lu = :now";
/// The same for a record past its expiry already (a live lease held it), kept one
/// retention more, beside the fence and `RELEASE_EXPIRY_SEEN` (the expiry the new one was
/// computed from, so that a retry whose first try landed does not move it twice).
pub(crate) const RELEASE_EXTEND_UPDATE: &str = "SET #lu = :now, #ea = :ea, #ttl = :ttl";
pub(crate) const RELEASE_EXPIRY_SEEN: &str = "#ea = :seen_ea";
/// A renewal whose new lease end the item's TTL already covers: the common case, one
/// conditional write.
pub(crate) const RENEW_UPDATE: &str = "SET #lu = :lu";
pub(crate) const RENEW_COVERED: &str = "#ttl >= :ttl";
/// A renewal that must move the TTL too: both in the same conditional write.
pub(crate) const RENEW_AND_TTL_UPDATE: &str = "SET #lu = :lu, #ttl = :ttl";
pub(crate) const CHECKPOINT_UPDATE: &str = "SET #stp.#step = :value";

// The text of PURGEABLE, for the expressions built on it.
macro_rules! purgeable {
    () => {
        "begins_with(#pk, :prefix) AND #ea <= :now AND NOT (#st = :in_progress AND #lu > :cutoff)"
    };
}
/// Absent records (expired, no lease live within the skew margin) of this store's
/// namespace: `:prefix` is its `namespace_prefix`, which begins the partition key of its
/// records and of no other namespace's.
pub(crate) const PURGEABLE: &str = purgeable!();

/// A purge's delete: still absent, and not claimed again since the scan saw `:token`.
pub(crate) const PURGEABLE_UNCHANGED: &str = concat!("#tk = :token AND ", purgeable!());

/// The attribute names the expressions use: DynamoDB refuses unused ones.
pub(crate) fn names(expressions: &[&str]) -> HashMap<String, String> {
    let used = |placeholder: &str| {
        expressions.iter().any(|expression| {
            expression
                .split(|c: char| !(c == '#' || c.is_ascii_alphanumeric() || c == '_'))
                .any(|token| token == placeholder)
        })
    };
    NAMES
        .iter()
        .filter(|(placeholder, _)| used(placeholder))
        .map(|(placeholder, name)| ((*placeholder).to_owned(), (*name).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_used_names_are_sent() {
        let names = names(&[FENCE, RELEASE_FORGET_UPDATE]);
        let mut keys: Vec<_> = names.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["#at", "#ea", "#lu", "#st", "#tk"]);
        assert!(super::names(&[RENEW_COVERED]).contains_key("#ttl"));
        assert!(!super::names(&[CHECKPOINT_UPDATE]).contains_key("#st"));
        assert!(super::names(&[CHECKPOINT_UPDATE]).contains_key("#stp"));
    }
}
