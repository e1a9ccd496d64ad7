//! Shards of one transfer (`--shard K/N`): which part of a file set each of
//! N processes moves, so that the engines sites already run (a Slurm job
//! array, a Kubernetes Indexed Job, `mpirun`, GNU parallel) can spread one
//! transfer over several data-transfer nodes that share a file system.
//!
//! Every shard computes the same [`Plan`] from the same [`Listing`]: the
//! files in (root, path) order laid end to end, cut into N runs of equal
//! bytes. A file of at most one chunk goes whole to the shard its first
//! byte falls in; a larger file is cut at chunk boundaries, each chunk to
//! the shard its first byte falls in, so a shard holds contiguous chunk
//! ranges and a file of many chunks is split only where a run ends (at
//! most N − 1 files are split in a plan). Each run is within one unit (a
//! small file or a chunk) of the total over N.
//!
//! The listing is taken once and shared through a plan file (`PlanFile`):
//! the first shard writes it, without replacing one that is there, and
//! every shard plans from what the file holds.

use std::collections::HashMap;
use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

use crate::chunk::ChunkPlan;

/// Most shards a transfer may be cut into.
pub const MAX_SHARDS: u32 = 4096;

/// Which of how many shards this process is: `index` from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shard {
    /// 0-based index (`K − 1` of `--shard K/N`).
    pub index: u32,
    /// How many shards the transfer is cut into.
    pub count: u32,
}

impl Shard {
    /// Shard `index` (0-based) of `count`, checked.
    pub fn new(index: u32, count: u32) -> Result<Shard, String> {
        if count == 0 || count > MAX_SHARDS {
            return Err(format!(
                "a transfer is cut into 1 to {MAX_SHARDS} shards, not {count}"
            ));
        }
        if index >= count {
            return Err(format!(
                "shard {} of {count} does not exist: K runs from 1 to {count}",
                index as u64 + 1
            ));
        }
        Ok(Shard { index, count })
    }

    /// Parse `K/N` (K from 1). `auto` and `auto/N` read the launcher's
    /// environment through `env` ([`Shard::from_env`]).
    pub fn parse(s: &str, env: impl Fn(&str) -> Option<String>) -> Result<Shard, String> {
        let s = s.trim();
        if s == "auto" {
            return Shard::from_env(None, env);
        }
        if let Some(n) = s.strip_prefix("auto/") {
            let n: u32 = n
                .trim()
                .parse()
                .map_err(|_| format!("'{s}': N in auto/N must be a whole number"))?;
            return Shard::from_env(Some(n), env);
        }
        Shard::parse_k_of_n(s)
    }

