//! RaptorQ cost per GB on this machine, as longhaul multicast uses it:
//! `cargo run --release -p longhaul-mcast --example fec_bench [MB] [loss]`.
//! Encode: one encoder per block, `overhead` repair symbols (pass 1).
//! Decode: a block with `loss` of its source symbols missing, rebuilt from the rest
//! plus repair symbols (what a receiver does for every block that lost anything).

use longhaul_mcast::fec::{decode, Encoder};
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn cpu() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let loss: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0.01);
    let (t, k) = (1400u16, 1024u16);
    let block = t as usize * k as usize;
    let blocks = (mb << 20).div_ceil(block);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let data: Vec<u8> = (0..block).map(|_| rng.gen()).collect();
    let repair = (k as f64 * 0.02).ceil() as u32;
    let lost = ((k as f64 * loss).ceil() as u32).max(1);
    let (c0, w0) = (cpu(), Instant::now());
    let mut kept = Vec::new();
    for _ in 0..blocks {
        let e = Encoder::new(&data, k, t);
        kept = e.repair(k as u32, repair.max(lost + 2));
    }
    let (enc_cpu, enc_wall) = (cpu() - c0, w0.elapsed().as_secs_f64());
    let (c1, w1) = (cpu(), Instant::now());
    for _ in 0..blocks {
        let mut syms: Vec<(u32, Vec<u8>)> = (lost..k as u32)
            .map(|i| {
                (
                    i,
                    data[i as usize * t as usize..(i as usize + 1) * t as usize].to_vec(),
                )
            })
            .collect();
        syms.extend(
            kept.iter()
                .take(lost as usize + 2)
                .enumerate()
                .map(|(j, s)| (k as u32 + j as u32, s.clone())),
        );
        let got = decode(k, t, syms).expect("decodes");
        assert_eq!(got[..block], data[..]);
    }
    let (dec_cpu, dec_wall) = (cpu() - c1, w1.elapsed().as_secs_f64());
    let gb = (blocks * block) as f64 / 1e9;
    println!(
        "{} blocks of {k} x {t} B ({gb:.3} GB); encode with {} repair: {:.2} CPU s/GB ({:.0} Mbit/s); \
         decode with {lost} of {k} sources lost: {:.2} CPU s/GB ({:.0} Mbit/s)",
        blocks,
        repair.max(lost + 2),
        enc_cpu / gb,
        gb * 8e3 / enc_wall,
        dec_cpu / gb,
        gb * 8e3 / dec_wall
    );
}
