//! A shard's plan file (`get --shard`, `put --shard`,
//! [`longhaul_transfer::shard`]): read when it is there, written once by the
//! first shard that has a listing, never replaced.

use longhaul_transfer::place::DestDir;
use longhaul_transfer::shard::{Listing, Plan, PlanFile, Shard};
use longhaul_transfer::RelPath;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a transfer's shards share their plan.
#[derive(Debug, Clone)]
pub enum PlanAt {
    /// A file of the client's (`get --plan`, or the default in DEST).
    Path(PathBuf),
    /// Beneath the receiving side's base, reached as every received path
    /// is (no link followed): a put's server keeps it in the destination.
    Dest(RelPath),
}

/// Which shard a transfer is, and where its plan is shared.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// This shard.
    pub shard: Shard,
    /// The plan file, on a file system every shard sees.
    pub plan_file: PlanAt,
    /// What is listed (the paths and the filters, not the host: each shard
    /// may go to another server of the same file system): a plan file of
    /// another transfer is refused.
    pub source: String,
}

/// What a client of a sharded transfer is.
#[derive(Debug, Clone)]
pub enum ShardRole {
    /// One shard (`--shard K/N`).
    Part(Sharding),
    /// `--shard finish`: the whole tree checked by BLAKE3, then the plan
    /// removed.
    Finish(Sharding),
}

impl ShardRole {
    /// The shard and its plan's place.
    pub fn sharding(&self) -> &Sharding {
        match self {
            ShardRole::Part(s) | ShardRole::Finish(s) => s,
        }
    }
}

impl Sharding {
    /// The plan, if its file is there (an error if it is of another
    /// transfer, or damaged). `dest`: the receiving side's destination.
    pub(crate) fn read(&self, dest: &mut DestDir) -> Result<Option<Arc<Plan>>, String> {
        match self.load(Some(dest)) {
            Ok(Some(b)) => self.parse(&b).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(self.says(&e.to_string())),
        }
    }

    /// [`Sharding::read`] of a plan file of the client's own (none for one
    /// in a destination).
    pub(crate) fn read_path(&self) -> Result<Option<Arc<Plan>>, String> {
        match self.load(None) {
            Ok(Some(b)) => self.parse(&b).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(self.says(&e.to_string())),
        }
    }

    fn parse(&self, bytes: &[u8]) -> Result<Arc<Plan>, String> {
        let pf = PlanFile::decode(bytes).map_err(|e| self.says(&e.to_string()))?;
        pf.matches(&self.source, self.shard.count)
            .map_err(|e| self.says(&format!("{e}; remove it to list the source again")))?;
        Ok(Arc::new(Plan::new(pf.listing, self.shard.count)))
    }

    /// Write `listing` as the plan file unless one is there (another shard
    /// may have written it meanwhile: it is kept), then read the plan back
    /// from it, so every shard follows the same.
    pub(crate) fn write(&self, listing: Listing, dest: &mut DestDir) -> Result<Arc<Plan>, String> {
        let pf = PlanFile {
            source: self.source.clone(),
            count: self.shard.count,
            listed_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            listing,
        };
        self.store(&pf.encode(), dest)
            .map_err(|e| self.says(&format!("cannot be written: {e}")))?;
        self.read(dest)?
            .ok_or_else(|| self.says("vanished right after it was written"))
    }

