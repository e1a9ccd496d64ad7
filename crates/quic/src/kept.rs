//! Part files that puts left unfinished, kept on the server for a resume:
//! recorded in its state directory (`kept-parts-HASH.json`, one per served
//! root), capped per client and in all, and expired. A part with no chunk
//! in it is not kept at all (the receiver removes it when its session
//! ends); the rest are removed, oldest first, once a client's (or
//! everybody's) unfinished parts hold more on disk than the caps allow (a
//! large file's part is kept while what it holds is within them, whatever
//! the file's size), and after `--keep-parts-for` whatever they hold. A part
//! a session of the server is receiving, or another process has locked, is
//! not removed now and stays on record.

use crate::throttle::client_block;
use longhaul_transfer::place::remove_unfinished;
use longhaul_transfer::units::{parse_size, show_size};
use longhaul_transfer::RelPath;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How much the unfinished parts of puts may announce: bytes, or a share of
/// the served root's file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// This many bytes.
    Bytes(u64),
    /// This many percent of the file system's size.
    Percent(u8),
}

impl Cap {
    /// The cap in bytes on a file system of `fs_size` bytes.
    fn bytes(self, fs_size: u64) -> u64 {
        match self {
            Cap::Bytes(b) => b,
            Cap::Percent(p) => (fs_size as u128 * p as u128 / 100) as u64,
        }
    }
}

impl std::str::FromStr for Cap {
    type Err = String;
    fn from_str(s: &str) -> Result<Cap, String> {
        match s.trim().strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 100 => Ok(Cap::Percent(p)),
                _ => Err(format!(
                    "{s:?}: a share is a whole percentage from 0% to 100%"
                )),
            },
            None => parse_size(s).map(Cap::Bytes).map_err(|e| e.to_string()),
        }
    }
}

impl std::fmt::Display for Cap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cap::Bytes(b) => f.write_str(&show_size(*b)),
            Cap::Percent(p) => write!(f, "{p}% of the file system"),
        }
    }
}

/// What a server keeps of the puts left unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepRules {
    /// How long an unfinished part is kept after its session left it
    /// (`--keep-parts-for`; zero: not at all).
    pub keep_for: Duration,
    /// What one client's unfinished parts may announce in all
    /// (`--keep-parts-per-client`).
    pub per_client: Cap,
    /// What all clients' unfinished parts may announce in all
    /// (`--keep-parts`).
    pub total: Cap,
}

impl Default for KeepRules {
    fn default() -> KeepRules {
        KeepRules {
            keep_for: Duration::from_secs(7 * 86400),
            per_client: Cap::Percent(25),
            total: Cap::Percent(50),
        }
    }
}

/// One unfinished part, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Kept {
    /// Its target beneath the served root (wire form: `/`-separated bytes;
    /// written as text, bytes that are not UTF-8 and `%` as `%XX`).
    #[serde(with = "escaped")]
    pub path: Vec<u8>,
    /// The client that left it ([`client_of`]).
    pub client: String,
    /// The size its entry announced.
    pub size: u64,
    /// When its session left it, seconds since the Unix epoch.
    pub since: u64,
}

/// A path as text that reads back as the same bytes: UTF-8 as it is, other
/// bytes (and `%`) as `%XX`.
mod escaped {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::new();
        for chunk in b.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '%' => out.push_str("%25"),
                    c => out.push(c),
                }
            }
            for x in chunk.invalid() {
                out.push_str(&format!("%{x:02X}"));
            }
        }
        s.serialize_str(&out)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        let mut out = Vec::with_capacity(s.len());
        let mut bytes = s.bytes();
        while let Some(b) = bytes.next() {
            if b != b'%' {
                out.push(b);
                continue;
            }
            let hex: Vec<u8> = bytes.by_ref().take(2).collect();
            let x = std::str::from_utf8(&hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .filter(|_| hex.len() == 2)
                .ok_or_else(|| serde::de::Error::custom("a % not followed by two hex digits"))?;
            out.push(x);
        }
        Ok(out)
    }
}

/// Why a kept part goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// Kept for longer than `keep_for`.
    Expired,
    /// Its client's parts hold more than `per_client`.
    Client,
    /// All parts hold more than `total`.
    Total,
}

