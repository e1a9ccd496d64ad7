//! Root-relative paths as they travel on the wire: raw Unix bytes, `/`-separated.
//!
//! Any valid Unix name is allowed (spaces, unicode, newlines, leading dashes, invalid
//! UTF-8); what is refused is anything that could leave the root: absolute paths, `..`,
//! empty or `.` components, NUL bytes, over-long names or paths.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Longest path accepted on the wire (bytes), as Linux's PATH_MAX.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest single name accepted (bytes), as Linux's NAME_MAX.
pub const MAX_NAME_LEN: usize = 255;

/// Why a path was refused. Variants carry the path (shown as lossy UTF-8) or its
/// length in bytes; the messages go to the user or the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Starts with `/`.
    #[error("absolute path {0:?} refused: remote paths are relative to the served root")]
    Absolute(String),
    /// Has a `..` component.
    #[error("path {0:?} refused: '..' would leave the root")]
    DotDot(String),
    /// Contains a NUL byte.
    #[error("path {0:?} refused: contains a NUL byte")]
    Nul(String),
    /// Has an empty or `.` component (a doubled or trailing slash) in the
    /// strict wire form, or [`RelPath::join_name`] was given an empty name or one with a `/`.
    #[error("path {0:?} refused: empty component")]
    EmptyComponent(String),
    /// Longer than [`MAX_PATH_LEN`] bytes; carries the length.
    #[error("path refused: {0} bytes is longer than {MAX_PATH_LEN}")]
    TooLong(usize),
    /// Has a component longer than [`MAX_NAME_LEN`] bytes.
    #[error("path {0:?} refused: a name is longer than {MAX_NAME_LEN} bytes")]
    NameTooLong(String),
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A validated relative path; the empty path means "the root itself".
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RelPath(Vec<u8>);

impl RelPath {
    /// The root itself.
    pub fn root() -> Self {
        RelPath(Vec::new())
    }

