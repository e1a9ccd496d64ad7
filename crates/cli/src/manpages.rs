//! Man pages and shell completions, made from the same clap definitions as
//! the command line itself (`longhaul man DIR`, `longhaul completions SHELL`).

use anyhow::{Context, Result};
use clap::CommandFactory;
use std::path::Path;

/// Writes `longhaul.1` and one page per subcommand, nested ones too
/// (`longhaul-get.1`, `longhaul-lab-run.1`, ...), into `dir`; their names.
pub(crate) fn write_all(dir: &Path) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = crate::args::Cli::command();
    cmd.build();
    let mut written = Vec::new();
    page(&cmd, "longhaul", dir, &mut written)?;
    Ok(written)
}

fn page(cmd: &clap::Command, name: &str, dir: &Path, written: &mut Vec<String>) -> Result<()> {
    // A subcommand's page is titled with its full name.
    let titled = cmd.clone().name(name.to_string());
    let file = format!("{name}.1");
    let mut out = Vec::new();
    clap_mangen::Man::new(titled).render(&mut out)?;
    std::fs::write(dir.join(&file), out).with_context(|| format!("writing {file}"))?;
    written.push(file);
    for sub in cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help" && !s.is_hide_set())
    {
        page(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

/// The completion script for `shell` on stdout.
pub(crate) fn completions(shell: clap_complete::Shell) {
    let mut cmd = crate::args::Cli::command();
    clap_complete::generate(shell, &mut cmd, "longhaul", &mut std::io::stdout());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_gets_a_page_that_shows_its_options() {
        let t = tempfile::tempdir().unwrap();
        let names = write_all(t.path()).unwrap();
        for want in [
            "longhaul.1",
            "longhaul-get.1",
            "longhaul-put.1",
            "longhaul-serve.1",
            "longhaul-lab-run.1",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        let get = std::fs::read_to_string(t.path().join("longhaul-get.1")).unwrap();
        assert!(get.starts_with(".ie") || get.contains(".TH"), "{get}");
        assert!(get.contains("longhaul\\-get"), "titled with its full name");
        assert!(
            get.contains("\\-\\-ssh\\-command"),
            "documents --ssh-command"
        );
    }

    #[test]
    fn completions_name_the_subcommands() {
        let mut cmd = crate::args::Cli::command();
        let mut out = Vec::new();
        clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, "longhaul", &mut out);
        let s = String::from_utf8(out).unwrap();
        for w in ["get", "put", "serve", "multicast", "--ssh"] {
            assert!(s.contains(w), "bash completion lacks {w}");
        }
    }
}
