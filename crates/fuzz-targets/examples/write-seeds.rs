//! Writes every target's seeds into DIR/TARGET/seed-N, the corpus layout
//! cargo-fuzz uses (`fuzz/corpus/TARGET`).
fn main() {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).expect("usage: write-seeds DIR"));
    for (name, _) in longhaul_fuzz_targets::TARGETS {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("creating the corpus directory");
        for (i, s) in longhaul_fuzz_targets::seeds(name).iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s).expect("writing a seed");
        }
    }
}