    /// Parse `K/N` (K from 1).
    fn parse_k_of_n(s: &str) -> Result<Shard, String> {
        let (k, n) = s
            .split_once('/')
            .ok_or_else(|| format!("'{s}': a shard is K/N (1/4 .. 4/4), auto or auto/N"))?;
        let n: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("'{s}': N in K/N must be a whole number"))?;
        let k: u32 = k
            .trim()
            .parse()
            .map_err(|_| format!("'{s}': K in K/N must be a whole number from 1"))?;
        if k == 0 {
            return Err(format!("'{s}': K counts from 1 (1/{n} .. {n}/{n})"));
        }
        Shard::new(k - 1, n)
    }

    /// This process's shard as its launcher says it, read through `env`:
    /// `LONGHAUL_SHARD=K/N`; a Slurm job array (`SLURM_ARRAY_TASK_ID`
    /// less `SLURM_ARRAY_TASK_MIN`, of `SLURM_ARRAY_TASK_COUNT`); a Slurm
    /// step's task (`SLURM_PROCID` of `SLURM_NTASKS`); Open MPI
    /// (`OMPI_COMM_WORLD_RANK` of `OMPI_COMM_WORLD_SIZE`); MPICH and
    /// Intel MPI (`PMI_RANK` of `PMI_SIZE`); a Kubernetes Indexed Job
    /// (`JOB_COMPLETION_INDEX`, whose count is not in its environment:
    /// `auto/N` or `LONGHAUL_SHARDS=N`). The indices are 0-based; `count`,
    /// when given (`auto/N`), must agree with the launcher's.
    pub fn from_env(
        count: Option<u32>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Shard, String> {
        if let Some(v) = env("LONGHAUL_SHARD") {
            let s = Shard::parse_k_of_n(v.trim()).map_err(|e| format!("LONGHAUL_SHARD: {e}"))?;
            return agree(s, count, "LONGHAUL_SHARD");
        }
        let num = |name: &str| -> Result<Option<u32>, String> {
            match env(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{name}={v}: not a whole number")),
            }
        };
        let pairs = [
            ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"),
            ("SLURM_PROCID", "SLURM_NTASKS"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
        ];
        for (id_var, count_var) in pairs {
            let Some(mut id) = num(id_var)? else {
                continue;
            };
            if id_var == "SLURM_ARRAY_TASK_ID" {
                let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                id = id.checked_sub(min).ok_or_else(|| {
                    format!("SLURM_ARRAY_TASK_ID={id} is below SLURM_ARRAY_TASK_MIN={min}")
                })?;
            }
            let n = match (num(count_var)?, count) {
                (Some(n), _) => n,
                (None, Some(n)) => n,
                (None, None) => {
                    return Err(format!(
                        "{id_var} is set but {count_var} is not: give the count, --shard auto/N"
                    ))
                }
            };
            let s = Shard::new(id, n).map_err(|e| format!("{id_var}/{count_var}: {e}"))?;
            return agree(s, count, count_var);
        }
        if let Some(id) = num("JOB_COMPLETION_INDEX")? {
            let n = match (num("LONGHAUL_SHARDS")?, count) {
                (Some(n), _) | (None, Some(n)) => n,
                (None, None) => {
                    return Err(
                        "JOB_COMPLETION_INDEX is set but a Kubernetes Indexed Job does \
                                not say its completions: --shard auto/N or LONGHAUL_SHARDS=N"
                            .into(),
                    )
                }
            };
            let s = Shard::new(id, n).map_err(|e| format!("JOB_COMPLETION_INDEX: {e}"))?;
            return agree(s, count, "LONGHAUL_SHARDS");
        }
        Err(
            "--shard auto found no shard in the environment: none of LONGHAUL_SHARD, \
             SLURM_ARRAY_TASK_ID, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK, \
             JOB_COMPLETION_INDEX is set"
                .into(),
        )
    }
}

fn agree(s: Shard, count: Option<u32>, source: &str) -> Result<Shard, String> {
    match count {
        Some(n) if n != s.count => Err(format!(
            "--shard auto/{n}, but {source} says {} shards",
            s.count
        )),
        _ => Ok(s),
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index as u64 + 1, self.count)
    }
}

/// One file of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Which requested root it is under.
    pub root: u32,
    /// Its path beneath that root (raw bytes, `/`-separated).
    pub path: Vec<u8>,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
}

/// The files of a transfer, in (root, path) order, each once.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Listing {
    items: Vec<Item>,
}

impl Listing {
    /// A listing of `items` in any order; a (root, path) given twice keeps
    /// its last.
    pub fn new(mut items: Vec<Item>) -> Listing {
        items.reverse();
        items.sort_by(|a, b| (a.root, &a.path).cmp(&(b.root, &b.path)));
        items.dedup_by(|a, b| a.root == b.root && a.path == b.path);
        Listing { items }
    }

    /// The files, in order.
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// The bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.items.iter().map(|i| i.size).sum()
    }
}

/// What a shard moves of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Nothing: other shards move it.
    None,
    /// All of it.
    Whole,
    /// Chunks `first..end` of it; other shards move the rest.
    Chunks {
        /// First chunk.
        first: u64,
        /// One past the last chunk.
        end: u64,
    },
}

/// A contiguous run of one file's chunks and the shard that moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The shard (0-based).
    pub shard: u32,
    /// First chunk.
    pub first: u64,
    /// One past the last chunk.
    pub end: u64,
}

/// Which shard moves what: the same on every host for the same listing and
/// shard count.
#[derive(Debug, Clone)]
pub struct Plan {
    count: u32,
    listing: Listing,
    /// Per item, its runs in chunk order (one run for a file not split; an
    /// empty file has one run of no chunks).
    runs: Vec<Vec<Run>>,
    index: HashMap<(u32, Vec<u8>), usize>,
}

