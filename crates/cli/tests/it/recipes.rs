//! The shard recipes of docs/SHARDS.md, run as written where their engine is
//! on this machine: GNU parallel, and a Slurm job array with a finishing job
//! that depends on it (Debian's slurmctld and slurmd on loopback, with a
//! munge daemon of the test's own). A recipe whose engine is missing is
//! skipped with a note, unless `LONGHAUL_REQUIRE_RECIPES=1` (CI installs
//! them).

use longhaul_testkit::*;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `run42`: one file of several chunks and 40 small ones.
fn run42(root: &Path) -> PathBuf {
    let data = root.join("run42");
    std::fs::create_dir_all(data.join("obs")).unwrap();
    gen_file(&data.join("big.bin"), 42, 9 * MIB + 5);
    for i in 0..40u64 {
        gen_file(&data.join(format!("obs/{i:02}.dat")), i, 1000 + i * 997);
    }
    data
}

fn have(cmds: &[&str], test: &str) -> bool {
    let missing: Vec<&&str> = cmds
        .iter()
        .filter(|c| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {c}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("LONGHAUL_REQUIRE_RECIPES").is_none(),
        "{test}: {missing:?} not installed"
    );
    eprintln!("SKIPPED {test}: {missing:?} not installed");
    false
}

/// The tree arrived whole and the plan is gone.
fn landed(data: &Path, dest: &Path) {
    assert_same_tree(
        data,
        dest,
        Compare {
            top_meta: false,
            ..Compare::ALL
        },
    );
    let left: Vec<_> = list_tree(dest)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".lh-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn gnu_parallel_runs_the_shards_and_finish_lands_the_tree() {
    if !have(&["parallel"], "gnu_parallel_runs_the_shards") {
        return;
    }
    let t = Tmp::new("recipe-parallel");
    let data = run42(&t.join("root"));
    let srv = Server::start(&t.join("root"), &t.join("state"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let get = format!(
        "{} get --fingerprint {} --known-hosts {}",
        bin().display(),
        srv.fingerprint,
        t.join("kh").display()
    );
    // docs/SHARDS.md: `parallel -j4 ... longhaul get --shard {#}/4 ...`
    let mut cmd = Command::new("parallel");
    cmd.args(["-j4", "--halt", "now,fail=1", "--line-buffer"])
        .arg(format!(
            "{get} --shard {{#}}/4 --json {} {}/ > {}/shard-{{#}}.json",
            srv.remote("run42/").to_string_lossy(),
            dest.display(),
            t.path().display()
        ))
        .args([":::", "1", "2", "3", "4"]);
    run_timeout(cmd, Duration::from_secs(120)).expect_code(0);
    let mut sent = 0;
    for k in 1..=4 {
        let j: serde_json::Value =
            serde_json::from_slice(&std::fs::read(t.join(format!("shard-{k}.json"))).unwrap())
                .unwrap();
        sent += totals(&j, "bytes_transferred");
    }
    assert_eq!(sent, dir_bytes(&data), "every byte once");
    let mut fin: Vec<OsString> = vec!["--fingerprint".into(), srv.fingerprint.clone().into()];
    fin.extend([
        "--shard".into(),
        "finish".into(),
        srv.remote("run42/"),
        dest.clone().into(),
    ]);
    Client::new(t.join("kh")).run("get", fin).expect_code(0);
    landed(&data, &dest);
}

fn dir_bytes(p: &Path) -> u64 {
    list_tree(p)
        .iter()
        .filter_map(|f| std::fs::symlink_metadata(f).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Children killed (by PID) and waited for on drop.
struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `N` distinct free TCP ports: each listener is held until all are
/// taken (one at a time, the kernel may hand the same port out twice).
fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

fn daemon(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

#[test]
fn a_slurm_array_runs_the_shards_and_a_dependent_job_finishes() {
    let test = "a_slurm_array_runs_the_shards";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED {test}: needs root for slurmd");
        return;
    }
    if !have(
        &["munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo"],
        test,
    ) {
        return;
    }
    let t = Tmp::new("recipe-slurm");
    let s = t.join("slurm");
    std::fs::create_dir_all(s.join("state")).unwrap();
    std::fs::create_dir_all(s.join("spool")).unwrap();
    // A munge daemon of our own: its own key and socket.
    let key = s.join("munge.key");
    std::fs::write(&key, gen_bytes(7, 1024)).unwrap();
    set_mode(&key, 0o400);
    let sock = s.join("munge.sock");
    let mut daemons = Daemons(Vec::new());
    daemons.0.push(daemon(
        Command::new("munged")
            .args(["--foreground", "--force"])
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", sock.display()))
            .arg(format!("--pid-file={}", s.join("munged.pid").display()))
            .arg(format!("--log-file={}", s.join("munged.log").display()))
            .arg(format!("--seed-file={}", s.join("munged.seed").display())),
        &s.join("munged.out"),
    ));
    let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string();
    let conf = s.join("slurm.conf");
    let d = s.display();
    let [ctld_port, d_port] = free_ports::<2>();
    std::fs::write(
        &conf,
        format!(
            "ClusterName=lh\nSlurmctldHost={host}\nSlurmUser=root\nSlurmdUser=root\n\
             SlurmctldPort={}\nSlurmdPort={}\nAuthType=auth/munge\nAuthInfo=socket={}\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/d.pid\n\
             SlurmctldLogFile={d}/ctld.log\nSlurmdLogFile={d}/d.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nReturnToService=2\nJobCompType=jobcomp/none\n\
             AccountingStorageType=accounting_storage/none\nMpiDefault=none\n\
             NodeName={host} CPUs=2 State=UNKNOWN\n\
             PartitionName=dtn Nodes={host} Default=YES MaxTime=INFINITE State=UP \
             OverSubscribe=YES\n",
            ctld_port,
            d_port,
            sock.display()
        ),
    )
    .unwrap();
    for name in ["slurmctld", "slurmd"] {
        let log = s.join(format!("{name}.out"));
        daemons.0.push(daemon(
            Command::new(name).arg("-D").arg("-f").arg(&conf),
            &log,
        ));
    }
    let slurm = |prog: &str| {
        let mut c = Command::new(prog);
        c.env("SLURM_CONF", &conf);
        c
    };
    let started = Instant::now();
    loop {
        let out = slurm("sinfo").args(["-h", "-o", "%t"]).output().unwrap();
        if String::from_utf8_lossy(&out.stdout).trim() == "idle" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the node is not idle: {}{}",
            String::from_utf8_lossy(&out.stdout),
            std::fs::read_to_string(s.join("slurmctld.out")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let data = run42(&t.join("root"));
    let srv = Server::start(&t.join("root"), &t.join("state"));
    let dest = t.join("dest");
    std::fs::create_dir(&dest).unwrap();
    let remote = |p: &str| srv.remote(p).to_string_lossy().into_owned();
    let get = format!(
        "{} get --fingerprint {} --known-hosts {}",
        bin().display(),
        srv.fingerprint,
        t.join("kh").display()
    );
    // docs/SHARDS.md's batch script, with this test's paths.
    let script = t.join("get.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#SBATCH --job-name=run42-get\n#SBATCH --array=0-2\n\
             #SBATCH --ntasks=1 --cpus-per-task=1\n#SBATCH --output={}/run42-%a.json\n\
             srun {get} --shard auto --json {} {}/\n",
            t.path().display(),
            remote("run42/"),
            dest.display()
        ),
    )
    .unwrap();
    let out = slurm("sbatch")
        .arg("--parsable")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out = slurm("sbatch")
        .args(["--parsable", &format!("--dependency=afterok:{job}")])
        .arg(format!("--output={}/finish.out", t.path().display()))
        .arg("--wrap")
        .arg(format!(
            "{get} --shard finish {} {}/",
            remote("run42/"),
            dest.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = Instant::now();
    loop {
        let q = slurm("squeue").arg("-h").output().unwrap();
        if q.stdout.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "jobs still queued: {}",
            String::from_utf8_lossy(&q.stdout)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut sent = 0;
    for a in 0..3 {
        let text = std::fs::read_to_string(t.join(format!("run42-{a}.json"))).unwrap();
        let j: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(j["ok"], true, "{j:#}");
        sent += totals(&j, "bytes_transferred");
    }
    assert_eq!(sent, dir_bytes(&data), "every byte once");
    let fin = std::fs::read_to_string(t.join("finish.out")).unwrap();
    assert!(fin.contains("41 skipped, 0 failed"), "{fin}");
    landed(&data, &dest);
}
