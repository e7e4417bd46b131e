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