    /// Strict form used on the wire for manifest entries: no `.` components, no
    /// trailing or doubled slashes.
    pub fn from_wire(bytes: &[u8]) -> Result<Self, PathError> {
        if bytes.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong(bytes.len()));
        }
        if bytes.is_empty() {
            return Ok(RelPath::root());
        }
        if bytes.contains(&0) {
            return Err(PathError::Nul(show(bytes)));
        }
        if bytes[0] == b'/' {
            return Err(PathError::Absolute(show(bytes)));
        }
        for comp in bytes.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => return Err(PathError::EmptyComponent(show(bytes))),
                b".." => return Err(PathError::DotDot(show(bytes))),
                c if c.len() > MAX_NAME_LEN => return Err(PathError::NameTooLong(show(bytes))),
                _ => {}
            }
        }
        Ok(RelPath(bytes.to_vec()))
    }

    /// Lenient form used for what a user typed as a request: `.` components, doubled
    /// and trailing slashes are dropped; `..` and absolute paths are still refused.
    pub fn from_request(bytes: &[u8]) -> Result<Self, PathError> {
        if bytes.len() > MAX_PATH_LEN {
            return Err(PathError::TooLong(bytes.len()));
        }
        if bytes.contains(&0) {
            return Err(PathError::Nul(show(bytes)));
        }
        if bytes.first() == Some(&b'/') {
            return Err(PathError::Absolute(show(bytes)));
        }
        let mut out: Vec<&[u8]> = Vec::new();
        for comp in bytes.split(|&b| b == b'/') {
            match comp {
                b"" | b"." => {}
                b".." => return Err(PathError::DotDot(show(bytes))),
                c if c.len() > MAX_NAME_LEN => return Err(PathError::NameTooLong(show(bytes))),
                c => out.push(c),
            }
        }
        Ok(RelPath(out.join(&b'/')))
    }

    /// The raw bytes, as sent on the wire (empty for the root).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Is this the root itself (the empty path)?
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// As a relative `Path`; the root is `.` so it can be handed to cap-std.
    pub fn as_path(&self) -> &Path {
        if self.0.is_empty() {
            Path::new(".")
        } else {
            Path::new(OsStr::from_bytes(&self.0))
        }
    }

    /// An owned [`RelPath::as_path`]: `.` for the root.
    pub fn to_path_buf(&self) -> PathBuf {
        self.as_path().to_path_buf()
    }

    /// Last component (empty for the root).
    pub fn file_name(&self) -> &[u8] {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => &self.0[i + 1..],
            None => &self.0,
        }
    }

    /// Parent directory (the root for a single component; `None` for the root).
    pub fn parent(&self) -> Option<RelPath> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => RelPath(self.0[..i].to_vec()),
            None => RelPath::root(),
        })
    }

    /// `self/name`, where `name` is one component. Errors as `from_wire` would.
    pub fn join_name(&self, name: &[u8]) -> Result<RelPath, PathError> {
        let mut v = self.0.clone();
        if !v.is_empty() {
            v.push(b'/');
        }
        v.extend_from_slice(name);
        if name.contains(&b'/') || name.is_empty() {
            return Err(PathError::EmptyComponent(show(&v)));
        }
        RelPath::from_wire(&v)
    }

    /// `self/other` for a validated relative `other`.
    pub fn join(&self, other: &RelPath) -> Result<RelPath, PathError> {
        if other.is_root() {
            return Ok(self.clone());
        }
        if self.is_root() {
            return Ok(other.clone());
        }
        let mut v = self.0.clone();
        v.push(b'/');
        v.extend_from_slice(&other.0);
        RelPath::from_wire(&v)
    }

    /// For messages: lossy UTF-8, `.` for the root.
    pub fn display(&self) -> String {
        if self.0.is_empty() {
            ".".into()
        } else {
            show(&self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_paths_are_refused_precisely() {
        assert!(matches!(
            RelPath::from_wire(b"../../etc/passwd"),
            Err(PathError::DotDot(_))
        ));
        assert!(matches!(
            RelPath::from_request(b"a/../../etc"),
            Err(PathError::DotDot(_))
        ));
        assert!(matches!(
            RelPath::from_wire(b"/etc/passwd"),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            RelPath::from_request(b"/etc"),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            RelPath::from_wire(b"a\0b"),
            Err(PathError::Nul(_))
        ));
        assert!(matches!(
            RelPath::from_wire(b"a//b"),
            Err(PathError::EmptyComponent(_))
        ));
        assert!(matches!(
            RelPath::from_wire(b"a/./b"),
            Err(PathError::EmptyComponent(_))
        ));
        assert!(matches!(
            RelPath::from_wire(&[b'x'; 256]),
            Err(PathError::NameTooLong(_))
        ));
        assert!(matches!(
            RelPath::from_wire(&vec![b'x'; 5000]),
            Err(PathError::TooLong(5000))
        ));
        assert!(RelPath::root().join_name(b"..").is_err());
        assert!(RelPath::root().join_name(b"a/b").is_err());
    }

    #[test]
    fn tricky_but_valid_names_pass() {
        for name in [
            &b"-rf"[..],
            b"with space",
            b"new\nline",
            "\u{fc}nicode \u{1f600}".as_bytes(),
            b"\xff\xfe not utf8",
            b"...",
        ] {
            let p = RelPath::from_wire(name).unwrap();
            assert_eq!(p.as_bytes(), name);
            assert_eq!(p.file_name(), name);
        }
    }

    #[test]
    fn requests_are_normalised() {
        assert_eq!(
            RelPath::from_request(b"./a//b/").unwrap().as_bytes(),
            b"a/b"
        );
        assert!(RelPath::from_request(b".").unwrap().is_root());
        assert!(RelPath::from_request(b"").unwrap().is_root());
        let p = RelPath::from_wire(b"a/b/c").unwrap();
        assert_eq!(p.parent().unwrap().as_bytes(), b"a/b");
        assert_eq!(p.file_name(), b"c");
        assert_eq!(RelPath::root().join(&p).unwrap().as_bytes(), p.as_bytes());
    }
}
