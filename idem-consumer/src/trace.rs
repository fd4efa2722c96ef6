//! The span a delivery is handled in, carrying the W3C trace context its publisher sent.

use crate::Message;

/// The header of the W3C trace context (`traceparent`).
pub const TRACEPARENT: &str = "traceparent";

/// A valid W3C `traceparent`: `<version>-<trace id>-<parent id>-<flags>`, lowercase hex,
/// neither id all zeros, version `ff` refused. Its trace id and parent id.
pub(crate) fn traceparent(value: &str) -> Option<(&str, &str)> {
    let mut parts = value.trim().split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; later versions may add more.
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let zero = |part: &str| part.bytes().all(|b| b == b'0');
    (hex(version, 2)
        && version != "ff"
        && hex(trace_id, 32)
        && !zero(trace_id)
        && hex(parent_id, 16)
        && !zero(parent_id)
        && hex(flags, 2))
    .then_some((trace_id, parent_id))
}

/// The span a delivery is handled in: its source and delivery count, and the trace id
/// and parent span id of the `traceparent` header it carried, if valid, so that a
/// subscriber (tracing-opentelemetry, say) links the work to the publisher's trace.
pub(crate) fn delivery_span<M: Message + ?Sized>(message: &M) -> tracing::Span {
    let span = tracing::info_span!(
        "idem_consumer.handle",
        source = message.source(),
        delivery = message.delivery_count(),
        trace_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
    );
    if let Some((trace_id, parent_id)) = message.header(TRACEPARENT).and_then(traceparent) {
        span.record("trace_id", trace_id);
        span.record("parent_span_id", parent_id);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::traceparent;

    #[test]
    fn a_valid_traceparent_gives_its_ids() {
        let value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            traceparent(value),
            Some(("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
        );
        // A later version may carry more parts.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(traceparent(later).is_some());
    }

    #[test]
    fn an_invalid_traceparent_is_ignored() {
        for value in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(traceparent(value), None, "{value}");
        }
    }
}
