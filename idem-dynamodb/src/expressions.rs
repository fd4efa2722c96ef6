//! The condition and update expressions, kept together so they can be read as the
//! state machine's rules.

use std::collections::HashMap;

use crate::item::NAMES;

/// Claim of a key with no record or an absent one (expired, and no lease live within the
/// skew margin): a fresh record. `ADD` continues the token of an absent record still
/// stored, or starts it at 1. An absent record at the last token (`:max_token`) fails the
/// condition: the claim deletes it first, and the fresh record starts at 1.
pub(crate) const FRESH_CONDITION: &str = "attribute_not_exists(#pk) \
     OR (#ea <= :now AND NOT (#st = :in_progress AND #lu > :cutoff) AND #tk < :max_token)";
pub(crate) const FRESH_UPDATE: &str = "SET #fp = :fp, #st = :in_progress, #at = :at, #lu = :lu, \
     #ca = :now, #ea = :ea, #ttl = :ttl, #stp = :no_steps, #rz = :false \
     ADD #tk :one REMOVE #rs";

/// Takeover of an expired lease, as a compare-and-set on the token and expiry that were
/// read. The new expiry, `max(expires_at, lease_until + retention)`, is computed from the
/// expiry read.
pub(crate) const TAKEOVER_CONDITION: &str = "#tk = :seen_token AND #at = :seen_attempt \
     AND #st = :in_progress AND #fp = :fp AND #lu <= :cutoff AND #ea > :now \
     AND #ea = :seen_ea";
pub(crate) const TAKEOVER_UPDATE: &str =
    "SET #tk = :token, #at = :at, #lu = :lu, #ea = :ea, #ttl = :ttl, #rz = :true";

/// Every write after a claim: the owner's token and attempt, in progress, present
/// (unexpired, or held by a lease live within the skew margin).
pub(crate) const FENCE: &str = "#tk = :token AND #at = :at AND #st = :in_progress \
     AND (#ea > :now OR #lu > :cutoff)";
/// complete and fail: a result is kept at least one retention (the lease's) after now, so
/// the expiry becomes `max(expires_at, :ea)` with `:ea = now + retention`. DynamoDB has no
/// `max`, so there are two writes, each beside the fence and the condition that makes it
/// the right one: the expiry already covers `:ea` (the common case: the result is stored
/// within the lease, which the record outlives by a retention), or it moves to `:ea`.
pub(crate) const EXPIRY_COVERS: &str = "#ea >= :ea";
pub(crate) const EXPIRY_SHORT: &str = "#ea < :ea";
pub(crate) const FINISH_UPDATE: &str = "SET #st = :terminal, #rs = :response";
pub(crate) const FINISH_AND_EXPIRY_UPDATE: &str =
    "SET #st = :terminal, #rs = :response, #ea = :ea, #ttl = :ttl";
/// A release, beside the fence, when the record holds no step: nothing took effect, so
/// the record's lifetime ends too and the next claim is fresh under any fingerprint. A
/// live lease (beside `LEASE_LIVE`) ends at the cutoff, not now: its owner let go, so no
/// claim waits out the skew margin for it, and the record is absent at once. A lease that
/// ran out (beside `LEASE_ENDED`) keeps its end, `min(lease_until, cutoff)`: moved to the
/// release, it would be live again to a client whose clock is behind the releaser's.
pub(crate) const RELEASE_WITHOUT_STEPS: &str = "(attribute_not_exists(#stp) OR size(#stp) = :zero)";
pub(crate) const RELEASE_FORGET_UPDATE: &str = "SET #lu = :cutoff, #ea = :now";
pub(crate) const RELEASE_FORGET_ENDED_UPDATE: &str = "SET #ea = :now";
pub(crate) const LEASE_ENDED: &str = "#lu <= :cutoff";
/// A release of a record with steps, beside the fence and `LEASE_NOT_ENDED`: kept for a
/// takeover, its expiry as it was (its checkpoints kept it one retention past the lease).
/// A lease that ran out already keeps its end, and the release writes nothing.
pub(crate) const RELEASE_UPDATE: &str = "SET #lu = :now";
pub(crate) const LEASE_NOT_ENDED: &str = "#lu > :now";
/// A renewal, beside the fence: only of a lease live within the skew margin, and keeping
/// the record one retention past the new end, `max(expires_at, :ea)` with
/// `:ea = lease_until + retention`, as two writes like the finish's: the expiry and the
/// TTL move (beside `EXPIRY_SHORT`), or the expiry read covers it and the TTL is set from
/// it and the new end (beside `#ea = :ea`, the expiry read).
pub(crate) const LEASE_LIVE: &str = "#lu > :cutoff";
pub(crate) const RENEW_AND_EXPIRY_UPDATE: &str = "SET #lu = :lu, #ea = :ea, #ttl = :ttl";
pub(crate) const RENEW_AND_TTL_UPDATE: &str = "SET #lu = :lu, #ttl = :ttl";
/// Beside a checkpoint's fence: the item's lease ends where the write computed the expiry
/// from (`:lu`), so the expiry kept is the one the item's own lease end asks for.
pub(crate) const LEASE_END_IS: &str = "#lu = :lu";
/// A checkpoint, beside the fence: keeping the record one retention past its lease's end,
/// `max(expires_at, :ea)` with `:ea = lease_until + retention`, as two writes like the
/// finish's.
pub(crate) const CHECKPOINT_UPDATE: &str = "SET #stp.#step = :value";
pub(crate) const CHECKPOINT_AND_EXPIRY_UPDATE: &str =
    "SET #stp.#step = :value, #ea = :ea, #ttl = :ttl";

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
        assert!(super::names(&[RENEW_AND_TTL_UPDATE]).contains_key("#ttl"));
        assert!(!super::names(&[CHECKPOINT_UPDATE]).contains_key("#st"));
        assert!(super::names(&[CHECKPOINT_UPDATE]).contains_key("#stp"));
    }
}
