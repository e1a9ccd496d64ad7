//! `--delete` removes what rsync's --delete removes (and keeps what an
//! --exclude protects), on a get and a put; `--dry-run` writes nothing and
//! lists, as `rsync -n -i` does, exactly what the real run then does.

use longhaul_testkit::*;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

/// The source tree.
fn source(src: &Path) {
    for d in ["a/b", "c", "fresh/deep"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for (i, f) in [
        "top.txt",
        "a/x",
        "a/b/y",
        "c/z",
        "fresh/deep/n",
        "scratch.tmp",
    ]
    .iter()
    .enumerate()
    {
        gen_file(&src.join(f), i as u64, 1000 + i as u64);
    }
    std::os::unix::fs::symlink("top.txt", src.join("link")).unwrap();
}

/// What a destination held before: part of the source as it was, files
/// changed since, and what the source no longer has.
fn stale(src: &Path, dst: &Path) {
    for d in ["a/b", "a/old/deeper", "gone/sub", "c"] {
        std::fs::create_dir_all(dst.join(d)).unwrap();
    }
    // The same file (size and mtime): skipped.
    rsync([
        OsString::from("-a"),
        src.join("a/x").into(),
        dst.join("a/x").into(),
    ]);
    // Another size; the same size and another mtime.
    gen_file(&dst.join("top.txt"), 50, 10);
    gen_file(&dst.join("c/z"), 51, 1003);
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    // (An hour off: rsync compares whole seconds, longhaul nanoseconds.)
    for f in ["c/z", "top.txt"] {
        std::fs::File::options()
            .write(true)
            .open(dst.join(f))
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }
    // Gone from the source.
    for (i, f) in [
        "a/extra",
        "a/old/deeper/f",
        "gone/sub/g",
        "gone/h",
        "a/b/y2",
        "note.tmp",
        "gone/sub/kept.tmp",
    ]
    .iter()
    .enumerate()
    {
        gen_file(&dst.join(f), 60 + i as u64, 10 + i as u64);
    }
    std::os::unix::fs::symlink("nowhere", dst.join("stale-link")).unwrap();
}

/// A copy of `from` at `to` (rsync -a).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    rsync([
        OsString::from("-a"),
        format!("{}/", from.display()).into(),
        format!("{}/", to.display()).into(),
    ]);
}

/// Each path beneath `p` with what it is: a file's BLAKE3, a link's
/// target, a directory (and with `times`, every mtime).
fn snapshot(p: &Path, times: bool) -> Vec<String> {
    let mut v: Vec<String> = list_tree(p)
        .into_iter()
        .map(|q| {
            let m = std::fs::symlink_metadata(&q).unwrap();
            let rel = q.strip_prefix(p).unwrap().display().to_string();
            let what = if m.is_dir() {
                "dir".to_string()
            } else if m.is_symlink() {
                format!("-> {}", std::fs::read_link(&q).unwrap().display())
            } else {
                blake3::hash(&std::fs::read(&q).unwrap())
                    .to_hex()
                    .to_string()
            };
            match times {
                true => {
                    use std::os::unix::fs::MetadataExt;
                    format!("{rel} {what} {}.{}", m.mtime(), m.mtime_nsec())
                }
                false => format!("{rel} {what}"),
            }
        })
        .collect();
    v.sort();
    v
}

/// The items of `rsync -i` output longhaul lists too: files sent, new
/// directories and links, deletions (not a directory's new mtime), with
/// the direction as `>`.
fn items(lines: impl IntoIterator<Item = (String, String)>) -> BTreeSet<(String, String)> {
    lines
        .into_iter()
        .map(|(item, path)| (item.replacen('<', ">", 1), path))
        .filter(|(item, _)| {
            item.starts_with(">f")
                || item.starts_with("cd+")
                || item.starts_with("cL+")
                || item.starts_with("*deleting")
        })
        .collect()
}

/// rsync's `-i` lines as (item, path).
fn rsync_items(out: &str) -> BTreeSet<(String, String)> {
    items(out.lines().filter_map(|l| {
        let (item, path) = l.split_once(' ')?;
        let path = path.trim_start();
        // (A new link's line names its target.)
        let path = path.split(" -> ").next().unwrap_or(path);
        Some((item.to_string(), path.to_string()))
    }))
}