/// Which of `kept` must go at `now` (seconds since the Unix epoch), and why:
/// those kept longer than `keep_for` seconds; then, oldest first, those of a
/// client whose parts hold more than `per_client` bytes; then, oldest
/// first, those past `total` bytes in all. `held[i]`: what `kept[i]`'s part
/// holds on disk. Indices into `kept`.
pub(crate) fn to_remove(
    kept: &[Kept],
    held: &[u64],
    now: u64,
    keep_for: u64,
    per_client: u64,
    total: u64,
) -> Vec<(usize, Why)> {
    let mut out = Vec::new();
    let mut order: Vec<usize> = (0..kept.len()).collect();
    order.sort_by_key(|&i| (kept[i].since, i));
    let mut left = Vec::new();
    for i in order {
        if now.saturating_sub(kept[i].since) >= keep_for {
            out.push((i, Why::Expired));
        } else {
            left.push(i);
        }
    }
    let mut by_client: std::collections::HashMap<&str, u64> = Default::default();
    for &i in &left {
        *by_client.entry(&kept[i].client).or_default() += held[i];
    }
    let mut still = Vec::new();
    for i in left {
        let sum = by_client.get_mut(kept[i].client.as_str()).expect("counted");
        if *sum > per_client {
            *sum -= held[i];
            out.push((i, Why::Client));
        } else {
            still.push(i);
        }
    }
    let mut sum: u64 = still.iter().map(|&i| held[i]).sum();
    for i in still {
        if sum <= total {
            break;
        }
        sum -= held[i];
        out.push((i, Why::Total));
    }
    out
}

