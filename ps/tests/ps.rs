//! The parameter server over real gRPC on localhost: shards started in this process (port 0),
//! a client, and a local table as the reference for every value.

use oar_ps::proto::parameter_server_client::ParameterServerClient;
use oar_ps::proto::{InfoRequest, PullSparseRequest, PushSparseRequest};
use oar_ps::{Optimizer, PsClient, PushMode, RunningServer, ServerConfig, Table, TableConfig, shard_of_id};
use std::time::{Duration, Instant};

fn tables() -> Vec<TableConfig> {
    let mut emb = TableConfig::sparse(
        "emb",
        4,
        Optimizer::Adagrad {
            lr: 0.1,
            eps: 1e-6,
            initial: 0.1,
        },
    );
    emb.seed = 3;
    vec![emb, TableConfig::dense("dense", 5, Optimizer::Sgd { lr: 0.5 })]
}

fn start(shard: u32, of: u32, dir: Option<&std::path::Path>, port: u16) -> RunningServer {
    let config = ServerConfig {
        shard,
        num_shards: of,
        tables: tables(),
        snapshot_dir: dir.map(std::path::Path::to_path_buf),
        snapshot_every: 0,
        snapshot_secs: 0,
    };
    RunningServer::start(config, ([127, 0, 0, 1], port).into()).unwrap()
}

fn endpoints(servers: &[RunningServer]) -> Vec<String> {
    servers.iter().map(|s| format!("http://{}", s.addr())).collect()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-6, "{x} vs {y}");
    }
}

/// Three shards against one local table: pulls (duplicates included) give the same rows,
/// pushes (duplicates summed) the same Adagrad updates; the dense table takes SGD steps.
#[test]
fn sharded_tables_match_a_local_table() {
    let servers: Vec<RunningServer> = (0..3).map(|s| start(s, 3, None, 0)).collect();
    let client = PsClient::connect(&endpoints(&servers), Duration::from_secs(10)).unwrap();
    let mut local = Table::new(tables()[0].clone());
    let ids: Vec<u64> = (0..40).map(|i| (i * 7919 % 53) as u64).chain([5, 5, 17]).collect();
    assert!(
        (0..3).all(|s| ids.iter().any(|&i| shard_of_id(i, 3) == s)),
        "every shard is used"
    );
    for step in 0..3 {
        let before = client.traffic();
        let (dim, got) = client.pull_sparse("emb", &ids, true).unwrap();
        assert_eq!(dim, 4);
        // Each unique id goes out once (8 bytes) and its row comes back once (4 × 4 bytes).
        let unique = ids.iter().collect::<std::collections::BTreeSet<_>>().len() as u64;
        let t = client.traffic();
        assert_eq!((t.calls - before.calls, t.sent - before.sent), (3, 8 * unique));
        assert_eq!(t.received - before.received, 16 * unique);
        close(&got, &local.pull(&ids, true));
        let grads: Vec<f32> = (0..ids.len() * 4)
            .map(|k| ((k + step) % 7) as f32 * 0.1 - 0.3)
            .collect();
        client.push_sparse("emb", &ids, &grads, 4).unwrap();
        // The reference sums a repeated id's gradients into one update.
        let mut summed: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
        for (id, g) in ids.iter().zip(grads.chunks(4)) {
            let e = summed.entry(*id).or_insert(vec![0.0; 4]);
            e.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        }
        let (uids, ugrads): (Vec<u64>, Vec<Vec<f32>>) = summed.into_iter().unzip();
        local.push(&uids, &ugrads.concat());
    }
    close(
        &client.pull_sparse("emb", &ids, false).unwrap().1,
        &local.pull(&ids, false),
    );
    // Not training: an unknown id reads as zeros and creates nothing.
    assert_eq!(client.pull_sparse("emb", &[999_999], false).unwrap().1, vec![0.0; 4]);
    let rows: u64 = client.info().unwrap().iter().map(|i| i.tables[1].rows).sum();
    assert_eq!(rows as usize, local.len());
    assert_eq!(client.pull_dense("dense").unwrap(), vec![0.0; 5]);
    client.push_dense("dense", &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    assert_eq!(client.pull_dense("dense").unwrap(), vec![-0.5, -1.0, -1.5, -2.0, -2.5]);
}

/// A shard stopped (final snapshot) and started again on the same directory has every row
/// back; a server of another layout refuses the directory; snapshots on request work.
#[test]
fn a_restarted_shard_resumes_from_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(0, 1, Some(dir.path()), 0);
    let client = PsClient::connect(&endpoints(std::slice::from_ref(&server)), Duration::from_secs(10)).unwrap();
    let ids = [1u64, 2, 3];
    client.pull_sparse("emb", &ids, true).unwrap();
    client.push_sparse("emb", &ids, &[0.5; 12], 4).unwrap();
    client.push_dense("dense", &[1.0; 5]).unwrap();
    let before = client.pull_sparse("emb", &ids, false).unwrap().1;
    let paths = client.snapshot().unwrap();
    assert!(paths[0].ends_with("shard-0-of-1.safetensors"), "{paths:?}");
    drop(client);
    server.stop().unwrap();

    let server = start(0, 1, Some(dir.path()), 0);
    let client = PsClient::connect(&endpoints(std::slice::from_ref(&server)), Duration::from_secs(10)).unwrap();
    assert_eq!(client.pull_sparse("emb", &ids, false).unwrap().1, before);
    assert_eq!(client.pull_dense("dense").unwrap(), vec![-0.5; 5]);
    drop(client);
    server.stop().unwrap();

    let config = ServerConfig {
        shard: 1,
        num_shards: 2,
        tables: tables(),
        snapshot_dir: Some(dir.path().to_path_buf()),
        snapshot_every: 0,
        snapshot_secs: 0,
    };
    let e = RunningServer::start(config, ([127, 0, 0, 1], 0).into())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("another layout") && e.contains("shard-1-of-2"), "{e}");
}

