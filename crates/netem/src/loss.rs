//! Loss models with their state, driven by a seeded generator so a run can be
//! replayed packet for packet.

use crate::spec::LossSpec;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// A seeded random source; one per link direction so directions are independent.
pub(crate) struct Rng(Xoshiro256PlusPlus);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(Xoshiro256PlusPlus::seed_from_u64(seed))
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }
}

/// A loss model and its current state.
pub(crate) struct Loss {
    spec: LossSpec,
    /// Gilbert-Elliott: in the bad state. Burst: packets still to drop.
    bad: bool,
    burst_left: u32,
    /// Burst: probability that a packet outside a burst starts one.
    burst_start: f64,
}

impl Loss {
    pub(crate) fn new(spec: LossSpec) -> Self {
        let burst_start = match spec {
            // Each cycle is a geometric run of survivors (mean (1-q)/q) followed by
            // `len` losses; solving len / ((1-q)/q + len) = rate for q.
            LossSpec::Burst { rate, len } if rate > 0.0 => {
                let len = len as f64;
                1.0 / (len / rate - len + 1.0)
            }
            _ => 0.0,
        };
        Loss {
            spec,
            bad: false,
            burst_left: 0,
            burst_start,
        }
    }

    /// Decides the fate of the next packet: true = lost.
    pub(crate) fn lose(&mut self, rng: &mut Rng) -> bool {
        match self.spec {
            LossSpec::None => false,
            LossSpec::Bernoulli { p } => rng.chance(p),
            LossSpec::GilbertElliott { p, r, h, k } => {
                // Transition first, then draw the packet's fate in the new state.
                self.bad = if self.bad {
                    !rng.chance(r)
                } else {
                    rng.chance(p)
                };
                let survive = if self.bad { h } else { k };
                !rng.chance(survive)
            }
            LossSpec::Burst { len, .. } => {
                if self.burst_left > 0 {
                    self.burst_left -= 1;
                    true
                } else if rng.chance(self.burst_start) {
                    self.burst_left = len - 1;
                    true
                } else {
                    false
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a model over n packets; returns (loss fraction, mean burst length).
    fn measure(spec: LossSpec, n: usize, seed: u64) -> (f64, f64) {
        let mut rng = Rng::new(seed);
        let mut loss = Loss::new(spec);
        let (mut lost, mut bursts, mut run) = (0usize, 0usize, 0usize);
        for _ in 0..n {
            if loss.lose(&mut rng) {
                lost += 1;
                run += 1;
            } else if run > 0 {
                bursts += 1;
                run = 0;
            }
        }
        if run > 0 {
            bursts += 1;
        }
        (lost as f64 / n as f64, lost as f64 / bursts.max(1) as f64)
    }

    #[test]
    fn bernoulli_within_three_sigma() {
        let n = 1_000_000;
        let p = 1e-2;
        let (rate, _) = measure(LossSpec::Bernoulli { p }, n, 7);
        let sigma = (p * (1.0 - p) / n as f64).sqrt();
        assert!((rate - p).abs() < 3.0 * sigma, "rate {rate}");
    }

    #[test]
    fn gilbert_elliott_moments_match_the_model() {
        let spec = LossSpec::GilbertElliott {
            p: 0.01,
            r: 0.3,
            h: 0.0,
            k: 1.0,
        };
        let (rate, burst) = measure(spec, 2_000_000, 11);
        let want = spec.mean_loss();
        assert!((rate - want).abs() / want < 0.05, "rate {rate} vs {want}");
        let want_b = spec.mean_burst().unwrap();
        assert!(
            (burst - want_b).abs() / want_b < 0.05,
            "burst {burst} vs {want_b}"
        );
    }

    #[test]
    fn gilbert_elliott_with_partial_loss_states() {
        let spec = LossSpec::GilbertElliott {
            p: 0.05,
            r: 0.2,
            h: 0.5,
            k: 0.99,
        };
        let (rate, _) = measure(spec, 2_000_000, 3);
        let want = spec.mean_loss();
        assert!((rate - want).abs() / want < 0.05, "rate {rate} vs {want}");
    }

    #[test]
    fn bursts_have_the_exact_length_and_rate() {
        let spec = LossSpec::Burst { rate: 1e-2, len: 4 };
        let (rate, burst) = measure(spec, 2_000_000, 5);
        assert!((rate - 1e-2).abs() / 1e-2 < 0.05, "rate {rate}");
        // Two bursts may touch and merge; that is rare at 1e-2.
        assert!((burst - 4.0).abs() < 0.1, "burst {burst}");
    }

    #[test]
    fn same_seed_same_losses() {
        let spec = LossSpec::Bernoulli { p: 0.1 };
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut l = Loss::new(spec);
            (0..1000).map(|_| l.lose(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