/// The client a part is kept for ([`client_block`]), as text.
pub(crate) fn client_of(ip: IpAddr) -> String {
    match client_block(ip) {
        IpAddr::V6(v6) => format!("{v6}/64"),
        v4 => v4.to_string(),
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The server's record of unfinished parts, and what enforces its rules.
pub(crate) struct KeptParts {
    root: Arc<cap_std::fs::Dir>,
    file: PathBuf,
    rules: KeepRules,
    kept: Mutex<Vec<Kept>>,
}

impl KeptParts {
    /// The record in `state_dir` (empty if there is none, or it cannot be
    /// read: said in the log) for the served `root`, found at `root_path`:
    /// one record per root (`kept-parts-HASH.json`), so that servers of
    /// several roots may share a state directory.
    pub(crate) fn load(
        root: Arc<cap_std::fs::Dir>,
        root_path: &std::path::Path,
        state_dir: &std::path::Path,
        rules: KeepRules,
    ) -> KeptParts {
        use std::os::unix::ffi::OsStrExt;
        let canonical = std::fs::canonicalize(root_path).unwrap_or_else(|_| root_path.into());
        let hash = blake3::hash(canonical.as_os_str().as_bytes()).to_hex();
        let file = state_dir.join(format!("kept-parts-{}.json", &hash[..16]));
        let kept = match std::fs::read(&file) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
                tracing::warn!(
                    "{}: not a record of kept parts ({e}); starting a new one",
                    file.display()
                );
                Vec::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!("{}: {e}; starting a new record", file.display());
                Vec::new()
            }
        };
        KeptParts {
            root,
            file,
            rules,
            kept: Mutex::new(kept),
        }
    }

    /// A session of `client` left `unfinished` files with their parts
    /// (targets beneath the root, sizes): recorded as of now, then the rules
    /// are applied.
    pub(crate) fn left(&self, client: &str, unfinished: Vec<(RelPath, u64)>) {
        if unfinished.is_empty() {
            return;
        }
        let now = now_s();
        let mut unfinished = unfinished;
        // Left at once: in the order of their names (the oldest go first).
        unfinished.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        {
            let mut kept = self.kept.lock().unwrap();
            let again: std::collections::HashSet<&[u8]> =
                unfinished.iter().map(|(p, _)| p.as_bytes()).collect();
            kept.retain(|k| !again.contains(&k.path[..]));
            for (path, size) in &unfinished {
                kept.push(Kept {
                    path: path.as_bytes().to_vec(),
                    client: client.to_string(),
                    size: *size,
                    since: now,
                });
            }
        }
        self.enforce();
    }

    /// Removes what the rules say must go (and forgets parts that are no
    /// longer there: finished by a resume, or removed by hand); saves the
    /// record when it changed. A part that cannot be removed now (a session
    /// receives it, another process holds its lock, an error) stays on
    /// record. Blocking.
    pub(crate) fn enforce(&self) {
        // A share of a file system that tells no size caps nothing.
        let fs_size = fs_size(&self.root).ok().flatten();
        let cap = |c: Cap| match (c, fs_size) {
            (Cap::Percent(_), None) => u64::MAX,
            (c, fs) => c.bytes(fs.unwrap_or(0)),
        };
        let mut kept = self.kept.lock().unwrap();
        let before = kept.clone();
        let mut held = Vec::with_capacity(kept.len());
        kept.retain(|k| match self.held(k) {
            Some(h) => {
                held.push(h);
                true
            }
            None => false,
        });
        let gone = to_remove(
            &kept,
            &held,
            now_s(),
            self.rules.keep_for.as_secs(),
            cap(self.rules.per_client),
            cap(self.rules.total),
        );
        let mut drop_idx: Vec<usize> = Vec::with_capacity(gone.len());
        for (i, why) in gone {
            let k = &kept[i];
            let shown = RelPath::from_wire(&k.path).map_or_else(
                |_| longhaul_transfer::shown(&String::from_utf8_lossy(&k.path)).into_owned(),
                |p| p.display(),
            );
            let why = match why {
                Why::Expired => format!("kept longer than {:?}", self.rules.keep_for),
                Why::Client => format!(
                    "{}'s unfinished parts hold more than {}",
                    k.client, self.rules.per_client
                ),
                Why::Total => format!("all unfinished parts hold more than {}", self.rules.total),
            };
            match RelPath::from_wire(&k.path).map(|p| remove_unfinished(&self.root, &p)) {
                Ok(Ok(true)) => {
                    tracing::info!(
                        "{shown}: removed its unfinished part ({} held of {}, left by {}): {why}",
                        show_size(held[i]),
                        show_size(k.size),
                        k.client
                    );
                    drop_idx.push(i);
                }
                Ok(Ok(false)) => tracing::info!(
                    "{shown}: its unfinished part is being received; kept on record ({why})"
                ),
                Ok(Err(e)) => tracing::warn!("{shown}: removing its unfinished part: {e}"),
                Err(e) => {
                    tracing::warn!("{shown}: not a path in the record: {e}");
                    drop_idx.push(i);
                }
            }
        }
        drop_idx.sort_unstable();
        for i in drop_idx.into_iter().rev() {
            kept.remove(i);
        }
        if *kept != before {
            if let Err(e) = self.save(&kept) {
                tracing::warn!("{}: {e}", self.file.display());
            }
        }
    }

    /// What `k`'s part holds on disk, if it is still beneath the root.
    fn held(&self, k: &Kept) -> Option<u64> {
        use cap_std::fs::MetadataExt;
        let path = RelPath::from_wire(&k.path).ok()?;
        let parent = path.parent()?;
        use std::os::unix::ffi::OsStrExt;
        let part = longhaul_transfer::place::sibling_name(
            path.file_name(),
            longhaul_transfer::place::PART,
        );
        let at = parent.as_path().join(std::ffi::OsStr::from_bytes(&part));
        let m = self
            .root
            .symlink_metadata(at)
            .ok()
            .filter(|m| m.is_file())?;
        Some(m.blocks().saturating_mul(512))
    }

    fn save(&self, kept: &[Kept]) -> std::io::Result<()> {
        use std::io::Write;
        let tmp = self.file.with_extension("json.tmp");
        let mut f = std::fs::OpenOptions::new();
        std::os::unix::fs::OpenOptionsExt::mode(f.write(true).create(true).truncate(true), 0o600);
        let mut f = f.open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(kept).map_err(std::io::Error::other)?)?;
        f.sync_data()?;
        std::fs::rename(&tmp, &self.file)?;
        // The rename itself made durable.
        if let Some(dir) = self.file.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// The size of the file system that holds `dir`, in bytes (`None`: it
/// tells none).
fn fs_size(dir: &cap_std::fs::Dir) -> std::io::Result<Option<u64>> {
    let d = dir.open(".")?;
    Ok(longhaul_transfer::place::fs_space(&d)?.map(|s| s.size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(path: &str, client: &str, size: u64, since: u64) -> Kept {
        Kept {
            path: path.as_bytes().to_vec(),
            client: client.into(),
            size,
            since,
        }
    }

    fn sizes(kept: &[Kept]) -> Vec<u64> {
        kept.iter().map(|k| k.size).collect()
    }

    #[test]
    fn expired_then_each_clients_oldest_then_everybodys_oldest_go() {
        let kept = vec![
            k("a", "1.1.1.1", 10, 100),
            k("b", "1.1.1.1", 10, 300),
            k("c", "2.2.2.2", 10, 200),
            k("d", "1.1.1.1", 10, 400),
            k("e", "3.3.3.3", 10, 50),
        ];
        // Nothing goes within the rules.
        assert_eq!(to_remove(&kept, &sizes(&kept), 500, 1000, 30, 50), vec![]);
        // Kept past 400 s: e (since 50) and a (since 100).
        assert_eq!(
            to_remove(&kept, &sizes(&kept), 500, 400, 30, 50),
            vec![(4, Why::Expired), (0, Why::Expired)]
        );
        // 1.1.1.1 may keep 20: its oldest (a) goes.
        assert_eq!(
            to_remove(&kept, &sizes(&kept), 500, 1000, 20, 50),
            vec![(0, Why::Client)]
        );
        // Everybody may keep 30: the oldest go (e, a), whoever left them.
        assert_eq!(
            to_remove(&kept, &sizes(&kept), 500, 1000, 30, 30),
            vec![(4, Why::Total), (0, Why::Total)]
        );
        // What counts is what a part holds, not what its file announced.
        let held = [1, 10, 10, 10, 10];
        assert_eq!(to_remove(&kept, &held, 500, 1000, 21, 50), vec![]);
        assert_eq!(
            to_remove(&kept, &sizes(&kept), 500, 1000, 21, 50),
            vec![(0, Why::Client)]
        );
        // Oldest first, until the rest is within the cap.
        let big = vec![
            k("x", "1.1.1.1", 1 << 44, 100),
            k("y", "1.1.1.1", 5, 50),
            k("z", "1.1.1.1", 5, 150),
        ];
        assert_eq!(
            to_remove(&big, &sizes(&big), 200, 1000, 1 << 30, 1 << 50),
            vec![(1, Why::Client), (0, Why::Client)]
        );
    }

    #[test]
    fn the_record_reads_back_as_written_and_as_text() {
        let kept = vec![
            k("in/ü 100%", "a", 1, 2),
            Kept {
                path: b"bad/\xff\xfe%".to_vec(),
                ..k("", "b", 3, 4)
            },
        ];
        let text = serde_json::to_string(&kept).unwrap();
        assert!(text.contains(r#""path":"in/ü 100%25""#), "{text}");
        assert!(text.contains(r#""path":"bad/%FF%FE%25""#), "{text}");
        assert_eq!(serde_json::from_str::<Vec<Kept>>(&text).unwrap(), kept);
        assert!(serde_json::from_str::<Vec<Kept>>(
            r#"[{"path":"a%zz","client":"c","size":1,"since":1}]"#
        )
        .is_err());
    }

    #[test]
    fn caps_read_as_sizes_or_shares() {
        assert_eq!("25%".parse::<Cap>(), Ok(Cap::Percent(25)));
        assert_eq!("1TiB".parse::<Cap>(), Ok(Cap::Bytes(1 << 40)));
        assert_eq!("0".parse::<Cap>(), Ok(Cap::Bytes(0)));
        assert!("101%".parse::<Cap>().is_err());
        assert!("lots".parse::<Cap>().is_err());
        assert_eq!(Cap::Percent(25).bytes(1000), 250);
    }

    #[test]
    fn an_ipv6_client_is_its_64() {
        let block = |s: &str| client_block(s.parse().unwrap());
        assert_eq!(block("2001:db8:1:2:aaaa::1"), block("2001:db8:1:2:ffff::9"));
        assert_ne!(block("2001:db8:1:2::1"), block("2001:db8:1:3::1"));
        assert_eq!(block("::ffff:192.0.2.7"), block("192.0.2.7"));
        assert_eq!(client_of("192.0.2.7".parse().unwrap()), "192.0.2.7");
        assert_eq!(
            client_of("2001:db8:1:2:aaaa::1".parse().unwrap()),
            "2001:db8:1:2::/64"
        );
        assert_eq!(client_of("::ffff:192.0.2.7".parse().unwrap()), "192.0.2.7");
    }
}