/// Malformed, misrouted and oversized requests get a status, and the server keeps serving.
#[test]
fn bad_requests_get_a_status() {
    let servers: Vec<RunningServer> = (0..2).map(|s| start(s, 2, None, 0)).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut raw = rt
        .block_on(ParameterServerClient::connect(format!("http://{}", servers[0].addr())))
        .unwrap()
        .max_encoding_message_size(128 << 20);
    let elsewhere = (0..100u64).find(|&i| shard_of_id(i, 2) == 1).unwrap();
    let mine = (0..100u64).find(|&i| shard_of_id(i, 2) == 0).unwrap();
    fn code<T>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Status {
        r.map(|_| ()).unwrap_err()
    }
    let pull = |ids: Vec<u64>, table: &str| PullSparseRequest {
        table: table.into(),
        ids,
        training: true,
    };
    let e = code(rt.block_on(raw.pull_sparse(pull(vec![elsewhere], "emb"))));
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("belongs to shard 1"), "{e}");
    let e = code(rt.block_on(raw.pull_sparse(pull(vec![mine], "nope"))));
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let e = code(rt.block_on(raw.push_sparse(PushSparseRequest {
        table: "emb".into(),
        ids: vec![mine],
        grads: vec![1.0; 3],
        mode: 0,
        trainer: 0,
    })));
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    let e = code(rt.block_on(raw.push_sparse(PushSparseRequest {
        table: "emb".into(),
        ids: vec![mine],
        grads: vec![f32::NAN; 4],
        mode: 0,
        trainer: 0,
    })));
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    for mode in [PushMode::Init as i32, 17] {
        let e = code(rt.block_on(raw.push_sparse(PushSparseRequest {
            table: "emb".into(),
            ids: vec![mine],
            grads: vec![1.0; 4],
            mode,
            trainer: 0,
        })));
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "mode {mode}: {e}");
    }
    let e = code(rt.block_on(raw.info(InfoRequest {
        shard: 0,
        num_shards: 3,
    })));
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    // More ids than a request may carry; then a message over the size limit.
    let many: Vec<u64> = std::iter::repeat_n(mine, oar_ps::server::MAX_IDS + 1).collect();
    let e = code(rt.block_on(raw.pull_sparse(pull(many, "emb"))));
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    let huge: Vec<u64> = std::iter::repeat_n(mine, (oar_ps::server::MAX_MESSAGE_BYTES / 8) + 16).collect();
    let e = code(rt.block_on(raw.pull_sparse(pull(huge, "emb"))));
    assert!(
        matches!(
            e.code(),
            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange | tonic::Code::Internal
        ),
        "{e}"
    );
    // Still serving.
    assert!(rt.block_on(raw.pull_sparse(pull(vec![mine], "emb"))).is_ok());
    // A client's view of the job must match.
    let wrong = vec![
        format!("http://{}", servers[1].addr()),
        format!("http://{}", servers[0].addr()),
    ];
    let e = PsClient::connect(&wrong, Duration::from_secs(5))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("FailedPrecondition"), "{e}");
}

