//! Two processes receiving into the same file at once never mix their data:
//! the second finds the part file locked and stops with a clear error, the
//! first completes, and a rerun of the second skips the complete file.

use longhaul_testkit::*;
use std::ffi::OsString;
use std::time::Duration;

#[test]
fn a_second_get_into_the_same_file_is_refused_while_the_first_receives_it() {
    let t = Tmp::new("two-writers");
    let root = t.join("root");
    std::fs::create_dir(&root).unwrap();
    gen_file(&root.join("big.bin"), 11, 48 * MIB);
    let srv = Server::start(&root, &t.join("state"));
    let c = Client::new(t.join("kh"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    // Trust first, so that both runs below start at once.
    c.run(
        "get",
        [
            OsString::from("--accept-new"),
            srv.remote("nothing-here"),
            dest.join("x").into(),
        ],
    );
    let args: Vec<OsString> = vec![
        "--max-rate".into(),
        "100M".into(),
        srv.remote("big.bin"),
        dest.clone().into(),
    ];
    let first = {
        let cmd = c.cmd("get", &args);
        std::thread::spawn(move || run_timeout(cmd, Duration::from_secs(60)))
    };
    // The second starts once the first holds the part.
    let part = dest.join(".big.bin.lh-part");
    while !part.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = run_timeout(c.cmd("get", &args), Duration::from_secs(60));
    let first = first.join().unwrap();
    first.expect_code(0);
    eprintln!("second: exit {}: {}", second.code, second.stderr);
    assert_ne!(second.code, 0, "{}", second.stderr);
    assert!(
        second
            .stderr
            .contains("another process is receiving this file"),
        "{}",
        second.stderr
    );
    assert_eq!(
        hash_file(&dest.join("big.bin")),
        hash_file(&root.join("big.bin"))
    );
    // Rerun: the file is complete, nothing is sent.
    let again = c.run("get", [OsString::from("--json")].into_iter().chain(args));
    again.expect_code(0);
    assert_eq!(again.json()["totals"]["skipped"], 1, "{:#}", again.json());
}
