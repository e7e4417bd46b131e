//! `oar::distributed` on real MPI processes (built with the cargo feature `distributed`; needs
//! `mpirun`, Debian's openmpi-bin). Each test, run by `cargo test`, starts itself under
//! `mpirun -n N` for several N and passes if every rank does; inside, each rank checks its
//! results against values it computes alone (the reference), so no rank trusts another.

use oar::distributed::{DataParallel, ProcessGroup, ReduceOp};
use oar::io::{DataLoader, TensorDataset};
use oar::nn::functional::{Reduction, cross_entropy};
use oar::nn::{Layer, Linear, ReLU, Sequential};
use oar::optimizer::{Adam, Optimizer};
use oar::{DType, Tensor};
use std::process::Command;

/// True inside a rank that mpirun started.
fn under_mpirun() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some()
}

/// Run test `name` of this binary on `n` MPI ranks with the environment variables `env`
/// (passed on to every rank): whether the job succeeded, what the ranks printed, how long it
/// took.
fn mpirun(name: &str, n: usize, env: &[(&str, &std::ffi::OsStr)]) -> (bool, String, std::time::Duration) {
    let mut cmd = Command::new("mpirun");
    cmd.args(["-n", &n.to_string(), "--oversubscribe"]);
    for (k, v) in env {
        cmd.args(["-x", k]).env(k, v);
    }
    cmd.arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let start = std::time::Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run mpirun (install openmpi-bin): {e}"));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, start.elapsed())
}

/// Run test `name` on `n` ranks; panics with their output unless every rank ran it to the end
/// (each leaves a marker file: their interleaved output is no evidence).
fn launch(name: &str, n: usize) {
    let marks = tempfile::tempdir().unwrap();
    let (ok, text, _) = mpirun(name, n, &[("OAR_TEST_MARKS", marks.path().as_os_str())]);
    assert!(ok, "{name} on {n} ranks failed:\n{text}");
    let done = std::fs::read_dir(marks.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("rank-"))
        .count();
    assert_eq!(done, n, "{name}: {done} of {n} ranks finished the test:\n{text}");
}

/// Inside a rank: record that this rank finished the test.
fn finished(g: &ProcessGroup) {
    let dir = std::env::var_os("OAR_TEST_MARKS").expect("launched by launch()");
    std::fs::write(std::path::Path::new(&dir).join(format!("rank-{}", g.rank())), b"ok").unwrap();
}

fn values(t: &Tensor) -> Vec<f64> {
    t.try_data().unwrap().to_f64_vec()
}

/// Every collective against values each rank computes alone, on 2, 3 and 4 ranks: all_reduce
/// (sum, avg, max; f32, f64, i64), broadcast from a non-zero root, all_gather,
/// reduce_scatter, a send/recv ring, barrier, a sub-group of the even ranks; an f16 tensor and
/// a bad rank are typed errors; a tensor on a device comes back on it.
#[test]
fn collectives_match_a_reference() {
    if !under_mpirun() {
        for n in [2, 3, 4] {
            launch("collectives_match_a_reference", n);
        }
        return;
    }
    let g = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    assert_eq!(g.ranks(), (0..n).collect::<Vec<_>>());
    // Rank k holds (k + 1) · [1, -2, 3, -4, 5, -6].
    let of = |k: usize| -> Vec<f64> {
        [1.0, -2.0, 3.0, -4.0, 5.0, -6.0]
            .iter()
            .map(|v| v * (k + 1) as f64)
            .collect()
    };
    let mine = Tensor::from_vec(of(r).iter().map(|&v| v as f32).collect(), &[2, 3]).unwrap();
    let sum: Vec<f64> = (0..6).map(|i| (0..n).map(|k| of(k)[i]).sum()).collect();
    let max: Vec<f64> = (0..6)
        .map(|i| (0..n).map(|k| of(k)[i]).fold(f64::MIN, f64::max))
        .collect();
    let s = g.all_reduce(&mine, ReduceOp::Sum).unwrap();
    assert_eq!((s.shape(), values(&s)), (vec![2, 3], sum.clone()));
    let avg: Vec<f64> = sum.iter().map(|v| v / n as f64).collect();
    for (a, b) in values(&g.all_reduce(&mine, ReduceOp::Avg).unwrap()).iter().zip(&avg) {
        assert!((a - b).abs() < 1e-6, "avg {a} vs {b}");
    }
    assert_eq!(values(&g.all_reduce(&mine, ReduceOp::Max).unwrap()), max);
    let as64 = mine.cast(DType::F64).unwrap();
    assert_eq!(values(&g.all_reduce(&as64, ReduceOp::Sum).unwrap()), sum);
    let ints = Tensor::from_vec(vec![r as i64, 10 * r as i64], &[2]).unwrap();
    let isum = (0..n as i64).sum::<i64>();
    assert_eq!(
        values(&g.all_reduce(&ints, ReduceOp::Sum).unwrap()),
        vec![isum as f64, 10.0 * isum as f64]
    );

    let root = n - 1;
    let b = g.broadcast(&mine, root).unwrap();
    assert_eq!(
        values(&b),
        of(root).iter().map(|&v| v as f32 as f64).collect::<Vec<_>>()
    );

    let gathered = g.all_gather(&mine).unwrap();
    assert_eq!(gathered.len(), n);
    for (k, t) in gathered.iter().enumerate() {
        assert_eq!((t.shape(), values(t)), (vec![2, 3], of(k)));
    }

    // reduce_scatter of [2n] values: rank k gets the sum of everyone's slice [2k, 2k + 2).
    let long: Vec<f32> = (0..2 * n).map(|i| (i * (r + 1)) as f32).collect();
    let part = g
        .reduce_scatter(&Tensor::from_vec(long, &[2 * n]).unwrap(), ReduceOp::Sum)
        .unwrap();
    let tri = (n * (n + 1) / 2) as f64;
    assert_eq!(values(&part), vec![(2 * r) as f64 * tri, (2 * r + 1) as f64 * tri]);

    // A ring: send to the next rank, receive from the previous (even ranks send first).
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let token = Tensor::from_vec(vec![r as f64; 4], &[4]).unwrap();
    let got = if r % 2 == 0 {
        g.send(&token, next).unwrap();
        g.recv(&[4], DType::F64, prev).unwrap()
    } else {
        let got = g.recv(&[4], DType::F64, prev).unwrap();
        g.send(&token, next).unwrap();
        got
    };
    assert_eq!(values(&got), vec![prev as f64; 4]);
    g.barrier().unwrap();

    let evens: Vec<usize> = (0..n).step_by(2).collect();
    match g.new_group(&evens).unwrap() {
        Some(sub) => {
            assert!(r % 2 == 0);
            assert_eq!((sub.rank(), sub.size(), sub.ranks()), (r / 2, evens.len(), &evens[..]));
            let s = sub
                .all_reduce(&Tensor::from_vec(vec![r as f32], &[1]).unwrap(), ReduceOp::Sum)
                .unwrap();
            assert_eq!(values(&s), vec![evens.iter().sum::<usize>() as f64]);
        }
        None => assert!(r % 2 == 1),
    }

    let half = mine.cast(DType::F16).unwrap();
    let e = g.all_reduce(&half, ReduceOp::Sum).unwrap_err().to_string();
    assert!(e.contains("all_reduce") && e.contains("f16"), "{e}");
    assert!(
        g.broadcast(&mine, n)
            .unwrap_err()
            .to_string()
            .contains(&format!("rank {n}"))
    );
    assert!(g.new_group(&[0, 0]).is_err() && g.new_group(&[n + 5]).is_err());

    // A tensor on a device (here a host-backed one) is staged through host memory and comes
    // back on its device, by the method and by the IR op alike.
    let cpu = oar::backend::get("cpu").unwrap();
    oar::device::register_runtime(std::sync::Arc::new(oar::device::HostRuntime::new("emu", 1, cpu)));
    let dev = oar::Device::new("emu", 0);
    let on_dev = mine.to(&dev).unwrap();
    let s = g.all_reduce(&on_dev, ReduceOp::Sum).unwrap();
    assert_eq!((s.device(), values(&s)), (dev.clone(), sum.clone()));
    let s = oar::distributed::functional::all_reduce(&on_dev, ReduceOp::Sum, &g).unwrap();
    assert_eq!((s.device(), values(&s)), (dev, sum));
    finished(&g);
}