/// longhaul's `changes` as (item, path), paths with `prefix` taken off.
fn longhaul_items(j: &serde_json::Value, prefix: &str) -> BTreeSet<(String, String)> {
    items(j["changes"].as_array().unwrap().iter().map(|c| {
        let path = c["path"].as_str().unwrap();
        (
            c["item"].as_str().unwrap().to_string(),
            path.strip_prefix(prefix).unwrap_or(path).to_string(),
        )
    }))
}

/// Paths of the files a report says `status`.
fn files_with(j: &serde_json::Value, status: &str, prefix: &str) -> BTreeSet<String> {
    j["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["status"] == status)
        .map(|f| {
            let p = f["path"].as_str().unwrap();
            p.strip_prefix(prefix).unwrap_or(p).to_string()
        })
        .collect()
}

/// A served `root/src` (the source) and `old` (what destinations held), a
/// server of `root` that takes puts, and a client.
fn setup(name: &str) -> (Tmp, Server, Client) {
    let t = Tmp::new(name);
    let root = t.join("root");
    source(&root.join("src"));
    stale(&root.join("src"), &t.join("old"));
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let c = Client::new(t.join("known_hosts"));
    (t, srv, c)
}

#[test]
fn delete_removes_what_rsync_removes_and_keeps_what_excludes_protect() {
    let (t, srv, c) = setup("mirror");
    let (root, src, old) = (t.join("root"), t.join("root/src"), t.join("old"));
    let rules = ["--exclude", "*.tmp"];

    // rsync's own mirror of the same tree.
    let want = t.join("want");
    copy_tree(&old, &want);
    let mut a: Vec<OsString> = vec!["-ai".into(), "--delete".into()];
    a.extend(rules.iter().map(OsString::from));
    a.extend([
        format!("{}/", src.display()).into(),
        format!("{}/", want.display()).into(),
    ]);
    let rsync_out = rsync(a);
    let rsync_deleted: BTreeSet<_> = rsync_items(&rsync_out)
        .into_iter()
        .filter(|(i, _)| i.starts_with('*'))
        .collect();
    assert!(rsync_deleted.len() >= 8, "{rsync_out}");
    // (The protected files stayed there.)
    assert!(want.join("note.tmp").exists() && want.join("gone/sub/kept.tmp").exists());

    // A get into a directory with a neighbour beside it (never touched).
    let got = t.join("parent/got");
    copy_tree(&old, &got);
    gen_file(&t.join("parent/outside"), 9, 9);
    let mut a: Vec<OsString> = vec!["--accept-new".into(), "--delete".into(), "--json".into()];
    a.extend(rules.iter().map(OsString::from));
    a.extend([srv.remote("src/"), got.clone().into()]);
    let out = c.run("get", a);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(snapshot(&got, false), snapshot(&want, false));
    assert!(t.join("parent/outside").exists());
    let deleted: BTreeSet<_> = longhaul_items(&j, "")
        .into_iter()
        .filter(|(i, _)| i.starts_with('*'))
        .collect();
    assert_eq!(deleted, rsync_deleted, "{j:#}");
    assert_eq!(j["totals"]["deleted"], rsync_deleted.len() as u64);

    // The human summary names each path removed.
    let got2 = t.join("got2");
    copy_tree(&old, &got2);
    let mut a: Vec<OsString> = vec!["--delete".into()];
    a.extend(rules.iter().map(OsString::from));
    a.extend([srv.remote("src/"), got2.clone().into()]);
    let out = c.run("get", a);
    out.expect_code(0);
    assert!(
        out.stdout.contains("deleting gone/sub/g\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("deleting a/old/\n"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains(&format!("{} path(s) deleted", rsync_deleted.len())),
        "{}",
        out.stdout
    );

    // A put mirrors into the server's tree the same way.
    copy_tree(&old, &root.join("up"));
    let mut a: Vec<OsString> = vec!["--delete".into(), "--json".into()];
    a.extend(rules.iter().map(OsString::from));
    a.extend([format!("{}/", src.display()).into(), srv.remote("up/")]);
    let out = c.run("put", a);
    out.expect_code(0);
    assert_eq!(snapshot(&root.join("up"), false), snapshot(&want, false));
    let deleted: BTreeSet<_> = longhaul_items(&out.json(), "up/")
        .into_iter()
        .filter(|(i, _)| i.starts_with('*'))
        .collect();
    assert_eq!(deleted, rsync_deleted);

    // Without --delete nothing goes.
    let kept = t.join("kept");
    copy_tree(&old, &kept);
    c.run("get", [srv.remote("src/"), kept.clone().into()])
        .expect_code(0);
    assert!(kept.join("gone/h").exists() && kept.join("a/extra").exists());
}

#[test]
fn dry_run_writes_nothing_and_lists_what_the_real_run_then_does() {
    let (t, srv, c) = setup("dryrun");
    let (root, src, old) = (t.join("root"), t.join("root/src"), t.join("old"));
    let rules = ["--delete", "--exclude", "*.tmp"];

    // What rsync -n -i lists for the same run.
    let mut a: Vec<OsString> = vec!["-ani".into()];
    a.extend(rules.iter().map(OsString::from));
    a.extend([
        format!("{}/", src.display()).into(),
        format!("{}/", old.display()).into(),
    ]);
    let mut want = rsync_items(&rsync(a));
    // rsync -n also lists gone/sub/, which its real run keeps (an excluded
    // file in it is protected: "cannot delete non-empty directory");
    // longhaul lists only what the real run then does.
    assert!(want.remove(&("*deleting".to_string(), "gone/sub/".to_string())));
    assert!(want.iter().any(|(i, _)| i == ">f+++++++++"), "{want:?}");
    assert!(want.iter().any(|(i, _)| i == ">f..t......"), "{want:?}");
    assert!(want.iter().any(|(i, _)| i == "cd+++++++++"), "{want:?}");

    for op in ["get", "put"] {
        let dst = t.join(format!("dst-{op}"));
        let (target, prefix) = match op {
            "get" => (dst.clone(), String::new()),
            _ => (root.join("up"), "up/".to_string()),
        };
        copy_tree(&old, &target);
        let before = snapshot(&target, true);
        let run = |dry: bool| {
            let mut a: Vec<OsString> = vec!["--accept-new".into(), "--json".into()];
            if dry {
                a.push("--dry-run".into());
            }
            a.extend(rules.iter().map(OsString::from));
            match op {
                "get" => a.extend([srv.remote("src/"), dst.clone().into()]),
                _ => a.extend([format!("{}/", src.display()).into(), srv.remote("up/")]),
            }
            let out = c.run(op, a);
            out.expect_code(0);
            out.json()
        };
        let dry = run(true);
        assert_eq!(dry["dry_run"], true);
        assert_eq!(snapshot(&target, true), before, "{op} --dry-run wrote");
        assert_eq!(dry["totals"]["bytes_transferred"], 0, "{dry:#}");
        let listed = longhaul_items(&dry, &prefix);
        assert_eq!(listed, want, "{op}: {dry:#}");

        // The real run does what the dry run listed: it sends those files
        // (and skips the rest), removes those paths.
        let real = run(false);
        let sent: BTreeSet<String> = listed
            .iter()
            .filter(|(i, _)| i.starts_with(">f"))
            .map(|(_, p)| p.clone())
            .collect();
        assert_eq!(files_with(&real, "verified", &prefix), sent, "{real:#}");
        assert_eq!(
            files_with(&dry, "would_send", &prefix),
            sent,
            "{op}: {dry:#}"
        );
        assert_eq!(
            files_with(&real, "skipped", &prefix),
            files_with(&dry, "skipped", &prefix)
        );
        let removed = |j: &serde_json::Value| -> BTreeSet<String> {
            longhaul_items(j, &prefix)
                .into_iter()
                .filter(|(i, _)| i.starts_with('*'))
                .map(|(_, p)| p)
                .collect()
        };
        assert_eq!(removed(&real), removed(&dry));
        assert!(!removed(&dry).is_empty());
    }

    // Into a destination whose parents are missing: nothing is created.
    let absent = t.join("no/such/dir");
    let out = c.run(
        "get",
        [
            OsString::from("-n"),
            srv.remote("src"),
            absent.clone().into(),
        ],
    );
    out.expect_code(0);
    assert!(!t.join("no").exists());
    assert!(
        out.stdout.contains("cd+++++++++ no/such/dir/src/a/b/\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("nothing was written"), "{}", out.stdout);
}
