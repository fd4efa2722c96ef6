//! The span a delivery is handled in carries the publisher's W3C trace context.

use std::sync::{Arc, Mutex};

use idem_consumer::{Consumer, TRACEPARENT};
use idem_core::{Idempotency, MemoryStore, done};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

mod common;
use common::TestMessage;

/// Every field recorded on an `idem_consumer.handle` span, by name.
#[derive(Clone, Default)]
struct Fields(Arc<Mutex<Vec<(String, String)>>>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .lock()
            .unwrap()
            .push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .lock()
            .unwrap()
            .push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Fields {
    fn on_new_span(&self, attributes: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        if attributes.metadata().name() == "idem_consumer.handle" {
            attributes.record(&mut self.clone());
        }
    }
    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        values.record(&mut self.clone());
    }
}

#[tokio::test]
async fn the_work_s_span_records_the_trace_id_and_parent_of_a_valid_traceparent() {
    let fields = Fields::default();
    let subscriber = tracing_subscriber::registry().with(fields.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let message = TestMessage::new("m-1", "x").header(
        TRACEPARENT,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let settled = consumer
        .handle(&message, |_ctx, _payload| async { done(1u8) })
        .await
        .unwrap();
    assert!(settled.is_acked());
    let recorded = fields.0.lock().unwrap().clone();
    let field = |name: &str| {
        recorded
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.clone())
    };
    assert_eq!(field("source").as_deref(), Some("orders"));
    assert_eq!(
        field("trace_id").as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    assert_eq!(field("parent_span_id").as_deref(), Some("00f067aa0ba902b7"));

    // An invalid one records nothing.
    fields.0.lock().unwrap().clear();
    let message = TestMessage::new("m-2", "x").header(TRACEPARENT, "00-not-a-trace-01");
    consumer
        .handle(&message, |_ctx, _payload| async { done(1u8) })
        .await
        .unwrap();
    let recorded = fields.0.lock().unwrap().clone();
    assert!(
        recorded.iter().any(|(field, _)| field == "source"),
        "{recorded:?}"
    );
    assert!(
        !recorded.iter().any(|(field, _)| field == "trace_id"),
        "{recorded:?}"
    );
}