/// An MLP and its data: 48 samples of 6 features in 3 classes.
fn mlp(seed: u64) -> Sequential {
    oar::seed(seed);
    Sequential::new()
        .add(Linear::new(6, 16).unwrap())
        .add(ReLU)
        .add(Linear::new(16, 3).unwrap())
}

fn data() -> TensorDataset {
    oar::seed(5);
    let x = oar::randn(&[48, 6], DType::F32).unwrap();
    let y = Tensor::from_vec((0..48).map(|i| (i * 7 % 3) as i64).collect(), &[48]).unwrap();
    TensorDataset::new(vec![x, y]).unwrap()
}

fn params(l: &dyn Layer) -> Vec<Vec<f32>> {
    l.parameters().iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

/// Every parameter of `got` within 1e-5 (relative, 1e-3 floor) of `want`'s.
fn assert_params_close(what: &str, got: &dyn Layer, want: &dyn Layer) {
    for (a, b) in params(got).iter().zip(params(want)) {
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 1e-5 * (q.abs() + 1e-3), "{what}: {p} vs {q}");
        }
    }
}

/// Data parallelism: N ranks, each with batch 12/N of a sharded, shuffled loader and its
/// replica started from different weights (DataParallel broadcasts rank 0's), train 5 Adam
/// steps with averaged gradients; their loss (averaged) and parameters equal one process's at
/// batch 12 on the same data, within 1e-5 relative, on 2, 3 and 4 ranks; with the gradients
/// averaged after backward, and while the last of two accumulated backwards runs (buckets
/// handed over before it ends).
#[test]
fn data_parallel_equals_one_process() {
    if !under_mpirun() {
        for n in [2, 3, 4] {
            launch("data_parallel_equals_one_process", n);
        }
        return;
    }
    let g: ProcessGroup = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    let batch = 12;
    assert_eq!(batch % n, 0);

    // The reference, alone on this rank.
    let single = mlp(100);
    let mut opt = Adam::new(single.named_parameters(), 1e-2);
    let loader = DataLoader::new(data()).batch_size(batch).shuffle(true).seed(9);
    let mut want_losses = Vec::new();
    for b in loader.iter().take(5) {
        let b = b.unwrap();
        let loss = cross_entropy(&single.forward(&b[0]).unwrap(), &b[1], Reduction::Mean).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.clear_grad();
        want_losses.push(loss.item().unwrap());
    }

    // Gradients averaged after backward (`sync_gradients`), then while it runs
    // (`DataParallel::backward`, buckets of 256 bytes: several per step).
    for overlap in [false, true] {
        let dp = DataParallel::new(mlp(100 + r as u64), &g).unwrap().bucket_bytes(256);
        let mut opt = Adam::new(dp.named_parameters(), 1e-2);
        let loader = DataLoader::new(data())
            .batch_size(batch / n)
            .shuffle(true)
            .seed(9)
            .shard(r, n);
        assert_eq!(loader.len(), 48 / batch);
        for (step, b) in loader.iter().take(5).enumerate() {
            let b = b.unwrap();
            let loss = cross_entropy(&dp.forward(&b[0]).unwrap(), &b[1], Reduction::Mean).unwrap();
            if overlap {
                // Accumulated over two parts of the batch: a plain backward, then the
                // overlapped one, whose buckets carry both parts' gradients.
                let (rows, h) = ((batch / n) as i64, (batch / n / 2) as i64);
                let part = |lo: i64, hi: i64| {
                    let (x, y) = (b[0].slice(0, lo, hi, 1).unwrap(), b[1].slice(0, lo, hi, 1).unwrap());
                    let l = cross_entropy(&dp.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
                    (&l * ((hi - lo) as f64 / rows as f64)).unwrap()
                };
                part(0, h).backward().unwrap();
                dp.backward(&part(h, rows)).unwrap();
                assert!(
                    dp.overlapped_buckets() >= 2,
                    "{} buckets overlapped",
                    dp.overlapped_buckets()
                );
            } else {
                loss.backward().unwrap();
                dp.sync_gradients().unwrap();
            }
            opt.step().unwrap();
            opt.clear_grad();
            let global = g.all_reduce(&loss.detach(), ReduceOp::Avg).unwrap().item().unwrap();
            let want = want_losses[step];
            assert!(
                (global - want).abs() <= 1e-5 * want.abs(),
                "overlap {overlap}, step {step}: loss {global} vs {want}"
            );
        }
        assert_params_close(&format!("overlap {overlap}"), &dp, &single);
    }
    finished(&g);
}

/// Sharding without MPI: the ranks' shares of an epoch are disjoint, cover it (padded by
/// repeating its start), and batch j of all shares is batch j of the whole; a rank past the
/// world size is an error.
#[test]
fn shards_partition_each_epoch() {
    if under_mpirun() {
        return;
    }
    let ids = || TensorDataset::new(vec![Tensor::from_vec((0..10i64).collect(), &[10]).unwrap()]).unwrap();
    let epoch = |rank, world, bs| -> Vec<Vec<i64>> {
        let l = DataLoader::new(ids())
            .batch_size(bs)
            .shuffle(true)
            .seed(4)
            .shard(rank, world);
        l.iter().map(|b| b.unwrap()[0].to_vec::<i64>().unwrap()).collect()
    };
    let whole: Vec<i64> = epoch(0, 1, 10).concat();
    let shares: Vec<Vec<Vec<i64>>> = (0..3).map(|r| epoch(r, 3, 2)).collect();
    let mut all: Vec<i64> = shares.iter().flatten().flatten().copied().collect();
    assert_eq!(all.len(), 12, "10 samples padded to 12");
    all.sort();
    all.dedup();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    // Batch 0 of the three shares: positions 0..6 of the epoch's order.
    let mut first: Vec<i64> = shares.iter().flat_map(|s| s[0].clone()).collect();
    let mut want = whole[..6].to_vec();
    first.sort();
    want.sort();
    assert_eq!(first, want);
    let bad = DataLoader::new(ids()).batch_size(2).shard(3, 3);
    assert!(bad.iter().next().unwrap().is_err());
    // Without a launcher, init is a group of one whose collectives are the identity.
    let g = oar::distributed::init().unwrap();
    assert_eq!((g.rank(), g.size()), (0, 1));
    let t = Tensor::from_vec(vec![1.5f32, -2.0], &[2]).unwrap();
    assert_eq!(values(&g.all_reduce(&t, ReduceOp::Avg).unwrap()), vec![1.5, -2.0]);
    assert!(g.send(&t, 1).is_err());
}

/// A rank that hangs makes the others fail within the timeout (here 2 s) with an error naming
/// the collective and the rank, instead of hanging the job; a rank that dies ends the job too.
#[test]
fn a_hung_or_dead_rank_fails_the_job_promptly() {
    if !under_mpirun() {
        let name = "a_hung_or_dead_rank_fails_the_job_promptly";
        let (ok, text, took) = mpirun(name, 2, &[]);
        assert!(!ok, "the job should fail:\n{text}");
        assert!(
            text.contains("oar::distributed: all_reduce on rank 0 waited") && text.contains("2.0 s timeout"),
            "{text}"
        );
        assert!(took < std::time::Duration::from_secs(20), "took {took:?}:\n{text}");
        // The dead-rank variant: rank 1 exits instead of hanging.
        let (ok, text, took) = mpirun(name, 2, &[("OAR_TEST_DIE", std::ffi::OsStr::new("1"))]);
        assert!(!ok, "the job should fail:\n{text}");
        assert!(took < std::time::Duration::from_secs(20), "took {took:?}:\n{text}");
        return;
    }
    oar::distributed::set_timeout(std::time::Duration::from_secs(2));
    let g = oar::distributed::init().unwrap();
    g.barrier().unwrap();
    if g.rank() == 1 {
        if std::env::var_os("OAR_TEST_DIE").is_some() {
            std::process::exit(7);
        }
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
    let t = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
    g.all_reduce(&t, ReduceOp::Sum).unwrap();
    unreachable!("rank 1 never joins");
}

/// `Model::data_parallel`: `fit` on N ranks (sharded loaders, batch 12/N, replicas from
/// different weights) gives one process's parameters and epoch losses at batch 12, within 1e-5,
/// on 2 and 4 ranks; eagerly and with compiled steps (`to_static`), whose graph averages.
#[test]
fn model_fit_data_parallel_equals_one_process() {
    if !under_mpirun() {
        for n in [2, 4] {
            launch("model_fit_data_parallel_equals_one_process", n);
        }
        return;
    }
    use oar::Model;
    let g = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    let prepared = |seed| {
        let net = mlp(seed);
        let opt = Adam::new(net.named_parameters(), 1e-2);
        let mut m = Model::new(net);
        m.prepare(opt, |y, t| cross_entropy(y, t, Reduction::Mean), vec![]);
        m.verbose(false);
        m
    };
    let pairs = |d: TensorDataset| {
        DataLoader::with_collate(d, |rows: Vec<Vec<Tensor>>| {
            let xs: Vec<&Tensor> = rows.iter().map(|r| &r[0]).collect();
            let ys: Vec<&Tensor> = rows.iter().map(|r| &r[1]).collect();
            Ok((oar::stack(&xs, 0)?, oar::stack(&ys, 0)?))
        })
    };
    let mut single = prepared(100);
    let want = single
        .fit(&pairs(data()).batch_size(12).shuffle(true).seed(9), None, 2)
        .unwrap();

    let mut dp = prepared(100 + r as u64);
    dp.data_parallel(&g).unwrap();
    let loader = pairs(data()).batch_size(12 / n).shuffle(true).seed(9).shard(r, n);
    let got = dp.fit(&loader, None, 2).unwrap();
    for (a, b) in got.iter().zip(&want) {
        let (la, lb) = (a.train["loss"], b.train["loss"]);
        assert!(
            (la - lb).abs() <= 1e-5 * lb.abs(),
            "epoch {}: loss {la} vs {lb}",
            a.epoch
        );
    }
    assert_params_close("eager", dp.network(), single.network());
    // The same with compiled steps: the averaging is an op of the traced step.
    let mut single = prepared(100);
    single.to_static(true).unwrap();
    let want = single
        .fit(&pairs(data()).batch_size(12).shuffle(true).seed(9), None, 2)
        .unwrap();
    let mut dp = prepared(100 + r as u64);
    dp.data_parallel(&g).unwrap().to_static(true).unwrap();
    let loader = pairs(data()).batch_size(12 / n).shuffle(true).seed(9).shard(r, n);
    let got = dp.fit(&loader, None, 2).unwrap();
    for (a, b) in got.iter().zip(&want) {
        let (la, lb) = (a.train["loss"], b.train["loss"]);
        assert!(
            (la - lb).abs() <= 1e-5 * lb.abs(),
            "compiled, epoch {}: loss {la} vs {lb}",
            a.epoch
        );
    }
    assert_params_close("compiled", dp.network(), single.network());
    finished(&g);
}

/// ZeRO stage 1: with the Adam state sharded over 2 and 3 ranks (`ShardedOptimizer`), data-
/// parallel training still equals one process at the full batch (5 steps, 1e-5), and each rank's
/// optimizer state covers only the parameters it owns, every parameter being owned once.
#[test]
fn sharded_optimizer_equals_one_process() {
    if !under_mpirun() {
        for n in [2, 3] {
            launch("sharded_optimizer_equals_one_process", n);
        }
        return;
    }
    use oar::distributed::ShardedOptimizer;
    let g = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    let batch = 12;
    let single = mlp(100);
    let mut opt = Adam::new(single.named_parameters(), 1e-2);
    for b in DataLoader::new(data())
        .batch_size(batch)
        .shuffle(true)
        .seed(9)
        .iter()
        .take(5)
    {
        let b = b.unwrap();
        cross_entropy(&single.forward(&b[0]).unwrap(), &b[1], Reduction::Mean)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        opt.clear_grad();
    }

    let dp = DataParallel::new(mlp(100 + r as u64), &g).unwrap();
    let mut opt = ShardedOptimizer::new(dp.named_parameters(), &g, |mine| Adam::new(mine, 1e-2)).unwrap();
    let loader = DataLoader::new(data())
        .batch_size(batch / n)
        .shuffle(true)
        .seed(9)
        .shard(r, n);
    for b in loader.iter().take(5) {
        let b = b.unwrap();
        cross_entropy(&dp.forward(&b[0]).unwrap(), &b[1], Reduction::Mean)
            .unwrap()
            .backward()
            .unwrap();
        dp.sync_gradients().unwrap();
        opt.step().unwrap();
        opt.clear_grad();
    }
    assert_params_close("sharded optimizer", &dp, &single);
    let names: Vec<String> = dp.named_parameters().into_iter().map(|(k, _)| k).collect();
    let owners = opt.owners().to_vec();
    assert!(
        (0..n).all(|k| owners.contains(&k)),
        "every rank owns something: {owners:?}"
    );
    let state = opt.state_dict();
    for (name, &owner) in names.iter().zip(&owners) {
        let has = state.keys().any(|k| k.starts_with(&format!("{name}.")));
        assert_eq!(
            has,
            owner == r,
            "rank {r}: state of {name} (owner {owner}): {:?}",
            state.keys()
        );
    }
    finished(&g);
}

/// A tiny GPT split over `group`: a vocabulary-parallel embedding, one tensor-parallel
/// transformer block, a column-parallel head whose logits stay split, and the parallel
/// cross-entropy. On a group of one it is the plain model.
struct TinyGpt {
    emb: oar::distributed::VocabParallelEmbedding,
    block: oar::distributed::ParallelTransformerLayer,
    head: oar::distributed::ColumnParallelLinear,
    group: ProcessGroup,
}

const VOCAB: usize = 24;
const WIDTH: usize = 16;

impl TinyGpt {
    fn new(group: &ProcessGroup) -> TinyGpt {
        oar::seed(11);
        TinyGpt {
            emb: oar::distributed::VocabParallelEmbedding::new(VOCAB, WIDTH, group).unwrap(),
            block: oar::distributed::ParallelTransformerLayer::new(WIDTH, 4, 32, group).unwrap(),
            head: oar::distributed::ColumnParallelLinear::new(WIDTH, VOCAB, group).unwrap(),
            group: group.clone(),
        }
    }

    fn loss(&self, ids: &Tensor, labels: &Tensor) -> oar::Result<Tensor> {
        let logits = self.forward(ids)?;
        oar::distributed::parallel_cross_entropy(&logits, labels, &self.group, Reduction::Mean)
    }
}

impl Layer for TinyGpt {
    /// Token ids `[B, S]` to this rank's slice of the logits `[B·S, VOCAB/n]`.
    fn forward(&self, ids: &Tensor) -> oar::Result<Tensor> {
        let h = self.block.forward(&self.emb.forward(ids)?)?;
        self.head.forward(&h.reshape(&[-1, WIDTH as i64])?)
    }

    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![
            ("emb".into(), &self.emb),
            ("block".into(), &self.block),
            ("head".into(), &self.head),
        ]
    }
}

/// Token ids `[2, 5]` and next-token labels `[10]`, the same on every rank.
fn tokens() -> (Tensor, Tensor) {
    let ids: Vec<i64> = (0..10).map(|i| ((i * 7 + 3) % VOCAB) as i64).collect();
    let labels: Vec<i64> = (0..10).map(|i| ((i * 5 + 1) % VOCAB) as i64).collect();
    (
        Tensor::from_vec(ids, &[2, 5]).unwrap(),
        Tensor::from_vec(labels, &[10]).unwrap(),
    )
}

/// `shard` is this rank's slice of `full` along the one axis where their shapes differ (or all
/// of it where they agree): its values, within `tol` relative to the largest of `full`.
fn assert_is_slice(what: &str, shard: &Tensor, full: &Tensor, rank: usize, tol: f64) {
    let (s, f) = (shard.shape(), full.shape());
    let part = match (0..f.len()).find(|&a| s[a] != f[a]) {
        Some(a) => full
            .slice(a as i64, (rank * s[a]) as i64, ((rank + 1) * s[a]) as i64, 1)
            .unwrap(),
        None => full.clone(),
    };
    assert_eq!(part.shape(), s, "{what}: {s:?} is no slice of {f:?}");
    let want = values(&part);
    let scale = values(full).iter().fold(0f64, |m, v| m.max(v.abs()));
    for (a, b) in values(shard).iter().zip(&want) {
        assert!(
            (a - b).abs() <= tol * scale + 1e-7,
            "{what}: {a} vs {b} (largest {scale})"
        );
    }
}

/// Tensor parallelism on 2 and 4 ranks against the plain model (the same layers on a group of
/// one, from the same seed): loss, every parameter's gradient (each rank's slice of the plain
/// gradient), and five SGD steps, eagerly and as one traced training step whose graph holds
/// the collectives; within 1e-5. Dropout under the RNG tracker differs between ranks.
#[test]
fn tensor_parallel_equals_one_process() {
    if !under_mpirun() {
        for n in [2, 4] {
            launch("tensor_parallel_equals_one_process", n);
        }
        return;
    }
    use oar::jit::{InputSpec, to_static_train_step};
    use oar::optimizer::SGD;
    let g = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    // Every rank makes every group of one (new_group is collective); each keeps its own.
    let mut solo = None;
    for k in 0..n {
        if let Some(s) = g.new_group(&[k]).unwrap() {
            solo = Some(s);
        }
    }
    let solo = solo.unwrap();
    assert_eq!(solo.size(), 1);

    let (ids, labels) = tokens();
    let plain = TinyGpt::new(&solo);
    let tp = TinyGpt::new(&g);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
    let l_plain = plain.loss(&ids, &labels).unwrap();
    let l_tp = tp.loss(&ids, &labels).unwrap();
    let (a, b) = (l_tp.item().unwrap(), l_plain.item().unwrap());
    assert!(close(a, b), "rank {r}: loss {a} vs {b}");
    l_plain.backward().unwrap();
    l_tp.backward().unwrap();
    let full: std::collections::BTreeMap<String, Tensor> = plain.named_parameters().into_iter().collect();
    let mut split = 0;
    for (name, p) in tp.named_parameters() {
        let q = &full[&name];
        split += usize::from(p.shape() != q.shape());
        assert_is_slice(&name, &p.grad().unwrap(), &q.grad().unwrap(), r, 1e-5);
    }
    // The embedding, q/k/v, out, fc1, fc2 and the head (weights) are split.
    assert!(split >= 8, "only {split} parameters are split");

    // Five SGD steps, eagerly. (Not Adam: the key bias's gradient is zero up to rounding —
    // attention is invariant to it — and Adam would scale that noise up to full steps.)
    let mut opt_plain = SGD::new(plain.named_parameters(), 0.1);
    let mut opt_tp = SGD::new(tp.named_parameters(), 0.1);
    opt_plain.step().unwrap();
    opt_tp.step().unwrap();
    for _ in 0..4 {
        opt_plain.clear_grad();
        opt_tp.clear_grad();
        let (lp, lt) = (plain.loss(&ids, &labels).unwrap(), tp.loss(&ids, &labels).unwrap());
        let (a, b) = (lt.item().unwrap(), lp.item().unwrap());
        assert!(close(a, b), "rank {r}: loss {a} vs {b} after training");
        lp.backward().unwrap();
        lt.backward().unwrap();
        opt_plain.step().unwrap();
        opt_tp.step().unwrap();
    }
    for (name, p) in tp.named_parameters() {
        assert_is_slice(&name, &p, &full[&name], r, 1e-5);
    }

    // The same training as one traced step on every rank: collectives in the graph.
    let plain = TinyGpt::new(&solo);
    let tp = TinyGpt::new(&g);
    let specs = [
        InputSpec::new(&[Some(2), Some(5)], DType::I64, "ids"),
        InputSpec::new(&[Some(10)], DType::I64, "labels"),
    ];
    let mut opt_plain = SGD::new(plain.named_parameters(), 0.1);
    let mut opt_tp = SGD::new(tp.named_parameters(), 0.1);
    let step = to_static_train_step(&tp, &mut opt_tp, &specs, |xs| tp.loss(&xs[0], &xs[1])).unwrap();
    let text = step.graph().to_string();
    for op in ["c_identity", "mp_allreduce", "all_reduce_max"] {
        assert!(text.contains(op), "no {op} in the traced step:\n{text}");
    }
    for _ in 0..5 {
        let lt = step.call(&[&ids, &labels]).unwrap().remove(0).item().unwrap();
        let lp = plain.loss(&ids, &labels).unwrap();
        let b = lp.item().unwrap();
        assert!(close(lt, b), "rank {r}: traced loss {lt} vs {b}");
        lp.backward().unwrap();
        opt_plain.step().unwrap();
        opt_plain.clear_grad();
    }
    let full: std::collections::BTreeMap<String, Tensor> = plain.named_parameters().into_iter().collect();
    for (name, p) in tp.named_parameters() {
        assert_is_slice(&name, &p, &full[&name], r, 1e-5);
    }

    // The RNG tracker: dropout masks drawn inside `fork` differ between ranks (each seeded
    // its own), those outside agree.
    let tracker = oar::distributed::RngTracker::new();
    tracker.add("model_parallel", 1000 + r as u64).unwrap();
    oar::seed(5);
    let ones = Tensor::from_vec(vec![1f32; 64], &[64]).unwrap();
    let inside = tracker
        .fork("model_parallel", || oar::nn::functional::dropout(&ones, 0.5, true))
        .unwrap()
        .unwrap();
    let outside = oar::nn::functional::dropout(&ones, 0.5, true).unwrap();
    let (ins, outs) = (g.all_gather(&inside).unwrap(), g.all_gather(&outside).unwrap());
    for k in 1..n {
        assert_ne!(
            values(&ins[k]),
            values(&ins[0]),
            "ranks 0 and {k} drew the same mask inside"
        );
        assert_eq!(values(&outs[k]), values(&outs[0]), "ranks 0 and {k} differ outside");
    }
    finished(&g);
}

/// The layers of a 7-layer MLP, for a pipeline or a plain `Sequential`.
fn deep_mlp_descs() -> Vec<oar::distributed::LayerDesc> {
    use oar::distributed::LayerDesc;
    use oar::nn::Tanh;
    vec![
        LayerDesc::new(|| Linear::new(6, 16)),
        LayerDesc::new(|| Ok(ReLU)),
        LayerDesc::new(|| Linear::new(16, 16)),
        LayerDesc::new(|| Ok(Tanh)),
        LayerDesc::new(|| Linear::new(16, 16)),
        LayerDesc::new(|| Ok(ReLU)),
        LayerDesc::new(|| Linear::new(16, 3)),
    ]
}

fn deep_mlp() -> Sequential {
    use oar::nn::Tanh;
    Sequential::new()
        .add(Linear::new(6, 16).unwrap())
        .add(ReLU)
        .add(Linear::new(16, 16).unwrap())
        .add(Tanh)
        .add(Linear::new(16, 16).unwrap())
        .add(ReLU)
        .add(Linear::new(16, 3).unwrap())
}

/// Pipeline parallelism on 2 and 4 ranks (a 7-layer MLP cut into stages), with the 1F1B and
/// GPipe schedules: five Adam steps on a batch of 12 in 4 micro-batches give one process's
/// losses and parameters (each stage's layers) at the whole batch, within 1e-5; under 1F1B a
/// stage holds at most `stages − stage` micro-batches' activations, under GPipe all 4.
#[test]
fn pipeline_equals_one_process() {
    if !under_mpirun() {
        for n in [2, 4] {
            launch("pipeline_equals_one_process", n);
        }
        return;
    }
    use oar::distributed::{PipelineLayer, Schedule};
    let g = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    for schedule in [Schedule::OneFOneB, Schedule::GPipe] {
        oar::seed(21);
        let single = deep_mlp();
        oar::seed(21);
        let pipe = PipelineLayer::new(deep_mlp_descs(), &g).unwrap().schedule(schedule);
        assert_eq!(pipe.stage(), r);
        let mut opt_single = Adam::new(single.named_parameters(), 1e-2);
        let mut opt_pipe = Adam::new(pipe.named_parameters(), 1e-2);
        let loss = |h: &Tensor, t: &Tensor| cross_entropy(h, t, Reduction::Mean);
        for step in 0..5 {
            oar::seed(300 + step);
            let x = oar::randn(&[12, 6], DType::F32).unwrap();
            let t = Tensor::from_vec((0..12).map(|i| ((i + step as usize) % 3) as i64).collect(), &[12]).unwrap();
            let want = loss(&single.forward(&x).unwrap(), &t).unwrap();
            want.backward().unwrap();
            opt_single.step().unwrap();
            opt_single.clear_grad();
            let got = pipe.train_batch(&x, &t, 4, loss, &mut opt_pipe).unwrap();
            let want = want.item().unwrap();
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "{schedule:?} step {step} rank {r}: loss {got} vs {want}"
            );
            let bound = if schedule == Schedule::GPipe { 4 } else { (n - r).min(4) };
            assert_eq!(pipe.max_in_flight(), bound, "{schedule:?} rank {r}");
        }
        let whole: std::collections::BTreeMap<String, Tensor> = single.named_parameters().into_iter().collect();
        let mine = pipe.named_parameters();
        assert!(!mine.is_empty() || pipe.stage_layers(r).len() == 1);
        for (name, p) in mine {
            let q = &whole[&name];
            for (a, b) in values(&p).iter().zip(values(q)) {
                assert!(
                    (a - b).abs() <= 1e-5 * (b.abs() + 1e-3),
                    "{schedule:?} {name}: {a} vs {b}"
                );
            }
        }
    }
    finished(&g);
}

