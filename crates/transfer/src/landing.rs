//! Where received entries land: one set of rules (rsync's) for every receiver.
//!
//! - A requested root named with a trailing `/` (or `.`) puts its *contents*
//!   into the destination; otherwise it lands under its own name
//!   ([`root_name`]).
//! - The destination is a directory when it already is one, when it was
//!   named with a trailing `/`, or when several roots go into it; otherwise a
//!   single file root is saved under the destination's own name.
//!
//! [`Landing::target`] turns a sender's (root, root-relative path) into the
//! path beneath the receiver's base; [`Landing::is_fresh`] tells whether none
//! of the targets exists yet (the receiver then wants every file whole).

use crate::sibling::{sibling_name, JOURNAL, PART};
use crate::{EntryKind, RelPath};
use cap_std::fs::Dir;

/// The name a requested root takes at the destination: empty when its
/// contents go straight in (a trailing `/`, `.`, `/`), else its last
/// component.
pub fn root_name(request: &[u8]) -> Vec<u8> {
    if request.ends_with(b"/") {
        return Vec::new();
    }
    RelPath::from_request(request)
        .map(|p| p.file_name().to_vec())
        .unwrap_or_default()
}

/// The same rule for a local path a sender was given (`put PATH...`,
/// `multicast send PATH...`): empty when its contents go (a trailing `/`,
/// or a last component `.` or `..`, or `/` itself), else its last component.
/// Unlike a request, a local path may be absolute or climb with `..`.
pub fn local_root_name(path: &std::path::Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    use std::path::Component;
    let bytes = path.as_os_str().as_bytes();
    // `Path::components` drops a trailing `.` ("obs/." is [obs]); rsync reads it as the contents.
    if bytes.ends_with(b"/") || bytes.ends_with(b"/.") || bytes == b"." {
        return Vec::new();
    }
    match path.components().next_back() {
        Some(Component::Normal(n)) => n.as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

/// Whether the destination is (or must become) a directory: it is one
/// already, it was named with a trailing `/`, or several roots go into it.
pub fn dest_is_dir(exists_as_dir: bool, named_with_slash: bool, roots: usize) -> bool {
    exists_as_dir || named_with_slash || roots > 1
}

/// Where the entries of one session land, beneath the receiver's base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landing {
    /// Path of the destination inside the base (the root: the base itself).
    pub prefix: RelPath,
    /// The destination is (or must be) a directory: roots go inside it.
    pub dest_is_dir: bool,
    /// Per requested root, its [`root_name`] (empty: contents go straight in).
    pub roots: Vec<Vec<u8>>,
}

impl Landing {
    /// Where an entry of `root` (whose own kind is `root_kind`) at `path`
    /// (relative to that root) lands; an error names what the sender did
    /// wrong.
    pub fn target(
        &self,
        root: u32,
        root_kind: EntryKind,
        path: &RelPath,
    ) -> Result<RelPath, String> {
        let name = self
            .roots
            .get(root as usize)
            .ok_or_else(|| format!("entry for unknown root {root}"))?;
        if self.roots.len() == 1 && root_kind != EntryKind::Dir && !self.dest_is_dir {
            if !path.is_root() || self.prefix.is_root() {
                return Err("a single file source cannot have children".into());
            }
            return Ok(self.prefix.clone());
        }
        let base = if name.is_empty() {
            self.prefix.clone()
        } else {
            self.prefix.join_name(name).map_err(|e| e.to_string())?
        };
        base.join(path).map_err(|e| e.to_string())
    }

    /// Whether none of the targets this session can create is beneath
    /// `base` yet, nor a part or journal an earlier run left beside one:
    /// every file will be wanted whole, so the receiver can say so and save
    /// the sender a round trip per file. A target that is an empty directory
    /// counts as absent. Any doubt (an error, two roots landing on the same
    /// name) says no.
    pub fn is_fresh(&self, base: &Dir) -> bool {
        let mut targets: Vec<RelPath> = Vec::new();
        for name in &self.roots {
            let t = if name.is_empty() {
                Ok(self.prefix.clone())
            } else {
                self.prefix.join_name(name)
            };
            match t {
                Ok(t) if !targets.contains(&t) => targets.push(t),
                _ => return false,
            }
        }
        // A single file root lands on the destination itself.
        if self.roots.len() == 1 && !self.dest_is_dir && !targets.contains(&self.prefix) {
            targets.push(self.prefix.clone());
        }
        targets.iter().all(|t| absent_or_empty(base, t))
    }
}

fn absent_or_empty(base: &Dir, t: &RelPath) -> bool {
    use std::io::ErrorKind::NotFound;
    let empty_dir = |d: std::io::Result<Dir>| {
        d.and_then(|d| d.entries().map(|mut e| e.next().is_none()))
            .unwrap_or(false)
    };
    if t.is_root() {
        return empty_dir(base.try_clone());
    }
    match base.symlink_metadata(t.as_path()) {
        Ok(m) if m.is_dir() => empty_dir(base.open_dir(t.as_path())),
        Ok(_) => false,
        Err(e) if e.kind() == NotFound => {
            let Some(parent) = t.parent() else {
                return false;
            };
            [PART, JOURNAL].iter().all(|suffix| {
                let sib = parent
                    .join_name(&sibling_name(t.file_name(), suffix))
                    .map(|p| base.symlink_metadata(p.as_path()));
                matches!(sib, Ok(Err(e)) if e.kind() == NotFound)
            })
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(s: &str) -> RelPath {
        RelPath::from_wire(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_local_path_names_its_root_by_its_last_component_unless_it_means_contents() {
        use std::path::Path;
        let name = |p: &str| String::from_utf8(local_root_name(Path::new(p))).unwrap();
        assert_eq!(name("obs"), "obs");
        assert_eq!(name("./data/obs"), "obs");
        assert_eq!(name("/abs/obs"), "obs");
        assert_eq!(name("../obs"), "obs");
        assert_eq!(name("file.bin"), "file.bin");
        for contents in [
            "obs/", "obs//", "obs/.", ".", "./", "..", "../", "obs/..", "/",
        ] {
            assert_eq!(name(contents), "", "{contents:?} sends its contents");
        }
    }

    #[test]
    fn root_names_follow_rsync() {
        assert_eq!(root_name(b"run42"), b"run42");
        assert_eq!(root_name(b"a/b/run42"), b"run42");
        assert_eq!(root_name(b"run42/"), b"");
        assert_eq!(root_name(b"."), b"");
        assert!(dest_is_dir(false, false, 2));
        assert!(dest_is_dir(false, true, 1));
        assert!(!dest_is_dir(false, false, 1));
    }

    #[test]
    fn targets() {
        let l = Landing {
            prefix: rel("in"),
            dest_is_dir: true,
            roots: vec![b"run".to_vec(), Vec::new()],
        };
        assert_eq!(
            l.target(0, EntryKind::Dir, &rel("a/b")).unwrap(),
            rel("in/run/a/b")
        );
        assert_eq!(l.target(1, EntryKind::Dir, &rel("c")).unwrap(), rel("in/c"));
        assert_eq!(
            l.target(2, EntryKind::Dir, &rel("c")).unwrap_err(),
            "entry for unknown root 2"
        );
        // One file root to a name that is not a directory: that name.
        let one = Landing {
            prefix: rel("out.bin"),
            dest_is_dir: false,
            roots: vec![b"x.bin".to_vec()],
        };
        assert_eq!(
            one.target(0, EntryKind::File, &RelPath::root()).unwrap(),
            rel("out.bin")
        );
        assert_eq!(
            one.target(0, EntryKind::File, &rel("child")).unwrap_err(),
            "a single file source cannot have children"
        );
    }

    #[test]
    fn freshness() {
        let t = tempfile::tempdir().unwrap();
        let base = Dir::open_ambient_dir(t.path(), cap_std::ambient_authority()).unwrap();
        let l = Landing {
            prefix: RelPath::root(),
            dest_is_dir: true,
            roots: vec![b"run".to_vec()],
        };
        assert!(l.is_fresh(&base));
        std::fs::create_dir(t.path().join("run")).unwrap();
        assert!(l.is_fresh(&base), "an empty directory counts as absent");
        std::fs::write(t.path().join("run/x"), b"1").unwrap();
        assert!(!l.is_fresh(&base));
        std::fs::write(t.path().join(".other.lh-part"), b"").unwrap();
        let other = Landing {
            roots: vec![b"other".to_vec()],
            ..l.clone()
        };
        assert!(!other.is_fresh(&base), "a part an earlier run left");
        let twice = Landing {
            roots: vec![b"a".to_vec(), b"a".to_vec()],
            ..l
        };
        assert!(!twice.is_fresh(&base), "two roots on one name");
    }
}
