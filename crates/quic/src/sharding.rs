//! A shard's plan file (`get --shard`, [`longhaul_transfer::shard`]): read
//! when it is there, written once by the first shard that has a listing,
//! never replaced.

use longhaul_transfer::shard::{Listing, Plan, PlanFile, Shard};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which shard a transfer is, and where its plan is shared.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// This shard.
    pub shard: Shard,
    /// The plan file, on a file system every shard sees.
    pub plan_file: PathBuf,
    /// What is listed (the server and the paths): a plan file of another
    /// transfer is refused.
    pub source: String,
}

impl Sharding {
    /// The plan, if its file is there (an error if it is of another
    /// transfer, or damaged).
    pub fn read(&self) -> Result<Option<Arc<Plan>>, String> {
        let bytes = match std::fs::read(&self.plan_file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.says(&e.to_string())),
        };
        let pf = PlanFile::decode(&bytes).map_err(|e| self.says(&e.to_string()))?;
        pf.matches(&self.source, self.shard.count)
            .map_err(|e| self.says(&format!("{e}; remove it, or give another --plan")))?;
        Ok(Some(Arc::new(Plan::new(pf.listing, self.shard.count))))
    }

    /// Write `listing` as the plan file unless one is there (another shard
    /// may have written it meanwhile: it is kept), then read the plan back
    /// from it, so every shard follows the same.
    pub fn write(&self, listing: Listing) -> Result<Arc<Plan>, String> {
        let pf = PlanFile {
            source: self.source.clone(),
            count: self.shard.count,
            listed_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            listing,
        };
        let tmp = temp_beside(&self.plan_file);
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&pf.encode())?;
            f.sync_all()?;
            // A hard link: never replaces a plan another shard made (a
            // rename would), and works on NFS and parallel file systems.
            match std::fs::hard_link(&tmp, &self.plan_file) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                r => r,
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        written.map_err(|e| self.says(&format!("cannot be written: {e}")))?;
        self.read()?
            .ok_or_else(|| self.says("vanished right after it was written"))
    }

    fn says(&self, what: &str) -> String {
        format!("shard plan {}: {what}", self.plan_file.display())
    }
}

fn temp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    name.push(format!(".{}-{nonce:016x}.tmp", std::process::id()));
    path.with_file_name(name)
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
            plan_file: tmp.path().join(".longhaul.lh-plan"),
            source: "h:1 data".into(),
        };
        let item = |p: &str, size| Item {
            root: 0,
            path: p.as_bytes().to_vec(),
            size,
            mtime_ns: 1,
        };
        assert!(at(0).read().unwrap().is_none());
        let first = at(0).write(Listing::new(vec![item("a", 5)])).unwrap();
        // A second shard with another listing follows the first's.
        let second = at(1).write(Listing::new(vec![item("b", 9)])).unwrap();
        assert_eq!(first.listing(), second.listing());
        assert_eq!(second.listing().items()[0].path, b"a");
        let other = Sharding {
            source: "h:1 other".into(),
            ..at(0)
        };
        assert!(other.read().unwrap_err().contains("remove it"));
        let four = Sharding {
            shard: Shard::new(0, 4).unwrap(),
            ..at(0)
        };
        assert!(four.read().unwrap_err().contains("2 shards, not 4"));
        // Nothing but the plan is left beside it.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}