/// Every rank makes every group of one (`new_group` is collective) and keeps its own.
fn solo(g: &ProcessGroup) -> ProcessGroup {
    let mut mine = None;
    for k in 0..g.size() {
        if let Some(s) = g.new_group(&[k]).unwrap() {
            mine = Some(s);
        }
    }
    mine.unwrap()
}

/// `[B, S, W]` hidden states as `[B·S, W]` rows, for the head.
struct Rows;

impl Layer for Rows {
    fn forward(&self, h: &Tensor) -> oar::Result<Tensor> {
        h.reshape(&[-1, WIDTH as i64])
    }
}

/// The tiny GPT of `tensor_parallel_equals_one_process` as pipeline layers split over `mp`.
fn gpt_descs(mp: &ProcessGroup) -> Vec<oar::distributed::LayerDesc> {
    use oar::distributed::{ColumnParallelLinear, LayerDesc, ParallelTransformerLayer, VocabParallelEmbedding};
    let (a, b, c) = (mp.clone(), mp.clone(), mp.clone());
    vec![
        LayerDesc::new(move || VocabParallelEmbedding::new(VOCAB, WIDTH, &a)),
        LayerDesc::new(move || ParallelTransformerLayer::new(WIDTH, 4, 32, &b)),
        LayerDesc::new(|| Ok(Rows)),
        LayerDesc::new(move || ColumnParallelLinear::new(WIDTH, VOCAB, &c)),
    ]
}

