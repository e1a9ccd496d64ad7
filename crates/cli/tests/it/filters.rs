//! `--exclude`, `--include` and `--exclude-from` leave out what rsync's own
//! rules leave out: each rule set runs through rsync and through longhaul
//! (a get of a directory's contents, a get of the directory by name, a put)
//! and the trees that arrive are compared.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;

/// A tree with something for every kind of rule.
fn tree(src: &Path) {
    for d in ["keep/deep", "cache", "a/cache", "logs", "build/x"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    for (i, f) in [
        "top.txt",
        "a.tmp",
        "keep/b.tmp",
        "keep/deep/c.txt",
        "keep/deep/d.tmp",
        "cache/e",
        "a/cache/f",
        "logs/keep.log",
        "logs/old.log",
        "build/x/y.o",
        "a/g.o",
        "file7",
        "filex",
    ]
    .iter()
    .enumerate()
    {
        gen_file(&src.join(f), i as u64, 100 + i as u64);
    }
    std::os::unix::fs::symlink("top.txt", src.join("link.tmp")).unwrap();
}

/// The tree beneath `p` as sorted relative paths (directories with a `/`).
fn listing(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = list_tree(p)
        .into_iter()
        .map(|q| {
            let dir = std::fs::symlink_metadata(p.join(&q)).unwrap().is_dir();
            let rel = q.strip_prefix(p).unwrap_or(&q).display().to_string();
            format!("{rel}{}", if dir { "/" } else { "" })
        })
        .collect();
    v.sort();
    v
}

#[test]
fn filters_leave_out_what_rsync_leaves_out_on_a_get_and_a_put() {
    let t = Tmp::new("filters");
    let root = t.join("root");
    tree(&root.join("src"));
    let rules_file = t.join("rules");
    std::fs::write(&rules_file, "# build output\n*.o\n+ keep.log\n- *.log\n\n").unwrap();
    let srv = ServeCfg::new(&root, &t.join("state")).writable().start();
    let c = Client::new(t.join("known_hosts"));
    let sets: Vec<Vec<&str>> = vec![
        vec!["--exclude", "*.tmp"],
        vec!["--include", "keep/***", "--exclude", "*.tmp"],
        vec!["--exclude", "cache/", "--exclude", "/top.txt"],
        vec!["--exclude", "/src/top.txt", "--exclude", "deep"],
        vec!["--exclude", "file[0-9]", "--exclude", "a/**/f"],
        vec![
            "--exclude-from",
            rules_file.to_str().unwrap(),
            "--exclude",
            "build",
        ],
    ];
    for (n, set) in sets.iter().enumerate() {
        let args: Vec<OsString> = set.iter().map(OsString::from).collect();
        // The directory's contents, and the directory by name (a pattern
        // anchored with /src/ means something only then).
        for spec in ["src/", "src"] {
            let src_arg = format!("{}/{spec}", root.display());
            let tag = format!("{n}-{}", spec.len());
            let want = t.join(format!("rsync-{tag}"));
            std::fs::create_dir_all(&want).unwrap();
            let mut a = vec![OsString::from("-a")];
            a.extend(args.iter().cloned());
            a.extend([
                OsString::from(&src_arg),
                format!("{}/", want.display()).into(),
            ]);
            rsync(a);
            let got = t.join(format!("get-{tag}"));
            std::fs::create_dir_all(&got).unwrap();
            let mut a = vec![OsString::from("--accept-new")];
            a.extend(args.iter().cloned());
            a.extend([remote(srv.port, spec), got.clone().into()]);
            c.run("get", a).expect_code(0);
            assert_eq!(listing(&got), listing(&want), "get {spec} {set:?}");
            let up = format!("up-{tag}");
            let mut a = args.clone();
            a.extend([OsString::from(&src_arg), remote(srv.port, format!("{up}/"))]);
            c.run("put", a).expect_code(0);
            assert_eq!(
                listing(&root.join(&up)),
                listing(&want),
                "put {spec} {set:?}"
            );
        }
    }
    // A rule longhaul cannot read is refused before anything moves.
    let out = c.run(
        "get",
        [
            OsString::from("--exclude"),
            "//".into(),
            remote(srv.port, "src/"),
            t.join("refused").into(),
        ],
    );
    out.expect_code(2);
    assert!(out.stderr.contains("slashes only"), "{}", out.stderr);
    assert!(!t.join("refused").exists());
}
