//! `get --shard K/N`: shards of one transfer, run one after another, at
//! once, and one killed and rerun, each land the same tree as one get,
//! with every byte sent once.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

/// A tree of many small files (some empty), one large file and one of a
/// few chunks; its total bytes.
fn tree(root: &Path) -> u64 {
    let mut total = 0;
    for i in 0..120u64 {
        let dir = root.join(format!("d{}", i % 7));
        std::fs::create_dir_all(&dir).unwrap();
        let len = (i * 7919) % 150_000;
        gen_file(&dir.join(format!("f{i:03}")), i, len);
        total += len;
    }
    gen_file(&root.join("big.bin"), 500, 40 * MIB + 123);
    gen_file(&root.join("d3/mid.bin"), 501, 5 * MIB + 7);
    set_mode(&root.join("big.bin"), 0o640);
    // Hard links: made by `--shard finish`, which holds every file.
    std::fs::hard_link(root.join("d3/mid.bin"), root.join("d5/mid-link")).unwrap();
    std::fs::hard_link(root.join("d1/f001"), root.join("d6/f001-link")).unwrap();
    total + 45 * MIB + 130
}

fn shard_args(srv: &Server, dest: &Path, shard: &str, extra: &[&str]) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["--accept-new".into(), "--json".into()];
    a.extend(extra.iter().map(OsString::from));
    a.extend([
        "--shard".into(),
        shard.into(),
        srv.remote("data/"),
        dest.into(),
    ]);
    a
}

/// Names, bytes, modes and times, but not DEST's own, which a receiver
/// leaves as it was.
const FILES_AND_DIRS: Compare = Compare {
    top_meta: false,
    ..Compare::ALL
};

/// longhaul's own files in `dest`: parts, journals, plans.
fn ours(dest: &Path) -> Vec<std::path::PathBuf> {
    list_tree(dest)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".lh-"))
        .collect()
}

/// Only the files of the tree and the plan are left: no part, no journal.
fn only_the_plan_left(dest: &Path) {
    assert_eq!(ours(dest), [dest.join(".longhaul.lh-plan")]);
}

/// `--shard finish`: every file checked by BLAKE3 and none sent again, the
/// plan removed, and the tree as the source's, modes and times too.
/// `late`: bytes of files the shards' plan did not list, which it sends.
fn finish(c: &Client, srv: &Server, data: &Path, dest: &Path, late: u64) {
    let out = c.run("get", shard_args(srv, dest, "finish", &[]));
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "bytes_transferred"), late, "{j:#}");
    let checked = totals(&j, "skipped") + totals(&j, "verified");
    assert_eq!(checked, totals(&j, "files"), "{j:#}");
    assert_same_tree(data, dest, FILES_AND_DIRS);
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &str| {
        std::fs::metadata(dest.join(p))
            .map(|m| m.ino())
            .unwrap_or(0)
    };
    assert_eq!(ino("d3/mid.bin"), ino("d5/mid-link"), "hard links kept");
    assert_eq!(ours(dest), Vec::<std::path::PathBuf>::new());
}