/// Hybrid parallelism: on 4 ranks dp 2 × mp 2, mp 2 × pp 2 and dp 2 × pp 2, on 8 ranks
/// dp 2 × mp 2 × pp 2 (`init_hybrid`'s groups; pipeline stages of tensor-parallel layers,
/// replicated over the data-parallel group), each 5 SGD steps on a batch of 4 sequences in 2
/// micro-batches: the loss and every parameter equal one process's plain model at the whole
/// batch, within 1e-5.
#[test]
fn hybrid_parallel_equals_one_process() {
    if !under_mpirun() {
        launch("hybrid_parallel_equals_one_process", 4);
        launch("hybrid_parallel_equals_one_process", 8);
        return;
    }
    use oar::distributed::{DistributedStrategy, PipelineLayer, init_hybrid};
    use oar::optimizer::SGD;
    let g = oar::distributed::init().unwrap();
    let me = solo(&g);
    let ids: Vec<i64> = (0..20).map(|i| ((i * 7 + 3) % VOCAB) as i64).collect();
    let labels: Vec<i64> = (0..20).map(|i| ((i * 5 + 1) % VOCAB) as i64).collect();
    let ids = Tensor::from_vec(ids, &[4, 5]).unwrap();
    let labels = Tensor::from_vec(labels, &[4, 5]).unwrap();
    let layouts: &[(usize, usize, usize)] = if g.size() == 8 {
        &[(2, 2, 2)]
    } else {
        &[(2, 2, 1), (1, 2, 2), (2, 1, 2)]
    };
    for &(dp, mp, pp) in layouts {
        let strategy = DistributedStrategy {
            dp_degree: dp,
            mp_degree: mp,
            pp_degree: pp,
            accumulate_steps: 2,
            micro_batch_size: 2 / dp,
        };
        let hy = init_hybrid(&g, strategy).unwrap();
        let (d, p, m) = hy.coords();
        assert_eq!(g.rank(), (d * pp + p) * mp + m);
        oar::seed(11);
        let plain = PipelineLayer::new(gpt_descs(&me), &me).unwrap();
        oar::seed(11);
        let model = PipelineLayer::new(gpt_descs(&hy.mp), &hy.pp)
            .unwrap()
            .data_parallel(&hy.dp)
            .unwrap();
        let mut opt_plain = SGD::new(plain.named_parameters(), 0.1);
        let mut opt = SGD::new(model.named_parameters(), 0.1);
        let rows = hy.data_slice(4).unwrap();
        let (lo, hi) = (rows.start as i64, rows.end as i64);
        let (my_ids, my_labels) = (ids.slice(0, lo, hi, 1).unwrap(), labels.slice(0, lo, hi, 1).unwrap());
        let mp_group = hy.mp.clone();
        let loss = move |h: &Tensor, t: &Tensor| {
            oar::distributed::parallel_cross_entropy(h, &t.reshape(&[-1])?, &mp_group, Reduction::Mean)
        };
        let whole = |h: &Tensor, t: &Tensor| cross_entropy(h, &t.reshape(&[-1])?, Reduction::Mean);
        for step in 0..5 {
            let want = plain.train_batch(&ids, &labels, 1, whole, &mut opt_plain).unwrap();
            let got = model
                .train_batch(&my_ids, &my_labels, strategy.accumulate_steps / dp, &loss, &mut opt)
                .unwrap();
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "dp {dp} mp {mp} pp {pp}, step {step}, rank {}: loss {got} vs {want}",
                g.rank()
            );
        }
        let full: std::collections::BTreeMap<String, Tensor> = plain.named_parameters().into_iter().collect();
        for (name, t) in model.named_parameters() {
            assert_is_slice(&format!("dp {dp} mp {mp} pp {pp}: {name}"), &t, &full[&name], m, 1e-5);
        }
    }
    finished(&g);
}