impl Plan {
    /// Cut `listing` into `count` shards.
    pub fn new(listing: Listing, count: u32) -> Plan {
        assert!(count >= 1, "at least one shard");
        let total = listing.bytes() as u128;
        let n = count as u128;
        // The shard whose run holds byte `at` of the files laid end to end.
        let shard_at = |at: u64| -> u32 {
            match total {
                0 => 0,
                t => ((at as u128 * n / t) as u32).min(count - 1),
            }
        };
        let mut at = 0u64;
        let mut runs = Vec::with_capacity(listing.items.len());
        for item in &listing.items {
            let plan = ChunkPlan::new(item.size);
            let mut file_runs: Vec<Run> = Vec::with_capacity(1);
            if plan.count() <= 1 {
                file_runs.push(Run {
                    shard: shard_at(at),
                    first: 0,
                    end: plan.count(),
                });
            } else {
                // Chunk i starts at at + i·C; the shard changes only where a
                // run ends, so walk the boundaries rather than the chunks.
                let mut first = 0u64;
                while first < plan.count() {
                    let shard = shard_at(at + plan.offset(first));
                    let end = match shard + 1 < count {
                        // First chunk starting at or past the next run's start.
                        true => {
                            let next = ((shard as u128 + 1) * total).div_ceil(n) as u64;
                            let rel = next.saturating_sub(at);
                            rel.div_ceil(crate::chunk::CHUNK_SIZE)
                                .clamp(first + 1, plan.count())
                        }
                        false => plan.count(),
                    };
                    file_runs.push(Run { shard, first, end });
                    first = end;
                }
            }
            at += item.size;
            runs.push(file_runs);
        }
        let index = listing
            .items
            .iter()
            .enumerate()
            .map(|(i, it)| ((it.root, it.path.clone()), i))
            .collect();
        Plan {
            count,
            listing,
            runs,
            index,
        }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The listing it was made from.
    pub fn listing(&self) -> &Listing {
        &self.listing
    }

    /// The item at (`root`, `path`), if the listing has it.
    pub fn find(&self, root: u32, path: &[u8]) -> Option<(usize, &Item)> {
        let i = *self.index.get(&(root, path.to_vec()))?;
        Some((i, &self.listing.items[i]))
    }

    /// Item `i`'s runs, in chunk order.
    pub fn runs(&self, i: usize) -> &[Run] {
        &self.runs[i]
    }

    /// What `shard` moves of item `i`.
    pub fn part(&self, i: usize, shard: u32) -> Part {
        let runs = &self.runs[i];
        match runs.iter().find(|r| r.shard == shard) {
            None => Part::None,
            Some(_) if runs.len() == 1 => Part::Whole,
            Some(r) => Part::Chunks {
                first: r.first,
                end: r.end,
            },
        }
    }

    /// The bytes `shard` moves.
    pub fn bytes(&self, shard: u32) -> u64 {
        self.listing
            .items
            .iter()
            .zip(&self.runs)
            .flat_map(|(it, runs)| {
                let plan = ChunkPlan::new(it.size);
                runs.iter()
                    .filter(move |r| r.shard == shard)
                    .map(move |r| (r.first..r.end).filter_map(|c| plan.len(c)).sum::<u64>())
            })
            .sum()
    }

    /// The files `shard` moves whole, and those it moves a part of.
    pub fn files(&self, shard: u32) -> (u64, u64) {
        let (mut whole, mut split) = (0, 0);
        for i in 0..self.runs.len() {
            match self.part(i, shard) {
                Part::Whole => whole += 1,
                Part::Chunks { .. } => split += 1,
                Part::None => {}
            }
        }
        (whole, split)
    }
}

/// A plan file: the listing every shard plans from, and what it was taken
/// of. Written once, by the first shard, and never replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFile {
    /// What was listed (the server and its paths): a shard of another
    /// transfer refuses the file.
    pub source: String,
    /// How many shards the transfer is cut into.
    pub count: u32,
    /// When it was listed, seconds since the epoch.
    pub listed_at: u64,
    /// The files.
    pub listing: Listing,
}

const MAGIC: &[u8; 4] = b"LHP1";

