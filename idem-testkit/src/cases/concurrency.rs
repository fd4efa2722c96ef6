//! Races: many claimants, one winner.

use std::sync::Arc;

use idem_core::{ClaimOutcome, ClaimRequest, Store};
use tokio::sync::Barrier;

use crate::quiet;
use crate::support::{HOUR, ZERO, claimed, key, request};

/// Fresh keys raced, one after another.
const RACE_KEYS: usize = 200;
/// Takeovers raced, one key after another.
const TAKEOVER_KEYS: usize = 50;
/// Claimants per key, released together.
const RACERS: usize = 32;

/// Runs `requests` as concurrent claims released together, and answers their outcomes.
async fn race(store: &Arc<dyn Store>, requests: Vec<ClaimRequest>) -> Vec<ClaimOutcome> {
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|req| {
            let (store, barrier) = (Arc::clone(store), Arc::clone(&barrier));
            quiet::spawn(async move {
                barrier.wait().await;
                store.claim(&req).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        let outcome = task.await.expect("a claim task panicked");
        outcomes
            .push(outcome.unwrap_or_else(|err| panic!("claim failed with a store error: {err}")));
    }
    outcomes
}

fn count_claimed(outcomes: &[ClaimOutcome]) -> (usize, usize) {
    let claimed = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::Claimed { .. }))
        .count();
    let in_flight = outcomes
        .iter()
        .filter(|o| matches!(o, ClaimOutcome::InFlight { .. }))
        .count();
    (claimed, in_flight)
}

pub(crate) async fn concurrent_claims_have_one_winner(store: Arc<dyn Store>) {
    for i in 0..RACE_KEYS {
        let k = key("race", &format!("fresh-{i}"));
        let requests = (0..RACERS).map(|_| request(&k, "a", HOUR, HOUR)).collect();
        let outcomes = race(&store, requests).await;
        let (claimed, in_flight) = count_claimed(&outcomes);
        assert_eq!(
            claimed, 1,
            "key {i}: {claimed} of {} concurrent claims won",
            RACERS
        );
        assert_eq!(
            in_flight,
            RACERS - 1,
            "key {i}: the others must be in flight, got {outcomes:?}"
        );
    }
}

pub(crate) async fn concurrent_takeovers_have_one_winner(store: Arc<dyn Store>) {
    for i in 0..TAKEOVER_KEYS {
        let k = key("race", &format!("takeover-{i}"));
        let (first, _, _) = claimed(store.as_ref(), &request(&k, "a", ZERO, HOUR)).await;
        let requests = (0..RACERS).map(|_| request(&k, "a", HOUR, HOUR)).collect();
        let outcomes = race(&store, requests).await;
        let (claimed, in_flight) = count_claimed(&outcomes);
        assert_eq!(
            claimed, 1,
            "key {i}: {claimed} of {} concurrent takeovers won",
            RACERS
        );
        assert_eq!(
            in_flight,
            RACERS - 1,
            "key {i}: the others must be in flight"
        );
        let winner = outcomes.iter().find_map(|o| match o {
            ClaimOutcome::Claimed { lease, resumed, .. } => Some((lease.token, *resumed)),
            _ => None,
        });
        assert_eq!(
            winner,
            Some((first.token + 1, true)),
            "key {i}: the winner takes over with the next token"
        );
    }
}