/// Sharded checkpoints reshard: a tiny GPT trained at dp 2 × mp 2 on 4 ranks and saved (each
/// rank its part) loads at mp 4 and at mp 1, where it gives the same loss (1e-5) and holds the
/// whole tensors the mp 2 parts are slices of (exactly); a checkpoint of another model is
/// refused naming the entries, and a second save replaces the first.
#[test]
fn sharded_checkpoints_reshard() {
    if !under_mpirun() {
        launch("sharded_checkpoints_reshard", 4);
        return;
    }
    use oar::distributed::{DistributedStrategy, init_hybrid, load_sharded, save_sharded};
    use oar::optimizer::SGD;
    let g = oar::distributed::init().unwrap();
    let me = solo(&g);
    let dir = std::path::PathBuf::from(std::env::var_os("OAR_TEST_MARKS").unwrap()).join("ckpt");
    let (ids, labels) = tokens();
    let strategy = DistributedStrategy {
        dp_degree: 2,
        mp_degree: 2,
        ..Default::default()
    };
    let hy = init_hybrid(&g, strategy).unwrap();
    let saved = TinyGpt::new(&hy.mp);
    let mut opt = SGD::new(saved.named_parameters(), 0.1);
    for _ in 0..2 {
        saved.loss(&ids, &labels).unwrap().backward().unwrap();
        opt.step().unwrap();
        opt.clear_grad();
    }
    let want = saved.loss(&ids, &labels).unwrap().item().unwrap();
    save_sharded(&saved, &dir, &g).unwrap();
    let close = |a: f64| (a - want).abs() <= 1e-5 * want.abs();
    for (what, group) in [("mp 4", g.clone()), ("mp 1", me.clone())] {
        let fresh = TinyGpt::new(&group);
        let before = fresh.loss(&ids, &labels).unwrap().item().unwrap();
        assert!(!close(before), "{what}: the untrained model already gives {before}");
        load_sharded(&fresh, &dir).unwrap();
        let got = fresh.loss(&ids, &labels).unwrap().item().unwrap();
        assert!(close(got), "{what}, rank {}: loss {got} vs {want}", g.rank());
        if group.size() == 1 {
            let whole: std::collections::BTreeMap<String, Tensor> = fresh.named_parameters().into_iter().collect();
            for (name, t) in saved.named_parameters() {
                assert_is_slice(&name, &t, &whole[&name], hy.mp.rank(), 0.0);
            }
        }
    }
    let e = load_sharded(&mlp(3), &dir).unwrap_err().to_string();
    assert!(e.contains("missing `0.weight`"), "{e}");
    // A second save (of the loaded-at-mp-4 layout) replaces the first.
    let wide = TinyGpt::new(&g);
    save_sharded(&wide, &dir, &g).unwrap();
    let back = TinyGpt::new(&me);
    load_sharded(&back, &dir).unwrap();
    let fresh = wide.loss(&ids, &labels).unwrap().item().unwrap();
    let got = back.loss(&ids, &labels).unwrap().item().unwrap();
    assert!((got - fresh).abs() <= 1e-5 * fresh.abs(), "{got} vs {fresh}");
    assert!(!dir.join("next").exists() && !dir.join("old").exists());
    finished(&g);
}