/// No server: the call fails within its deadline. A shard that comes back while a call
/// retries: the call succeeds.
#[test]
fn calls_fail_within_their_deadline_and_retry_a_restarting_shard() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let start_t = Instant::now();
    let e = PsClient::connect(&[format!("http://127.0.0.1:{port}")], Duration::from_millis(600));
    assert!(e.is_err());
    assert!(start_t.elapsed() < Duration::from_secs(5), "{:?}", start_t.elapsed());

    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        start(0, 1, None, port)
    });
    let client = PsClient::connect(&[format!("http://127.0.0.1:{port}")], Duration::from_secs(10)).unwrap();
    assert_eq!(client.pull_dense("dense").unwrap(), vec![0.0; 5]);
    drop(client);
    later.join().unwrap().stop().unwrap();
}

/// Sync mode: two trainers accumulate their gradients on 2 shards and meet at a barrier; the
/// last to arrive applies the sum as one Adagrad step (as one trainer pushing the sum would),
/// nothing is applied before, and the dense table's first INIT wins. A barrier whose other
/// trainer never comes fails within the deadline and withdraws, so the shard is not left
/// counting it; callers that disagree on the trainer count are refused.
#[test]
fn sync_pushes_wait_for_the_barrier_and_apply_once() {
    let servers: Vec<RunningServer> = (0..2).map(|s| start(s, 2, None, 0)).collect();
    let eps = endpoints(&servers);
    let a = PsClient::connect(&eps, Duration::from_secs(10)).unwrap();
    let b = PsClient::connect(&eps, Duration::from_secs(10)).unwrap();
    b.set_trainer(1);
    let ids: Vec<u64> = (0..12).collect();
    let (_, start_rows) = a.pull_sparse("emb", &ids, true).unwrap();
    let ga: Vec<f32> = (0..48).map(|i| (i as f32 * 0.37).sin()).collect();
    let gb: Vec<f32> = (0..48).map(|i| (i as f32 * 0.11).cos()).collect();
    a.push_dense_as(PushMode::Init, "dense", &[1.0, 2.0, 3.0, 4.0, 5.0])
        .unwrap();
    b.push_dense_as(PushMode::Init, "dense", &[9.0; 5]).unwrap();
    a.push_sparse_as(PushMode::Accumulate, "emb", &ids, &ga, 4).unwrap();
    a.push_dense_as(PushMode::Accumulate, "dense", &[1.0; 5]).unwrap();
    let waiting = std::thread::spawn(move || a.barrier(2).unwrap());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        b.pull_sparse("emb", &ids, false).unwrap().1,
        start_rows,
        "applied before the barrier"
    );
    b.push_sparse_as(PushMode::Accumulate, "emb", &ids, &gb, 4).unwrap();
    b.push_dense_as(PushMode::Accumulate, "dense", &[1.0; 5]).unwrap();
    assert_eq!(b.barrier(2).unwrap(), 1);
    assert_eq!(waiting.join().unwrap(), 1);
    let mut local = Table::new(tables()[0].clone());
    local.pull(&ids, true);
    let sum: Vec<f32> = ga.iter().zip(&gb).map(|(x, y)| x + y).collect();
    local.push(&ids, &sum);
    close(&b.pull_sparse("emb", &ids, false).unwrap().1, &local.pull(&ids, false));
    close(&b.pull_dense("dense").unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0]);
    // A lone trainer of two: the deadline, then the shard no longer counts it.
    let lone = PsClient::connect(&eps, Duration::from_millis(500)).unwrap();
    let t0 = Instant::now();
    assert!(lone.barrier(2).is_err());
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b.barrier(1).unwrap(), 2, "the withdrawn arrival is not counted");
    // Disagreeing trainer counts.
    let c = PsClient::connect(&eps, Duration::from_secs(3)).unwrap();
    let waiting = std::thread::spawn(move || c.barrier(3));
    std::thread::sleep(Duration::from_millis(100));
    let e = b.barrier(2).unwrap_err().to_string();
    assert!(e.contains("FailedPrecondition") && e.contains("3"), "{e}");
    // The shards shut down at once, not after the waiting trainer's deadline; the trainer
    // then fails within its own.
    let t0 = Instant::now();
    drop(servers);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(waiting.join().unwrap().is_err());
}

