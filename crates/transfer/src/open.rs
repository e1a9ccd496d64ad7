//! Opening a file beneath a directory handle to read it, never through a
//! symlink at its end: how a sender reads its files, a receiver its parts
//! and journals, and [`crate::meta`] an item's attributes.

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use std::fs::File;
use std::io;
use std::path::Path;

/// Opens `path` beneath `dir` for reading, never following a symlink at its end.
pub fn open_read(dir: &Dir, path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).follow(FollowSymlinks::No);
    Ok(dir.open_with(path, &o)?.into_std())
}
