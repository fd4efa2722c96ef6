//! The search's own parts: the restarts and their orders of moves, and the nodes it
//! skips. The histories come from the memory store on a manual clock.

use std::time::Duration;

use idem_core::record::AttemptId;
use idem_core::store::{ClaimOutcome, ClaimRequest};
use idem_core::{Fingerprint, Key, ManualClock, MemoryStore, Store, Timestamp};

use super::*;

const MS: u64 = 1_000_000;

fn limits(budget: u64, first_round: u64) -> Limits {
    Limits {
        budget,
        lost_grace: LOST_GRACE,
        ordered_moments: true,
        first_round,
    }
}

/// A claim whose answer was lost takes effect 40 ms after its client gave up, with an
/// hour's lease; three claims of other attempts after it are told `InFlight` with the
/// time left (shifted by `skew` milliseconds, which no moment explains when it is
/// large and the moments follow the order, as they do here). Only an order that places
/// the lost claim explains them.
async fn late_claim(skew: u64) -> Vec<Operation> {
    let start = Timestamp::from_unix_millis(1_800_000_000_000);
    let t0 = start.as_unix_millis() * MS;
    let clock = ManualClock::starting_at(start);
    let store = MemoryStore::with_clock(clock.clone());
    let key = Key::new("search", "k").unwrap();
    let request = |attempt: u8| {
        ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("A"),
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        )
        .with_attempt(AttemptId::from_bytes([attempt; 16]))
    };
    let lost = request(1);
    let mut operations = vec![Operation::new(
        0,
        Call::Claim(lost.clone()),
        Answer::Lost("cut".into()),
        t0,
        t0 + MS,
    )];
    clock.advance(Duration::from_millis(40));
    store.claim(&lost).await.unwrap();
    for n in 0..3u8 {
        let at = 40 + 100 * (u64::from(n) + 1);
        clock.set(Timestamp::from_unix_millis(start.as_unix_millis() + at));
        let request = request(2 + n);
        let mut outcome = store.claim(&request).await.unwrap();
        let ClaimOutcome::InFlight { retry_after, .. } = &mut outcome else {
            panic!("{outcome:?}")
        };
        *retry_after += Duration::from_millis(skew);
        operations.push(Operation::new(
            1 + usize::from(n),
            Call::Claim(request),
            Answer::Claim(outcome),
            t0 + at * MS,
            t0 + at * MS + MS / 2,
        ));
    }
    operations
}

#[tokio::test]
async fn every_order_of_moves_finds_the_explanation_that_places_a_lost_call() {
    let operations = late_claim(0).await;
    for order in [MoveOrder::Answered, MoveOrder::LatestLost, MoveOrder::Lost] {
        let found = explore(&operations, &[None], limits(10_000, 10_000), false, order);
        assert!(!found.too_long, "{order:?}");
        assert_eq!(found.ends.len(), 1, "{order:?}: explained");
    }
}

/// A first round of one state forces a restart in every round until the last, which
/// gets what is left of the budget: the history is still decided either way, and the
/// states of every round are counted.
#[tokio::test]
async fn restarts_still_decide_and_count_every_round() {
    let explained = late_claim(0).await;
    let Search::Explained { states: at_once } =
        search(&explained, &[None], limits(100_000, 100_000))
    else {
        panic!("explained in one round")
    };
    let Search::Explained { states: restarted } = search(&explained, &[None], limits(100_000, 1))
    else {
        panic!("explained after restarts")
    };
    // Rounds of one state, then four, ran out before one explained it (21 states
    // before the 5 of a whole search, when this was written): every round's states
    // count.
    assert!(restarted >= at_once + 9, "{restarted} against {at_once}");

    let unexplained = late_claim(500).await;
    for first_round in [1, 100_000] {
        assert!(
            matches!(
                search(&unexplained, &[None], limits(100_000, first_round)),
                Search::Unexplained
            ),
            "first round {first_round}"
        );
    }
    // A budget too small for the search leaves it undecided, not unexplained.
    assert!(matches!(
        search(&explained, &[None], limits(2, 1)),
        Search::TooLong { .. }
    ));
}

#[test]
fn a_node_is_skipped_when_an_earlier_one_placed_fewer_of_its_lost_calls() {
    // Calls 1 and 2 are lost; call 0 was answered.
    let mut visited = Visited::new(&[1, 2], 1, true);
    assert!(visited.insert(&[0b111], 7, 0), "first seen");
    assert!(
        visited.insert(&[0b001], 7, 0),
        "fewer lost calls: not subsumed"
    );
    assert!(!visited.insert(&[0b011], 7, 0), "subsumed by 0b001");
    assert!(!visited.insert(&[0b001], 7, 0), "met again");
    assert!(visited.insert(&[0b011], 8, 0), "another state");
    assert!(visited.insert(&[0b011], 7, 5), "another moment");
    assert!(visited.insert(&[0b010], 7, 0), "other answered calls");

    // Where moments follow the order, only a node met again is skipped.
    let mut exact = Visited::new(&[1, 2], 1, false);
    assert!(exact.insert(&[0b001], 7, 0));
    assert!(exact.insert(&[0b011], 7, 0));
    assert!(!exact.insert(&[0b011], 7, 0));
}