#[test]
fn shards_in_turn_and_at_once_land_the_tree_with_every_byte_sent_once() {
    let t = Tmp::new("shards");
    let root = t.join("root");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut total = tree(&data);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));

    // Three shards, one after another.
    let dest = t.join("three");
    std::fs::create_dir(&dest).unwrap();
    let mut sent = 0;
    for k in 1..=3 {
        let out = c.run("get", shard_args(&srv, &dest, &format!("{k}/3"), &[]));
        out.expect_code(0);
        let j = out.json();
        sent += totals(&j, "bytes_transferred");
        // Each moves about a third: within a chunk, or a small file.
        let mine = totals(&j, "bytes_transferred");
        assert!(
            mine.abs_diff(total / 3) <= MIB,
            "shard {k}: {mine} of {total}"
        );
        let big = dest.join("big.bin");
        // The large file is split: named only once the last of its shards is done.
        assert_eq!(big.exists(), k == 3, "after shard {k}");
        // Shards that found the plan asked the server for their files only:
        // it walked nothing, and a file the source gained after the plan
        // is not theirs (the finish brings it).
        match k {
            1 => {
                assert!(totals(&j, "other_shards") > 0, "{j:#}");
                std::fs::write(data.join("late.txt"), b"after the plan\n").unwrap();
                total += 15;
            }
            _ => assert_eq!(totals(&j, "other_shards"), 0, "{j:#}"),
        }
        if k < 3 {
            assert!(totals(&j, "slices") >= 1, "{j:#}");
        }
    }
    assert_eq!(sent + 15, total, "every byte of the plan once");
    only_the_plan_left(&dest);
    // A rerun of a shard whose part is placed moves nothing.
    let out = c.run("get", shard_args(&srv, &dest, "2/3", &[]));
    out.expect_code(0);
    assert_eq!(totals(&out.json(), "bytes_transferred"), 0);
    finish(&c, &srv, &data, &dest, 15);
    std::fs::remove_file(data.join("late.txt")).unwrap();
    total -= 15;

    // Four at once, with `auto` as a launcher would give it.
    let dest = t.join("four");
    std::fs::create_dir(&dest).unwrap();
    let runs: Vec<_> = (1..=4)
        .map(|k| {
            let mut cmd = c.cmd("get", shard_args(&srv, &dest, "auto", &[]));
            cmd.env("SLURM_ARRAY_TASK_ID", (k - 1).to_string())
                .env("SLURM_ARRAY_TASK_COUNT", "4");
            std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(120)))
        })
        .collect();
    let mut sent = 0;
    for r in runs {
        let out = r.join().unwrap();
        out.expect_code(0);
        sent += totals(&out.json(), "bytes_transferred");
    }
    assert_eq!(sent, total, "every byte once");
    only_the_plan_left(&dest);
    finish(&c, &srv, &data, &dest, 0);
}

#[test]
fn a_killed_shard_reruns_alone_and_fetches_only_what_it_lacks() {
    let t = Tmp::new("shard-kill");
    let root = t.join("root");
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    gen_file(&data.join("big.bin"), 7, 64 * MIB);
    gen_file(&data.join("small"), 8, 1000);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();

    // Shard 1 of 2, slowed, killed once it has journaled some chunks.
    let cmd = c.cmd(
        "get",
        shard_args(
            &srv,
            &dest,
            "1/2",
            &["--max-rate", "100M", "--retry-for", "0"],
        ),
    );
    let mut child = longhaul_child(cmd);
    let journal = dest.join(".big.bin.lh-slice-1-2");
    let started = Instant::now();
    while journal_len(&journal) < 28 + 4 * 44 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no chunk journaled"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!dest.join("big.bin").exists());

    // Shard 2 does its part; the file waits for shard 1.
    let out = c.run("get", shard_args(&srv, &dest, "2/2", &[]));
    out.expect_code(0);
    let two = totals(&out.json(), "bytes_transferred");
    assert!(!dest.join("big.bin").exists());

    // Shard 1 again, alone: it resumes its slice and names the file.
    let out = c.run("get", shard_args(&srv, &dest, "1/2", &[]));
    out.expect_code(0);
    let j = out.json();
    let one = totals(&j, "bytes_transferred");
    assert!(totals(&j, "bytes_resumed") >= 2 * MIB, "{j:#}");
    assert!(
        one + two < 64 * MIB + 1000,
        "nothing of shard 2's sent again: {one} + {two}"
    );
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&data.join("big.bin"))
    );
    only_the_plan_left(&dest);
    finish(&c, &srv, &data, &dest, 0);
}

#[test]
fn one_large_file_fetched_as_a_root_is_split_between_shards() {
    let t = Tmp::new("shard-one-file");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("one.bin"), 3, 20 * MIB + 1);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let mut sent = 0;
    for k in ["1/2", "2/2"] {
        let args: Vec<OsString> = vec![
            "--accept-new".into(),
            "--json".into(),
            "--shard".into(),
            k.into(),
            srv.remote("one.bin"),
            dest.clone().into(),
        ];
        let out = c.run("get", args);
        out.expect_code(0);
        let mine = totals(&out.json(), "bytes_transferred");
        assert!(mine.abs_diff(10 * MIB) <= MIB, "{k}: {mine}");
        sent += mine;
    }
    assert_eq!(sent, 20 * MIB + 1);
    assert_eq!(
        hash_file(&dest.join("one.bin")),
        hash_file(&root.join("one.bin"))
    );
}