/// Paddle's fleet API on 2 ranks: `fleet::init` with dp 2, `distributed_model` (replicas from
/// different weights) and `distributed_optimizer` (averaging inside `step`), with gradients
/// accumulated over two half-batches before each step (no explicit synchronisation): five
/// Adam steps equal one process at batch 12, within 1e-5.
#[test]
fn fleet_api_equals_one_process() {
    if !under_mpirun() {
        launch("fleet_api_equals_one_process", 2);
        return;
    }
    use oar::distributed::{DistributedStrategy, fleet};
    let f = fleet::init(DistributedStrategy {
        dp_degree: 2,
        ..Default::default()
    })
    .unwrap();
    let g = f.world().clone();
    let r = g.rank();
    let single = mlp(100);
    let mut opt = Adam::new(single.named_parameters(), 1e-2);
    let model = f.distributed_model(mlp(100 + r as u64)).unwrap();
    let mut dopt = f.distributed_optimizer(Adam::new(model.named_parameters(), 1e-2));
    let loader = DataLoader::new(data()).batch_size(12).shuffle(true).seed(9);
    for b in loader.iter().take(5) {
        let b = b.unwrap();
        cross_entropy(&single.forward(&b[0]).unwrap(), &b[1], Reduction::Mean)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        opt.clear_grad();
        // This rank's half of the batch, in two accumulated quarters.
        for q in 0..2 {
            let lo = (r * 6 + q * 3) as i64;
            let (x, y) = (
                b[0].slice(0, lo, lo + 3, 1).unwrap(),
                b[1].slice(0, lo, lo + 3, 1).unwrap(),
            );
            let l = cross_entropy(&model.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
            (&l * 0.5).unwrap().backward().unwrap();
        }
        dopt.step().unwrap();
        dopt.clear_grad();
    }
    assert_params_close("fleet", &model, &single);
    finished(&g);
}

/// The SPMD partitioning pass against the eager path on 2 and 4 ranks: one traced training step
/// of an MLP (Adam), partitioned by annotations only, trains as one process does for five
/// steps (loss and parameters within 1e-5):
/// - data parallel: the batch inputs split along axis 0 (each rank feeds its rows); the pass
///   turns the weight gradients' contractions over the batch into partial sums and all-reduces
///   them;
/// - tensor parallel: the first layer split by columns, the second by rows (Megatron); each
///   rank's weight shards are slices of the eager weights.
#[test]
fn spmd_pass_equals_eager() {
    if !under_mpirun() {
        for n in [2, 4] {
            launch("spmd_pass_equals_eager", n);
        }
        return;
    }
    use oar::jit::{InputSpec, to_static_train_step};
    use oar::passes::Sharding;
    let g = oar::distributed::init().unwrap();
    let (r, n) = (g.rank(), g.size());
    let batch = 12;
    let make = || {
        oar::seed(100);
        Sequential::new()
            .add(Linear::new(6, 16).unwrap())
            .add(ReLU)
            .add(Linear::new(16, 4).unwrap())
    };
    let data = |step: u64| {
        oar::seed(500 + step);
        let x = oar::randn(&[batch, 6], DType::F32).unwrap();
        let y = Tensor::from_vec((0..batch).map(|i| ((i as u64 + step) % 4) as i64).collect(), &[batch]).unwrap();
        (x, y)
    };
    let specs = [
        InputSpec::new(&[Some(batch), Some(6)], DType::F32, "x"),
        InputSpec::new(&[Some(batch)], DType::I64, "y"),
    ];
    let dp: std::collections::BTreeMap<String, Sharding> = [
        ("x".to_string(), Sharding::Split(0)),
        ("y".to_string(), Sharding::Split(0)),
    ]
    .into();
    let tp: std::collections::BTreeMap<String, Sharding> = [
        ("0.weight".to_string(), Sharding::Split(1)),
        ("0.bias".to_string(), Sharding::Split(0)),
        ("2.weight".to_string(), Sharding::Split(0)),
    ]
    .into();
    for (what, shardings) in [("data parallel", dp), ("tensor parallel", tp)] {
        let eager = make();
        let mut opt_e = Adam::new(eager.named_parameters(), 1e-2);
        let traced = make();
        let mut opt_t = Adam::new(traced.named_parameters(), 1e-2);
        let step = to_static_train_step(&traced, &mut opt_t, &specs, |xs| {
            cross_entropy(&traced.forward(&xs[0])?, &xs[1], Reduction::Mean)
        })
        .unwrap();
        let part = step.partition(&g, &shardings).unwrap();
        let text = part.graph().to_string();
        let collectives = ["all_reduce_sum", "all_gather", "reduce_scatter", "all_reduce_max"]
            .iter()
            .map(|c| text.matches(c).count())
            .sum::<usize>();
        // The fewest there can be. Data parallel: one all-reduce per weight gradient (4) and
        // one for the loss. Tensor parallel: the partial sums of the row-parallel product; the
        // gradient of the input, which would need the other one, is not computed.
        let expected = if what == "data parallel" { 5 } else { 1 };
        assert_eq!(collectives, expected, "{what}: {collectives} collectives:\n{text}");
        let rows = (batch / n) as i64;
        for s in 0..5 {
            let (x, y) = data(s);
            let want = cross_entropy(&eager.forward(&x).unwrap(), &y, Reduction::Mean).unwrap();
            want.backward().unwrap();
            opt_e.step().unwrap();
            opt_e.clear_grad();
            let (xi, yi) = if what == "data parallel" {
                let lo = r as i64 * rows;
                (
                    x.slice(0, lo, lo + rows, 1).unwrap(),
                    y.slice(0, lo, lo + rows, 1).unwrap(),
                )
            } else {
                (x, y)
            };
            let got = part.call(&[&xi, &yi]).unwrap().remove(0).item().unwrap();
            let want = want.item().unwrap();
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "{what}, step {s}, rank {r}: loss {got} vs {want}"
            );
        }
        let weights = part.weights();
        for (name, p) in eager.named_parameters() {
            let mine = Tensor::from_data(weights[&name].clone());
            assert_is_slice(&format!("{what}: {name}"), &mine, &p, r, 1e-5);
        }
    }
    finished(&g);
}