impl PlanFile {
    /// Its bytes: `LHP1`, the postcard encoding, and the BLAKE3 of both.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend(postcard::to_stdvec(self).expect("a plan encodes"));
        let sum = *blake3::hash(&v).as_bytes();
        v.extend_from_slice(&sum);
        v
    }

    /// Read a plan file's bytes; an error says what is wrong with them.
    pub fn decode(bytes: &[u8]) -> io::Result<PlanFile> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        if bytes.len() < 36 || &bytes[..4] != MAGIC {
            return Err(bad("not a longhaul shard plan (no LHP1 header)"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(bad(
                "the shard plan is damaged (its checksum does not match)",
            ));
        }
        postcard::from_bytes(&body[4..])
            .map_err(|e| bad(&format!("the shard plan does not decode: {e}")))
    }

    /// Is it the plan of `source` cut into `count` shards? An error says how
    /// it differs.
    pub fn matches(&self, source: &str, count: u32) -> Result<(), String> {
        if self.source != source {
            return Err(format!(
                "it lists {}, not {source}",
                crate::shown(&self.source)
            ));
        }
        if self.count != count {
            return Err(format!(
                "it cuts the transfer into {} shards, not {count}",
                self.count
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::CHUNK_SIZE;
    use rand::{Rng, SeedableRng};

    fn item(root: u32, path: &str, size: u64) -> Item {
        Item {
            root,
            path: path.as_bytes().to_vec(),
            size,
            mtime_ns: 7,
        }
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn k_of_n_parses_from_one_and_says_what_is_wrong() {
        let none = |_: &str| None;
        assert_eq!(
            Shard::parse("1/4", none).unwrap(),
            Shard { index: 0, count: 4 }
        );
        assert_eq!(
            Shard::parse("4/4", none).unwrap(),
            Shard { index: 3, count: 4 }
        );
        assert_eq!(Shard::parse("3/4", none).unwrap().to_string(), "3/4");
        for (s, says) in [
            ("0/4", "counts from 1"),
            ("5/4", "shard 5 of 4 does not exist"),
            ("1/0", "1 to 4096 shards, not 0"),
            ("4", "a shard is K/N"),
            ("a/4", "K in K/N"),
            ("1/x", "N in K/N"),
        ] {
            let e = Shard::parse(s, none).unwrap_err();
            assert!(e.contains(says), "{s}: {e}");
        }
    }

    #[test]
    fn auto_reads_each_launcher_and_maps_its_zero_based_index() {
        let cases: &[(&[(&str, &str)], Shard)] = &[
            (&[("LONGHAUL_SHARD", "2/3")], Shard { index: 1, count: 3 }),
            (
                &[
                    ("SLURM_ARRAY_TASK_ID", "12"),
                    ("SLURM_ARRAY_TASK_MIN", "10"),
                    ("SLURM_ARRAY_TASK_COUNT", "4"),
                ],
                Shard { index: 2, count: 4 },
            ),
            (
                &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
                Shard { index: 0, count: 2 },
            ),
            (
                &[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")],
                Shard { index: 3, count: 4 },
            ),
            (
                &[("PMI_RANK", "1"), ("PMI_SIZE", "2")],
                Shard { index: 1, count: 2 },
            ),
            (
                &[("JOB_COMPLETION_INDEX", "1"), ("LONGHAUL_SHARDS", "8")],
                Shard { index: 1, count: 8 },
            ),
        ];
        for (vars, want) in cases {
            assert_eq!(Shard::parse("auto", env(vars)).unwrap(), *want, "{vars:?}");
        }
        let k8s = [("JOB_COMPLETION_INDEX", "5")];
        assert_eq!(
            Shard::parse("auto/6", env(&k8s)).unwrap(),
            Shard { index: 5, count: 6 }
        );
        assert!(Shard::parse("auto", env(&k8s))
            .unwrap_err()
            .contains("auto/N"));
        let e = Shard::parse("auto/3", env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")])).unwrap_err();
        assert!(e.contains("PMI_SIZE says 2 shards"), "{e}");
        let e = Shard::parse("auto", env(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")])).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert!(Shard::parse("auto", env(&[]))
            .unwrap_err()
            .contains("found no shard"));
    }

    /// Every chunk of every file is moved by exactly one shard, runs are in
    /// order and contiguous, and small files are never split.
    fn check_cover(plan: &Plan) {
        for (i, it) in plan.listing().items().iter().enumerate() {
            let chunks = ChunkPlan::new(it.size).count();
            let runs = plan.runs(i);
            assert_eq!(runs.first().unwrap().first, 0);
            assert_eq!(runs.last().unwrap().end, chunks);
            for w in runs.windows(2) {
                assert_eq!(w[0].end, w[1].first);
                assert!(w[0].shard < w[1].shard);
                assert!(w[0].first < w[0].end);
            }
            if chunks <= 1 {
                assert_eq!(runs.len(), 1);
            }
            let owners: Vec<u32> = (0..plan.count())
                .filter(|&s| plan.part(i, s) != Part::None)
                .collect();
            assert_eq!(owners.len(), runs.len());
        }
        let total: u64 = (0..plan.count()).map(|s| plan.bytes(s)).sum();
        assert_eq!(total, plan.listing().bytes());
    }

    fn spread(plan: &Plan) -> f64 {
        let mean = plan.listing().bytes() as f64 / plan.count() as f64;
        (0..plan.count())
            .map(|s| (plan.bytes(s) as f64 - mean).abs() / mean)
            .fold(0.0, f64::max)
    }

    #[test]
    fn one_large_file_is_cut_into_equal_chunk_ranges() {
        for n in [1, 2, 3, 4, 7, 16] {
            let size = 8 << 30;
            let plan = Plan::new(Listing::new(vec![item(0, "big", size)]), n);
            check_cover(&plan);
            assert_eq!(plan.runs(0).len(), n as usize);
            for s in 0..n {
                let want = size / n as u64;
                assert!(plan.bytes(s).abs_diff(want) <= CHUNK_SIZE, "{n}: {s}");
                assert!(matches!(plan.part(0, s), Part::Chunks { .. } if n > 1) || n == 1);
            }
        }
        let plan = Plan::new(Listing::new(vec![item(0, "big", 3 * CHUNK_SIZE + 5)]), 8);
        check_cover(&plan);
        // Four chunks for eight shards: four shards get one each.
        assert_eq!(plan.runs(0).len(), 4);
    }

    #[test]
    fn many_files_and_one_large_one_balance_within_five_percent() {
        let mut items: Vec<Item> = (0..1000)
            .map(|i| item(0, &format!("d{}/f{i:04}", i % 10), 10_000 + i * 1000))
            .collect();
        items.push(item(0, "big", 8 << 30));
        let listing = Listing::new(items);
        for n in [2, 4] {
            let plan = Plan::new(listing.clone(), n);
            check_cover(&plan);
            assert!(spread(&plan) < 0.001, "{n}: {}", spread(&plan));
            // Only the large file is split.
            let split = (0..listing.items().len())
                .filter(|&i| plan.runs(i).len() > 1)
                .count();
            assert_eq!(split, 1);
        }
    }

    #[test]
    fn random_trees_are_covered_once_and_balanced_within_a_unit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(50);
        for round in 0..300 {
            let files = rng.gen_range(0..400);
            let items: Vec<Item> = (0..files)
                .map(|i| {
                    let size = match rng.gen_range(0..10) {
                        0 => rng.gen_range(0..200 * CHUNK_SIZE),
                        1 => 0,
                        _ => rng.gen_range(0..2 * CHUNK_SIZE),
                    };
                    item(
                        rng.gen_range(0..3),
                        &format!("p{}", rng.gen_range(0..1000) + i),
                        size,
                    )
                })
                .collect();
            let n = rng.gen_range(1..12);
            let listing = Listing::new(items);
            let plan = Plan::new(listing.clone(), n);
            check_cover(&plan);
            let unit = listing
                .items()
                .iter()
                .map(|i| i.size.min(CHUNK_SIZE))
                .max()
                .unwrap_or(0);
            let mean = listing.bytes() / n as u64;
            for s in 0..n {
                assert!(
                    plan.bytes(s).abs_diff(mean) <= unit + 1,
                    "round {round}: shard {s} of {n} has {} of mean {mean} (unit {unit})",
                    plan.bytes(s)
                );
            }
            // The same listing in another order plans the same.
            let mut shuffled = listing.items().to_vec();
            shuffled.reverse();
            let again = Plan::new(Listing::new(shuffled), n);
            assert_eq!(again.runs, plan.runs);
        }
    }

    #[test]
    fn a_plan_file_round_trips_and_refuses_damage_and_other_transfers() {
        let pf = PlanFile {
            source: "host:4433 data/".into(),
            count: 4,
            listed_at: 1,
            listing: Listing::new(vec![item(0, "a", 1), item(1, "b\nc", 2 << 20)]),
        };
        let bytes = pf.encode();
        assert_eq!(PlanFile::decode(&bytes).unwrap(), pf);
        let mut bad = bytes.clone();
        bad[10] ^= 1;
        assert!(PlanFile::decode(&bad)
            .unwrap_err()
            .to_string()
            .contains("damaged"));
        assert!(PlanFile::decode(b"hello").is_err());
        assert!(pf.matches("host:4433 data/", 4).is_ok());
        assert!(pf
            .matches("host:4433 data/", 2)
            .unwrap_err()
            .contains("4 shards, not 2"));
        assert!(pf.matches("other", 4).unwrap_err().contains("not other"));
    }
}