/// `snapshot_secs`: a shard writes its snapshot by the clock while serving.
#[test]
fn snapshots_are_also_written_by_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(0, 1, tables());
    config.snapshot_dir = Some(dir.path().to_path_buf());
    config.snapshot_secs = 1;
    let server = RunningServer::start(config, ([127, 0, 0, 1], 0).into()).unwrap();
    let client = PsClient::connect(&endpoints(std::slice::from_ref(&server)), Duration::from_secs(10)).unwrap();
    client.push_dense("dense", &[1.0; 5]).unwrap();
    let path = dir.path().join("shard-0-of-1.safetensors");
    let t0 = Instant::now();
    while !path.exists() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(path.exists(), "no snapshot after {:?}", t0.elapsed());
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "written before its interval"
    );
    drop(client);
    server.stop().unwrap();
}

/// A heter trainer checks requests before its worker sees them, passes the worker's errors
/// back as statuses and goes on serving; a client of no heter trainer fails within its
/// deadline.
#[test]
fn heter_requests_are_checked() {
    use oar_ps::proto::{HeterReply, NamedTensor};
    struct Doubler;
    impl oar_ps::HeterWorker for Doubler {
        fn step(&self, inputs: Vec<NamedTensor>, _train: bool) -> Result<HeterReply, String> {
            if inputs[0].name == "bad" {
                return Err("the dense part refused `bad`".into());
            }
            let mut out = inputs[0].clone();
            out.values.iter_mut().for_each(|v| *v *= 2.0);
            Ok(HeterReply {
                loss: out.values.iter().sum(),
                grads: vec![],
                outputs: vec![out],
            })
        }
    }
    let heter = oar_ps::RunningHeter::start(std::sync::Arc::new(Doubler), ([127, 0, 0, 1], 0).into()).unwrap();
    let client = oar_ps::HeterClient::connect(&format!("http://{}", heter.addr()), Duration::from_secs(10)).unwrap();
    let t = |name: &str, shape: Vec<u64>, values: Vec<f32>| NamedTensor {
        name: name.into(),
        shape,
        values,
        needs_grad: false,
    };
    let r = client.step(vec![t("x", vec![2], vec![1.0, 2.5])], true).unwrap();
    assert_eq!((r.loss, r.outputs[0].values.clone()), (7.0, vec![2.0, 5.0]));
    for (inputs, says) in [
        (vec![t("x", vec![3], vec![1.0, 2.0])], "does not hold"),
        (vec![t("x", vec![1], vec![f32::NAN])], "not finite"),
        (vec![], "needs inputs"),
        (vec![t("bad", vec![1], vec![1.0])], "refused `bad`"),
    ] {
        let e = client.step(inputs, true).unwrap_err().to_string();
        assert!(e.contains("InvalidArgument") && e.contains(says), "{e}");
    }
    assert!(
        client.step(vec![t("x", vec![1], vec![1.0])], false).is_ok(),
        "still serving"
    );
    drop(client);
    heter.stop().unwrap();
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let t0 = Instant::now();
    let none = oar_ps::HeterClient::connect(&format!("http://127.0.0.1:{port}"), Duration::from_millis(500)).unwrap();
    assert!(none.step(vec![t("x", vec![1], vec![1.0])], true).is_err());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
