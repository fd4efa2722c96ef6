//! Races: many claimants, one winner; a stale owner's write against a takeover.

use std::sync::Arc;

use idem_core::{State, Store, store::ClaimOutcome, store::ClaimRequest, store::WriteOutcome};
use tokio::sync::Barrier;

use crate::quiet;
use crate::support::{HOUR, ZERO, claimed, get_some, key, ok, request};

/// Fresh keys raced, one after another.
const RACE_KEYS: usize = 200;
/// Takeovers raced, one key after another.
const TAKEOVER_KEYS: usize = 50;
/// Claimants per key, released together.
const RACERS: usize = 32;
/// Keys whose stale owner races a takeover, all released together.
const FENCED_RACES: usize = 32;
/// Rounds of those races, one after another: more chances to meet each interleaving.
const FENCED_ROUNDS: usize = 4;

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

/// The stale owner's result and the new owner's, told apart in the stored record.
const STALE: &[u8] = b"stale owner";
const NEW: &[u8] = b"new owner";

pub(crate) async fn stale_completes_race_takeovers(store: Arc<dyn Store>) {
    for round in 0..FENCED_ROUNDS {
        // Each stale owner's lease is over at once, its record is not: its complete is
        // Applied if it lands before a takeover, Fenced after one.
        let mut stale = Vec::with_capacity(FENCED_RACES);
        for i in 0..FENCED_RACES {
            let k = key("fenced-race", &format!("{round}-{i}"));
            let (lease, _, _) = claimed(store.as_ref(), &request(&k, "a", ZERO, HOUR)).await;
            stale.push(lease);
        }
        let barrier = Arc::new(Barrier::new(2 * FENCED_RACES));
        let races: Vec<_> = stale
            .iter()
            .map(|lease| {
                let stale_write = {
                    let (store, barrier, lease) =
                        (Arc::clone(&store), Arc::clone(&barrier), lease.clone());
                    quiet::spawn(async move {
                        barrier.wait().await;
                        store.complete(&lease, STALE).await
                    })
                };
                let (store, barrier, k) =
                    (Arc::clone(&store), Arc::clone(&barrier), lease.key.clone());
                let takeover = quiet::spawn(async move {
                    barrier.wait().await;
                    let outcome = store.claim(&request(&k, "a", HOUR, HOUR)).await?;
                    let written = match &outcome {
                        ClaimOutcome::Claimed { lease, .. } => {
                            Some(store.complete(lease, NEW).await?)
                        }
                        _ => None,
                    };
                    Ok::<_, idem_core::StoreError>((outcome, written))
                });
                (stale_write, takeover)
            })
            .collect();
        for (lease, (stale_write, takeover)) in stale.iter().zip(races) {
            let what = format!("round {round}, key {}", lease.key.key());
            let stale_answer = ok(
                stale_write.await.expect("a stale complete task panicked"),
                "the stale owner's complete",
            );
            let (claim, new_answer) = ok(
                takeover.await.expect("a takeover task panicked"),
                "the takeover",
            );
            let record = get_some(store.as_ref(), &lease.key).await;
            let (winner_bytes, winner_token) = match (stale_answer, &claim) {
                // The stale write landed first: the takeover found a result and replayed it.
                (WriteOutcome::Applied, ClaimOutcome::Replay { response, .. }) => {
                    assert!(
                        response == STALE,
                        "{what}: the stale complete was Applied, yet the claim after it \
                         replayed other bytes"
                    );
                    (STALE, lease.token)
                }
                (
                    WriteOutcome::Applied,
                    ClaimOutcome::Claimed {
                        lease: taken,
                        resumed,
                        ..
                    },
                ) => panic!(
                    "{what}: the stale owner's complete was Applied and a takeover also \
                     claimed the key (token {}, resumed {resumed}), whose own complete was \
                     {new_answer:?}: both owners were told they won; the record holds {:?} \
                     with token {}",
                    taken.token,
                    record.response.as_deref().map(String::from_utf8_lossy),
                    record.token
                ),
                // The takeover came first: the stale owner is fenced, the new one stores.
                (
                    WriteOutcome::Fenced,
                    ClaimOutcome::Claimed {
                        lease: taken,
                        resumed,
                        ..
                    },
                ) => {
                    assert!(
                        *resumed && taken.token == lease.token + 1,
                        "{what}: the takeover must resume with the next token, got token {} \
                         (resumed {resumed}) after {}",
                        taken.token,
                        lease.token
                    );
                    assert_eq!(
                        new_answer,
                        Some(WriteOutcome::Applied),
                        "{what}: the new owner's complete after fencing the stale one"
                    );
                    (NEW, taken.token)
                }
                (stale_answer, claim) => panic!(
                    "{what}: the stale complete answered {stale_answer:?} and the takeover \
                     claim {claim:?}: the one must be Applied before the other replays it, or \
                     Fenced after the other took over"
                ),
            };
            assert_eq!(
                record.state,
                State::Completed,
                "{what}: the record is finished"
            );
            assert!(
                record.response.as_deref() == Some(winner_bytes),
                "{what}: the record holds {:?}, not the result of the owner whose write was \
                 Applied ({:?})",
                record.response.as_deref().map(String::from_utf8_lossy),
                String::from_utf8_lossy(winner_bytes)
            );
            assert_eq!(
                record.token, winner_token,
                "{what}: the record carries the token of the owner whose result it holds"
            );
        }
    }
}
