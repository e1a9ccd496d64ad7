//! CI's fuzzing smoke test (stable): every target on its seeds and on
//! seeded random mutations of them. Not coverage-guided (that is
//! `scripts/fuzz`, libFuzzer on nightly); it keeps the targets compiling and
//! catches what a few thousand inputs can.

use longhaul_fuzz_targets::{seeds, TARGETS};
use rand::{Rng, SeedableRng};

const RUNS: usize = 20_000;

fn mutate(rng: &mut impl Rng, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..rng.gen_range(1..8) {
        match rng.gen_range(0..5) {
            0 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v[i] = rng.gen();
            }
            2 => {
                let i = rng.gen_range(0..=v.len());
                v.insert(i, rng.gen());
            }
            3 if !v.is_empty() => {
                let i = rng.gen_range(0..v.len());
                v.remove(i);
            }
            _ => {
                let at = rng.gen_range(0..=v.len());
                v.truncate(at);
            }
        }
    }
    v
}

#[test]
fn every_target_survives_its_seeds_and_their_mutations() {
    for (name, target) in TARGETS {
        let seeds = seeds(name);
        assert!(!seeds.is_empty(), "{name}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        for s in &seeds {
            target(s);
        }
        for i in 0..RUNS {
            let input = mutate(&mut rng, &seeds[i % seeds.len()]);
            target(&input);
        }
    }
}
