//! One record on every backend: `idem inspect`, `idem release`, `idem delete`.

use idem_core::{
    Fingerprint, Key, key::StepName, store::ClaimOutcome, store::ClaimRequest, store::WriteOutcome,
};

use crate::support::{Backend, LONG};

pub(crate) fn inspect_shows_one_record(backend: Backend) {
    backend.seed();
    let shown = backend.ok(&["inspect", "acct_1/charge", "secret-a"]).stdout;
    assert!(
        shown.contains("secret-a"),
        "the typed key is shown: {shown}"
    );
    assert!(shown.contains("completed"), "{shown}");
    assert!(shown.contains("response     10 B"), "{shown}");
    assert!(!shown.contains("paid"), "no body unless asked: {shown}");
    let body = backend
        .ok(&["inspect", "acct_1/charge", "secret-a", "--show-response"])
        .stdout;
    assert!(body.contains("{\"paid\":1}"), "{body}");
    let lease = backend.claim("acct_5/charge", "secret-s", LONG, LONG);
    let step = StepName::new("charge").unwrap();
    let written = backend.block(backend.store.checkpoint(&lease, &step, b"ch_3PzL"));
    assert_eq!(written.unwrap(), WriteOutcome::Applied);
    let steps = backend.ok(&["inspect", "acct_5/charge", "secret-s"]).stdout;
    assert!(
        steps.contains("charge (7 B)") && !steps.contains("ch_3PzL"),
        "{steps}"
    );
    let steps = backend
        .ok(&["inspect", "acct_5/charge", "secret-s", "--show-steps"])
        .stdout;
    assert!(steps.contains("step value   charge: ch_3PzL"), "{steps}");
    let json = backend
        .ok(&[
            "inspect",
            "acct_3/charge",
            "secret-live",
            "--json",
            "--derive",
            "charge",
        ])
        .json();
    let record = backend.get("acct_3/charge", "secret-live").unwrap();
    assert_eq!(
        json["derived_keys"]["charge"],
        record.derive("charge"),
        "{json}"
    );
    let text = backend
        .ok(&[
            "inspect",
            "acct_3/charge",
            "secret-live",
            "--derive",
            "charge",
        ])
        .stdout;
    assert!(text.contains(&record.derive("charge")), "{text}");
    assert_eq!(json["state"], "in_progress");
    assert_eq!(json["lease_live"], true);
    assert_eq!(json["token"], 1);

    let missing = backend.idem(&["inspect", "acct_1/charge", "never-claimed"]);
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(missing.stderr.contains("no record"), "{missing:?}");
    assert!(!missing.stderr.contains("in quotes"), "{missing:?}");
    // Copied from the Idempotency-Key header, quotes and all.
    let quoted = backend.idem(&["inspect", "acct_1/charge", "\"secret-a\""]);
    assert_eq!(quoted.code, 3, "{quoted:?}");
    assert!(quoted.stderr.contains("try `secret-a`"), "{quoted:?}");

    // An idem-http record reads as the response its client got.
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let stored = idem_http::StoredResponse::new(
        http::StatusCode::CREATED,
        headers,
        bytes::Bytes::from_static(b"{\"id\":7}"),
    );
    let lease = backend.claim("acct_6/POST /payments", "k-http", LONG, LONG);
    let done = backend.block(backend.store.complete(&lease, &stored.encode()));
    assert_eq!(done.unwrap(), WriteOutcome::Applied);
    let shown = backend
        .ok(&[
            "inspect",
            "acct_6/POST /payments",
            "k-http",
            "--show-response",
        ])
        .stdout;
    assert!(shown.contains("response:    HTTP 201 Created"), "{shown}");
    assert!(
        shown.contains("  content-type: application/json"),
        "{shown}"
    );
    assert!(shown.contains("{\"id\":7}"), "{shown}");
    let json = backend
        .ok(&[
            "inspect",
            "acct_6/POST /payments",
            "k-http",
            "--show-response",
            "--json",
        ])
        .json();
    assert_eq!(json["http_response"]["status"], 201, "{json}");
    assert_eq!(json["http_response"]["body"], "{\"id\":7}", "{json}");
    assert_eq!(json["http_response"]["body_encoding"], "utf-8", "{json}");
    assert_eq!(
        json["http_response"]["headers"][0][0], "content-type",
        "{json}"
    );
    let bad = backend.idem(&["inspect", "acct_1/charge", ""]);
    assert_eq!(bad.code, 2, "{bad:?}");
}