#[test]
fn a_file_the_source_lost_since_the_plan_is_reported_by_its_shard() {
    let t = Tmp::new("shard-lost");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("data")).unwrap();
    gen_file(&root.join("data/a"), 1, 5000);
    gen_file(&root.join("data/z"), 2, 5000);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    c.run("get", shard_args(&srv, &dest, "1/2", &[]))
        .expect_code(0);
    // `z` is shard 2's; it goes before shard 2 runs.
    std::fs::remove_file(root.join("data/z")).unwrap();
    let out = c.run("get", shard_args(&srv, &dest, "2/2", &[]));
    out.expect_code(24);
    let j = out.json();
    let z = &files_by_path(&j)["z"];
    assert_eq!(z["status"], "failed", "{j:#}");
    assert!(
        z["error"]
            .as_str()
            .unwrap()
            .contains("gone since the shard plan listed it"),
        "{j:#}"
    );
}

#[test]
fn a_shard_says_what_is_wrong_with_its_flags_and_its_plan() {
    let t = Tmp::new("shard-flags");
    let root = t.join("root");
    std::fs::create_dir_all(root.join("data")).unwrap();
    gen_file(&root.join("data/a"), 1, 10);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--shard", "0/2"], "K counts from 1"),
        (&["--shard", "3/2"], "shard 3 of 2 does not exist"),
        (
            &["--shard", "1/2", "--delete"],
            "--shard and --delete do not go together",
        ),
        (&["--shard", "auto"], "found no shard in the environment"),
    ];
    for (flags, says) in cases {
        let mut a: Vec<OsString> = vec!["--accept-new".into()];
        a.extend(flags.iter().map(OsString::from));
        a.extend([srv.remote("data/"), dest.clone().into()]);
        let out = c.run("get", a);
        out.expect_code(2);
        assert!(out.stderr.contains(says), "{flags:?}: {}", out.stderr);
    }
    // A plan of another transfer is refused, not followed.
    let out = c.run("get", shard_args(&srv, &dest, "1/2", &[]));
    out.expect_code(0);
    let out = c.run("get", shard_args(&srv, &dest, "1/4", &[]));
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("it cuts the transfer into 2 shards, not 4; remove it"),
        "{}",
        out.stderr
    );
}

fn journal_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

fn longhaul_child(mut cmd: std::process::Command) -> std::process::Child {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn put_shards_at_once_land_the_tree_and_finish_removes_the_servers_plan() {
    let t = Tmp::new("put-shards");
    let data = t.join("src/data");
    std::fs::create_dir_all(&data).unwrap();
    let total = tree(&data);
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    let srv = Server::start_writable(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    // First contact once, so the shards at once share a pinned server.
    std::fs::write(t.join("hello"), b"hi").unwrap();
    let hello: [OsString; 3] = [
        "--accept-new".into(),
        t.join("hello").into(),
        srv.remote("hello"),
    ];
    c.run("put", hello).expect_code(0);
    let put = |shard: &str| {
        let args: Vec<OsString> = vec![
            "--json".into(),
            "--shard".into(),
            shard.into(),
            format!("{}/", data.display()).into(),
            srv.remote("incoming/"),
        ];
        c.cmd("put", args)
    };
    let runs: Vec<_> = (1..=3)
        .map(|k| {
            let cmd = put(&format!("{k}/3"));
            std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(120)))
        })
        .collect();
    let dest = root.join("incoming");
    let mut sent = 0;
    for r in runs {
        let out = r.join().unwrap();
        out.expect_code(0);
        sent += totals(&out.json(), "bytes_transferred");
    }
    assert_eq!(sent, total, "every byte once");
    assert!(
        dest.join(".longhaul.lh-plan").is_file(),
        "{:?}",
        list_tree(&dest)
    );
    // A shard of another count is refused by the plan the servers keep.
    let out = run_timeout(put("1/2"), Duration::from_secs(60));
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("3 shards, not 2"), "{}", out.stderr);
    let out = run_timeout(put("finish"), Duration::from_secs(60));
    out.expect_code(0);
    let j = out.json();
    assert_eq!(totals(&j, "bytes_transferred"), 0, "{j:#}");
    assert_same_tree(&data, &dest, FILES_AND_DIRS);
    assert_eq!(ours(&dest), Vec::<std::path::PathBuf>::new());
}
