//! `oar ps server`: a shard served by the command, used through `oar_ps::PsClient`; it writes
//! its snapshot when terminated and resumes from it; bad table specs are clean errors.

use crate::common::{assert_clean_error, oar};
use oar_ps::PsClient;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn serve(port: u16, dir: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["ps", "server", "--shard", "0", "--of", "1", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--snapshot-dir"])
        .arg(dir)
        .args(["--table", "emb,sparse,dim=3,opt=sgd,lr=1.0", "--table", "w,dense,len=2"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn terminate(mut child: Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn a_served_shard_trains_snapshots_on_termination_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = serve(port, dir.path());
    let endpoint = vec![format!("http://127.0.0.1:{port}")];
    let client = PsClient::connect(&endpoint, Duration::from_secs(20)).unwrap();
    let (_, before) = client.pull_sparse("emb", &[42], true).unwrap();
    client.push_sparse("emb", &[42], &[1.0, 2.0, 3.0], 3).unwrap();
    let (_, after) = client.pull_sparse("emb", &[42], false).unwrap();
    for j in 0..3 {
        assert!((after[j] - (before[j] - (j as f32 + 1.0))).abs() < 1e-6);
    }
    drop(client);
    terminate(server);
    assert!(dir.path().join("shard-0-of-1.safetensors").exists());

    let server = serve(port, dir.path());
    let client = PsClient::connect(&endpoint, Duration::from_secs(20)).unwrap();
    assert_eq!(client.pull_sparse("emb", &[42], false).unwrap().1, after);
    drop(client);
    terminate(server);
}

#[test]
fn bad_table_specs_are_clean_errors() {
    let o = oar(&[
        "ps",
        "server",
        "--shard",
        "0",
        "--of",
        "1",
        "--port",
        "1",
        "--table",
        "emb,sparse",
    ]);
    assert_clean_error(&o, "needs dim=");
    let o = oar(&[
        "ps",
        "server",
        "--shard",
        "2",
        "--of",
        "2",
        "--port",
        "1",
        "--table",
        "w,dense,len=2",
    ]);
    assert_clean_error(&o, "shard 2 of 2");
}

/// `oar ps launch`: the shards come up, each trainer is told its place, the shards stop with a
/// final snapshot when the trainers finish; a failing trainer stops the job with an error.
#[test]
fn launch_starts_shards_then_trainers_and_stops_them() {
    let dir = tempfile::tempdir().unwrap();
    let snaps = dir.path().join("snaps");
    let script = format!(
        "echo \"$OAR_PS_TRAINER_ID $OAR_PS_TRAINERS $OAR_PS_MODE $OAR_PS_ENDPOINTS\" > {}/t$OAR_PS_TRAINER_ID",
        dir.path().display()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args([
            "ps",
            "launch",
            "--servers",
            "2",
            "--trainers",
            "3",
            "--mode",
            "geo:4:0.1",
        ])
        .arg("--snapshot-dir")
        .arg(&snaps)
        .args(["--table", "w,dense,len=2", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    for t in 0..3 {
        let line = std::fs::read_to_string(dir.path().join(format!("t{t}"))).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&f[..3], &[t.to_string().as_str(), "3", "geo:4:0.1"], "{line}");
        let endpoints: Vec<&str> = f[3].split(',').collect();
        assert_eq!(endpoints.len(), 2);
        assert!(endpoints.iter().all(|e| e.starts_with("http://127.0.0.1:")), "{line}");
    }
    for s in 0..2 {
        assert!(snaps.join(format!("shard-{s}-of-2.safetensors")).exists(), "{err}");
    }

    let t0 = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args([
            "ps",
            "launch",
            "--servers",
            "1",
            "--trainers",
            "2",
            "--table",
            "w,dense,len=2",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "if [ $OAR_PS_TRAINER_ID = 1 ]; then exit 3; fi; sleep 60",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("trainer 1 exited: exit status: 3") && err.contains("the job was stopped"),
        "{err}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "the other trainer was not stopped"
    );
    assert!(!err.contains("panicked"), "{err}");

    let o = oar(&["ps", "launch", "--mode", "geo:0:1", "--table", "w,dense", "--", "true"]);
    assert_clean_error(&o, "GEO needs k >= 1");
    let o = oar(&[
        "ps",
        "launch",
        "--trainers",
        "2",
        "--heter-trainers",
        "3",
        "--table",
        "w,dense",
        "--",
        "true",
    ]);
    assert_clean_error(&o, "--heter-trainers 3");
    let o = oar(&[
        "ps",
        "launch",
        "--trainers",
        "3",
        "--heter-trainers",
        "2",
        "--table",
        "w,dense",
        "--",
        "true",
    ]);
    assert_clean_error(&o, "a divisor");
    let o = oar(&["ps", "launch", "--table", "w,dense", "--", "/nonexistent/trainer"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot start trainer 0"));
}

/// `oar ps gen-data`: training and held-out files of the same teacher, and its AUC.
#[test]
fn gen_data_writes_train_and_test_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = oar(&[
        "ps",
        "gen-data",
        "--out",
        out,
        "--rows",
        "3000",
        "--test-rows",
        "1000",
        "--files",
        "3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("3000 training rows (3 files)") && said.contains("teacher's AUC"),
        "{said}"
    );
    let lines = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap().lines().count();
    let train: usize = (0..3)
        .map(|k| lines(dir.path().join(format!("train/part-0000{k}.txt"))))
        .sum();
    assert_eq!((train, lines(dir.path().join("test/part-00000.txt"))), (3000, 1000));
    // Each line: a label, 13 integer columns, 26 categorical ones.
    let first = std::fs::read_to_string(dir.path().join("test/part-00000.txt")).unwrap();
    assert_eq!(first.lines().next().unwrap().split('\t').count(), 40);
}

/// A shard killed outright (SIGKILL: no final snapshot) and started again on its snapshot
/// directory has everything up to its last snapshot (`--snapshot-every 2`: after the second
/// push) and nothing after; a trainer's client rides out the restart.
#[test]
fn a_killed_shard_loses_nothing_before_its_last_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_oar"))
            .args(["ps", "server", "--shard", "0", "--of", "1", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--snapshot-every", "2", "--snapshot-dir"])
            .arg(dir.path())
            .args(["--table", "emb,sparse,dim=2,opt=sgd,lr=1.0"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut server = start();
    let client = PsClient::connect(&[format!("http://127.0.0.1:{port}")], Duration::from_secs(20)).unwrap();
    let (_, w0) = client.pull_sparse("emb", &[7], true).unwrap();
    client.push_sparse("emb", &[7], &[1.0, 1.0], 2).unwrap();
    client.push_sparse("emb", &[7], &[1.0, 1.0], 2).unwrap(); // snapshot here
    client.push_sparse("emb", &[7], &[1.0, 1.0], 2).unwrap(); // lost with the process
    server.kill().unwrap();
    server.wait().unwrap();
    let mut server = start();
    // The same client: its calls retry until the shard is back.
    let (_, w) = client.pull_sparse("emb", &[7], false).unwrap();
    for j in 0..2 {
        assert!((w[j] - (w0[j] - 2.0)).abs() < 1e-6, "{w:?} vs {w0:?} less two steps");
    }
    drop(client);
    server.kill().unwrap();
    server.wait().unwrap();
}