pub(crate) fn release_fences_the_owner(backend: Backend) {
    let owner = backend.claim("acct_1/charge", "secret-r", LONG, LONG);
    let step = StepName::new("charge").unwrap();
    let written = backend.block(backend.store.checkpoint(&owner, &step, b"ch_1"));
    assert_eq!(written.unwrap(), WriteOutcome::Applied);

    // No terminal and no --yes: nothing changes.
    let unconfirmed = backend.idem(&["release", "acct_1/charge", "secret-r"]);
    assert_eq!(unconfirmed.code, 5, "{unconfirmed:?}");
    assert_eq!(backend.get("acct_1/charge", "secret-r").unwrap().token, 1);

    let released = backend.ok(&["release", "acct_1/charge", "secret-r", "--yes"]);
    assert!(
        released.stdout.contains("released: token 1 -> 2"),
        "{released:?}"
    );
    assert!(
        released.stdout.contains("charge"),
        "names the steps: {released:?}"
    );
    // The old owner is fenced; the next claim takes over at once, with the checkpoint.
    let late = backend.block(backend.store.complete(&owner, b"late"));
    assert_eq!(late.unwrap(), WriteOutcome::Fenced);
    let request = ClaimRequest::new(
        Key::new("acct_1/charge", "secret-r").unwrap(),
        Fingerprint::of_bytes("secret-r"),
        LONG,
        LONG,
    );
    match backend.block(backend.store.claim(&request)).unwrap() {
        ClaimOutcome::Claimed { lease, steps, .. } => {
            assert_eq!(lease.token, 3);
            assert_eq!(steps.get("charge").map(Vec::as_slice), Some(&b"ch_1"[..]));
        }
        other => panic!("{other:?}"),
    }

    backend.completed("acct_1/charge", "secret-done", LONG, "{}");
    let refused = backend.idem(&["release", "acct_1/charge", "secret-done", "--yes"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(refused.stderr.contains("idem delete"), "{refused:?}");
    let record = backend.get("acct_1/charge", "secret-done").unwrap();
    assert_eq!((record.state.as_str(), record.token), ("completed", 1));

    let missing = backend.idem(&["release", "acct_1/charge", "never-claimed", "--yes"]);
    assert_eq!(missing.code, 3, "{missing:?}");
}

pub(crate) fn delete_removes_one_record(backend: Backend) {
    backend.completed("acct_1/charge", "secret-d", LONG, "{}");
    let unconfirmed = backend.idem(&["delete", "acct_1/charge", "secret-d"]);
    assert_eq!(unconfirmed.code, 5, "{unconfirmed:?}");
    assert!(backend.get("acct_1/charge", "secret-d").is_some());

    let deleted = backend.ok(&["delete", "acct_1/charge", "secret-d", "--yes"]);
    assert!(
        deleted
            .stdout
            .contains("deleted: the record (completed, token 1)"),
        "{deleted:?}"
    );
    assert!(backend.get("acct_1/charge", "secret-d").is_none());
    // The next request runs the work again: a new lifetime.
    let lease = backend.claim("acct_1/charge", "secret-d", LONG, LONG);
    assert_eq!(lease.token, 1);

    let missing = backend.idem(&["delete", "acct_1/charge", "secret-d-never", "--yes"]);
    assert_eq!(missing.code, 3, "{missing:?}");
}
