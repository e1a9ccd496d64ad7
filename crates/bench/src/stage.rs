//! Where the tools meet the run's files. The peers' daemons do not all run
//! as root (GridFTP's and vsftpd's servers read and write as the `ftp`
//! user), and some take paths through URLs or shell command lines. An
//! output directory made by `mktemp -d` (mode 0700), one under `/root`, or
//! one whose path has spaces would fail them with a bare protocol reply
//! ("550 End."). So the run's data, work and run directories, made in
//! `--out` with mode 0755, are bind-mounted at `/run/longhaul-lab/LAB/`: a
//! path every user can enter, with no spaces, on the same file system as
//! `--out` (the disk a suite writes to stays the one the user chose).
//! Reports and results are written to `--out` itself.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directories the tools use, each a bind mount of its namesake in `--out`.
pub(crate) const STAGED: [&str; 3] = ["data", "work", "runs"];

/// Where the staged directories of lab `lab` are mounted.
pub(crate) fn root_of(lab: &str) -> PathBuf {
    Path::new("/run/longhaul-lab").join(lab)
}

/// Stages `out`'s tool-facing directories for lab `lab`; returns the root
/// the tools are given. Undone by [`unstage`]; the caller records
/// [`root_of`] in `live` first, so Ctrl-C undoes it even half made.
pub(crate) fn stage(lab: &str, out: &Path) -> Result<PathBuf> {
    let root = root_of(lab);
    if root.parent() != Some(Path::new("/run/longhaul-lab")) || lab.starts_with('.') {
        bail!("lab name {lab:?}: not a plain name");
    }
    // Left by a run that was killed before it could clean up.
    unstage(&root);
    for dir in [root.parent().expect("a parent"), &root] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    for sub in STAGED {
        let real = out.join(sub);
        std::fs::create_dir_all(&real).with_context(|| format!("creating {}", real.display()))?;
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} readable to the tools", real.display()))?;
        let at = root.join(sub);
        std::fs::create_dir_all(&at)?;
        mount(&["--bind"], &real, &at)?;
        // Mounts made beneath it (the receivers' tmpfs) stay there, and do
        // not show up in --out as well.
        mount(&["--make-private"], Path::new(""), &at)?;
    }
    if let Ok(who) = crate::tools::ftp_uid() {
        for sub in STAGED {
            if let Some(blocked) = closed_to(&root.join(sub), who) {
                bail!(
                    "the peers' servers that run as user ftp (uid {who}) cannot enter {}: {blocked}",
                    root.join(sub).display()
                );
            }
        }
    }
    Ok(root)
}

/// `mount FLAGS [FROM] AT` (FROM left out when empty).
pub(crate) fn mount(flags: &[&str], from: &Path, at: &Path) -> Result<()> {
    let mut cmd = Command::new("mount");
    cmd.args(flags);
    if !from.as_os_str().is_empty() {
        cmd.arg(from);
    }
    let st = cmd.arg(at).status().context("running mount")?;
    if !st.success() {
        bail!(
            "mount {} {} {} failed",
            flags.join(" "),
            from.display(),
            at.display()
        );
    }
    Ok(())
}

/// Unmounts what is mounted at `dir`; whether that worked.
pub(crate) fn unmount(dir: &Path) -> bool {
    Command::new("umount")
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

/// Unmounts and removes a staged root (anything beneath a staged directory,
/// such as a tmpfs, first). Quiet: used on the way out.
pub(crate) fn unstage(root: &Path) {
    if !root.exists() {
        return;
    }
    for sub in STAGED {
        let at = root.join(sub);
        // A tmpfs may sit on the bind mount: unmount until nothing is (a
        // busy one detached at once; the kernel lets go when it is free).
        for _ in 0..8 {
            if !is_mount_point(&at) {
                break;
            }
            if !unmount(&at) {
                let _ = Command::new("umount").arg("-l").arg(&at).status();
            }
        }
        let _ = std::fs::remove_dir(&at);
    }
    let _ = std::fs::remove_dir(root);
}

/// Whether /proc/self/mountinfo names `dir` as a mount point (a bind mount
/// of the same file system is one too). `dir` is a path as the kernel
/// writes it: absolute, without `.` or `..`.
fn is_mount_point(dir: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape(m) == want)
}

/// mountinfo writes a space, tab, newline and backslash as octal escapes.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Why user `uid` (in its own group only) cannot enter `dir`: the first
/// directory on the way that does not let it, with its owner and mode;
/// None when it can.
pub(crate) fn closed_to(dir: &Path, uid: u32) -> Option<String> {
    let mut at = PathBuf::from("/");
    let mut steps: Vec<PathBuf> = vec![at.clone()];
    for c in dir.components().skip(1) {
        at.push(c);
        steps.push(at.clone());
    }
    for s in steps {
        let m = match std::fs::metadata(&s) {
            Ok(m) => m,
            Err(e) => return Some(format!("{}: {e}", s.display())),
        };
        let mode = m.mode();
        let can = if m.uid() == uid {
            mode & 0o100 != 0
        } else {
            mode & 0o001 != 0
        };
        if !can {
            return Some(format!(
                "{} (owner uid {}, mode {:04o}) does not let others in",
                s.display(),
                m.uid(),
                mode & 0o7777
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_directory_on_the_way_is_named_with_its_mode() {
        let t = tempfile::tempdir().unwrap();
        let inner = t.path().join("a b/c");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = 65534;
        let why = closed_to(&inner, nobody).expect("closed");
        assert!(
            why.starts_with(&format!("{} (owner uid", t.path().display()))
                && why.ends_with("mode 0700) does not let others in"),
            "{why}"
        );
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        // /tmp and the like are open; the tempdir is now enterable.
        assert_eq!(closed_to(&inner, nobody), None);
        // Its owner may enter it whatever others may.
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let me = std::fs::metadata(t.path()).unwrap().uid();
        assert_eq!(closed_to(t.path(), me), None);
    }

    #[test]
    fn mountinfo_escapes_are_read_back() {
        assert_eq!(unescape("/tmp/a\\040b\\134c"), "/tmp/a b\\c");
    }
}
