//! sshd for the `--ssh` tests: keys and a key-only configuration in a
//! directory, the ssh options that log in with them, and the one-shot
//! servers `--ssh` leaves (or must not leave) behind.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Makes `dir/hostkey` (sshd's), `dir/id` (the client's) and
/// `dir/authorized_keys` (trusting `id`).
pub fn keys(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for k in ["hostkey", "id"] {
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(k))
            .status()
            .unwrap();
        assert!(st.success(), "ssh-keygen failed");
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
}

/// Writes `dir/sshd_config` for the keys of [`keys`]: key-only, root may log
/// in, and `extra` (lines: Port, ListenAddress, PidFile, ...); makes the
/// privilege separation directory sshd wants. Its path.
pub fn config(dir: &Path, extra: &str) -> PathBuf {
    let f = dir.join("sshd_config");
    std::fs::write(
        &f,
        format!(
            "HostKey {d}/hostkey\nAuthorizedKeysFile {d}/authorized_keys\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n{extra}",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    f
}

/// ssh's options to log in with `dir/id`: no prompts, no host key kept.
pub fn options(dir: &Path) -> String {
    format!(
        "-i {} -o BatchMode=yes -o StrictHostKeyChecking=no \
         -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        dir.join("id").display()
    )
}

/// PIDs of `longhaul serve --once` processes (the far side of `--ssh`).
pub fn once_servers() -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmd.windows(13).any(|w| w == b"serve\0--once\0") {
            v.push(pid);
        }
    }
    v
}
