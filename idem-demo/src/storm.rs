//! The retry storm: what each order's client does, drawn from a seeded generator so the
//! protected and the unprotected shop face exactly the same traffic.

/// How one order's client behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// One request, answered.
    Single,
    /// The client times out before the answer and sends again while the first still runs.
    TimeoutResend,
    /// Two requests at once.
    DoubleClick,
    /// Several concurrent duplicates (a retrying gateway, a redelivering broker).
    Burst(usize),
    /// The worker handling the first request dies mid-payment; the client retries.
    CrashThenRetry,
    /// A resend under the same key with a changed amount (a client bug).
    ChangedAmount,
}

/// One order and its client's behaviour.
#[derive(Clone, Debug)]
pub(crate) struct Order {
    pub(crate) id: String,
    pub(crate) cents: u64,
    pub(crate) pattern: Pattern,
}

/// SplitMix64: tiny, seedable, good enough to shuffle a demo.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `orders` orders with their patterns, the same for the same seed.
pub(crate) fn script(orders: usize, seed: u64) -> Vec<Order> {
    let mut random = Random(seed);
    (0..orders)
        .map(|n| {
            let pattern = match random.below(100) {
                0..40 => Pattern::Single,
                40..60 => Pattern::TimeoutResend,
                60..75 => Pattern::DoubleClick,
                75..85 => Pattern::Burst(3 + random.below(4) as usize),
                85..95 => Pattern::CrashThenRetry,
                _ => Pattern::ChangedAmount,
            };
            Order {
                id: format!("order-{n:05}"),
                cents: 500 + 100 * random.below(50),
                pattern,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_storm() {
        let a = script(200, 7);
        let b = script(200, 7);
        assert!(
            a.iter()
                .zip(&b)
                .all(|(x, y)| x.pattern == y.pattern && x.cents == y.cents)
        );
        assert!(
            script(200, 8)
                .iter()
                .zip(&a)
                .any(|(x, y)| x.pattern != y.pattern)
        );
        // Every pattern shows up in a storm of this size.
        for wanted in [
            Pattern::Single,
            Pattern::TimeoutResend,
            Pattern::DoubleClick,
            Pattern::CrashThenRetry,
            Pattern::ChangedAmount,
        ] {
            assert!(a.iter().any(|o| o.pattern == wanted), "{wanted:?}");
        }
        assert!(a.iter().any(|o| matches!(o.pattern, Pattern::Burst(_))));
    }
}