    /// Remove the plan file (`--shard finish`, once the tree is whole).
    pub(crate) fn remove(&self, dest: &mut DestDir) -> std::io::Result<()> {
        let r = match &self.plan_file {
            PlanAt::Path(p) => std::fs::remove_file(p),
            PlanAt::Dest(rel) => {
                let (dir, name) = dest.parent_of(rel)?;
                dir.remove_file(os(&name))
            }
        };
        match r {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn load(&self, dest: Option<&mut DestDir>) -> std::io::Result<Option<Vec<u8>>> {
        let opened = match (&self.plan_file, dest) {
            (PlanAt::Path(p), _) => std::fs::File::open(p),
            (PlanAt::Dest(rel), Some(dest)) => {
                let (dir, name) = dest.parent_of(rel)?;
                longhaul_transfer::place::open_read(&dir, os(&name))
            }
            (PlanAt::Dest(_), None) => return Ok(None),
        };
        let mut f = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// Write `bytes` under a temporary name, synced, then hard-link it to
    /// the plan's name: never replaces a plan another shard made (a rename
    /// would), and works on NFS and parallel file systems.
    fn store(&self, bytes: &[u8], dest: &mut DestDir) -> std::io::Result<()> {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let tmp = format!(".{}-{nonce:016x}.lh-plan", std::process::id());
        let linked = |r: std::io::Result<()>| match r {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            r => r,
        };
        match &self.plan_file {
            PlanAt::Path(p) => {
                let tmp = p.with_file_name(tmp);
                let r = (|| {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&tmp)?;
                    f.write_all(bytes)?;
                    f.sync_all()?;
                    linked(std::fs::hard_link(&tmp, p))
                })();
                let _ = std::fs::remove_file(&tmp);
                r
            }
            PlanAt::Dest(rel) => {
                let (dir, name) = dest.parent_of(rel)?;
                let r = (|| {
                    let mut o = cap_std::fs::OpenOptions::new();
                    o.write(true).create_new(true);
                    let mut f = dir.open_with(&tmp, &o)?.into_std();
                    f.write_all(bytes)?;
                    f.sync_all()?;
                    linked(dir.hard_link(&tmp, &dir, os(&name)))
                })();
                let _ = dir.remove_file(&tmp);
                r
            }
        }
    }

    fn says(&self, what: &str) -> String {
        let at = match &self.plan_file {
            PlanAt::Path(p) => p.display().to_string(),
            PlanAt::Dest(rel) => rel.display(),
        };
        format!("shard plan {at}: {what}")
    }
}

fn os(b: &[u8]) -> &Path {
    use std::os::unix::ffi::OsStrExt;
    Path::new(std::ffi::OsStr::from_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_transfer::shard::Item;

    #[test]
    fn the_first_plan_written_is_the_one_every_shard_follows() {
        let tmp = tempfile::tempdir().unwrap();
        let at = |k| Sharding {
            shard: Shard::new(k, 2).unwrap(),
            plan_file: PlanAt::Path(tmp.path().join(".longhaul.lh-plan")),
            source: "h:1 data".into(),
        };
        let base = || {
            let d = cap_std::fs::Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority());
            DestDir::new(d.unwrap())
        };
        let d = &mut base();
        let item = |p: &str, size| Item {
            root: 0,
            path: p.as_bytes().to_vec(),
            size,
            mtime_ns: 1,
        };
        assert!(at(0).read(d).unwrap().is_none());
        let first = at(0).write(Listing::new(vec![item("a", 5)]), d).unwrap();
        // A second shard with another listing follows the first's.
        let second = at(1).write(Listing::new(vec![item("b", 9)]), d).unwrap();
        assert_eq!(first.listing(), second.listing());
        assert_eq!(second.listing().items()[0].path, b"a");
        let other = Sharding {
            source: "h:1 other".into(),
            ..at(0)
        };
        assert!(other.read(d).unwrap_err().contains("remove it"));
        let four = Sharding {
            shard: Shard::new(0, 4).unwrap(),
            ..at(0)
        };
        assert!(four.read(d).unwrap_err().contains("2 shards, not 4"));
        // Nothing but the plan is left beside it.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        // The same in a destination, reached beneath its base.
        let inside = |k| Sharding {
            plan_file: PlanAt::Dest(RelPath::from_wire(b"in/.longhaul.lh-plan").unwrap()),
            ..at(k)
        };
        let first = inside(0)
            .write(Listing::new(vec![item("c", 1)]), d)
            .unwrap();
        let second = inside(1)
            .write(Listing::new(vec![item("e", 2)]), d)
            .unwrap();
        assert_eq!(second.listing().items()[0].path, b"c");
        assert_eq!(first.listing(), second.listing());
        assert_eq!(std::fs::read_dir(tmp.path().join("in")).unwrap().count(), 1);
        inside(0).remove(d).unwrap();
        assert_eq!(std::fs::read_dir(tmp.path().join("in")).unwrap().count(), 0);
    }
}
