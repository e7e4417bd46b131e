//! `oar::ps` (feature `ps`) against training in one process: parameter-server shards in this
//! process (gRPC on localhost), models whose embeddings (and, through `PsTrainer`, dense
//! parameters) live on them, trainers on threads.

use oar::Tensor;
use oar::metric::{Auc, Metric};
use oar::nn::functional::binary_cross_entropy_with_logits;
use oar::nn::functional::{Reduction, cross_entropy};
use oar::nn::{Embedding, Layer, Linear};
use oar::optimizer::{Optimizer, SGD};
use oar::ps::{
    DensePart, HeterLink, Mode, PsClient, PsTrainer, RunningServer, ServerConfig, ServerOptimizer, SparseEmbedding,
    Strategy, TableConfig, serve_heter,
};
use std::sync::Arc;
use std::time::Duration;

const VOCAB: usize = 20;
const DIM: usize = 4;

fn server(shards: u32) -> Vec<RunningServer> {
    (0..shards)
        .map(|s| {
            let config = ServerConfig {
                shard: s,
                num_shards: shards,
                tables: vec![TableConfig::sparse("emb", DIM, oar_ps_sgd(0.5))],
                snapshot_dir: None,
                snapshot_every: 0,
                snapshot_secs: 0,
            };
            RunningServer::start(config, ([127, 0, 0, 1], 0).into()).unwrap()
        })
        .collect()
}

fn oar_ps_sgd(lr: f32) -> ServerOptimizer {
    ServerOptimizer::Sgd { lr }
}

fn head() -> Linear {
    fixed_linear(DIM, 3)
}

/// A `Linear` whose initial values do not depend on the global generator, which the tests
/// running beside this one draw from too.
fn fixed_linear(inputs: usize, outputs: usize) -> Linear {
    let l = Linear::new(inputs, outputs).unwrap();
    for (k, p) in l.parameters().iter().enumerate() {
        let v: Vec<f32> = (0..p.numel()).map(|i| 0.3 * ((i * 7 + k * 3) as f32).sin()).collect();
        p.set_data(oar::ir::TensorData::from_vec(p.shape(), v).unwrap())
            .unwrap();
    }
    l
}

/// Mean of the rows of each sequence, then the head: `[B, S]` ids to `[B, 3]` logits.
fn logits(emb: &dyn Layer, head: &Linear, ids: &Tensor) -> Tensor {
    head.forward(&emb.forward(ids).unwrap().mean(&[1], false).unwrap())
        .unwrap()
}

#[test]
fn a_server_side_embedding_trains_as_a_local_one() {
    let servers = server(2);
    let endpoints: Vec<String> = servers.iter().map(|s| format!("http://{}", s.addr())).collect();
    let client = Arc::new(PsClient::connect(&endpoints, Duration::from_secs(10)).unwrap());
    let sparse = SparseEmbedding::new(client.clone(), "emb", DIM).unwrap();
    // The local table starts from the server's rows (pulling them creates them).
    let all: Vec<u64> = (0..VOCAB as u64).collect();
    let (_, start) = client.pull_sparse("emb", &all, true).unwrap();
    let local = Embedding::new(VOCAB, DIM).unwrap();
    local
        .weight()
        .set_data(oar::ir::TensorData::from_vec(vec![VOCAB, DIM], start).unwrap())
        .unwrap();
    let (head_l, head_s) = (head(), head());
    let named = |prefix: &str, l: &dyn Layer| -> Vec<(String, Tensor)> {
        l.named_parameters()
            .into_iter()
            .map(|(k, t)| (format!("{prefix}.{k}"), t))
            .collect()
    };
    let mut opt_l = SGD::new([named("emb", &local), named("head", &head_l)].concat(), 0.5);
    let mut opt_s = SGD::new(head_s.named_parameters(), 0.5);
    for step in 0..4 {
        let ids: Vec<i64> = (0..30).map(|i| ((i * 7 + step * 3) % VOCAB) as i64).collect();
        let ids = Tensor::from_vec(ids, &[6, 5]).unwrap();
        let y = Tensor::from_vec((0..6).map(|i| ((i + step) % 3) as i64).collect(), &[6]).unwrap();
        let want = cross_entropy(&logits(&local, &head_l, &ids), &y, Reduction::Mean).unwrap();
        want.backward().unwrap();
        opt_l.step().unwrap();
        opt_l.clear_grad();
        let got = cross_entropy(&logits(&sparse, &head_s, &ids), &y, Reduction::Mean).unwrap();
        got.backward().unwrap();
        sparse.push_gradients().unwrap();
        opt_s.step().unwrap();
        opt_s.clear_grad();
        let (a, b) = (got.item().unwrap(), want.item().unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs(), "step {step}: loss {a} vs {b}");
    }
    let (_, rows) = client.pull_sparse("emb", &all, false).unwrap();
    let want = local.weight().to_vec::<f32>().unwrap();
    for (a, b) in rows.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    // Evaluation: unknown ids read as zeros and are not created; nothing is left to push.
    let mut eval = sparse;
    eval.set_training(false);
    let out = oar::with_no_grad(|| {
        eval.forward(&Tensor::from_vec(vec![1000i64, 3], &[2]).unwrap())
            .unwrap()
    });
    assert_eq!(&out.to_vec::<f32>().unwrap()[..DIM], &[0.0; DIM]);
    eval.push_gradients().unwrap();
    let rows: u64 = client.info().unwrap().iter().map(|i| i.tables[0].rows).sum();
    assert_eq!(rows, VOCAB as u64);
    let e = eval
        .forward(&Tensor::from_vec(vec![0.5f32], &[1]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("integers"), "{e}");
}

fn start_servers(shards: u32, tables: &[TableConfig]) -> (Vec<RunningServer>, Vec<String>) {
    let servers: Vec<RunningServer> = (0..shards)
        .map(|s| {
            RunningServer::start(
                ServerConfig::new(s, shards, tables.to_vec()),
                ([127, 0, 0, 1], 0).into(),
            )
            .unwrap()
        })
        .collect();
    let endpoints = servers.iter().map(|s| format!("http://{}", s.addr())).collect();
    (servers, endpoints)
}

/// The batch of 8 sequences of 5 ids and 3-class labels at `step`.
fn batch(step: usize) -> (Vec<i64>, Vec<i64>) {
    let ids = (0..40).map(|i| ((i * 7 + step * 3 + i / 5) % VOCAB) as i64).collect();
    let y = (0..8).map(|i| ((i + step) % 3) as i64).collect();
    (ids, y)
}

/// The reference: one process training a local `Embedding` started from `start` and the head
/// on the whole batches (SGD 0.5, 4 steps).
fn one_process(start: Vec<f32>) -> (Embedding, Linear) {
    let local = Embedding::new(VOCAB, DIM).unwrap();
    local
        .weight()
        .set_data(oar::ir::TensorData::from_vec(vec![VOCAB, DIM], start).unwrap())
        .unwrap();
    let head_l = head();
    let mut params = local.named_parameters();
    params.extend(
        head_l
            .named_parameters()
            .into_iter()
            .map(|(k, t)| (format!("head.{k}"), t)),
    );
    let mut opt = SGD::new(params, 0.5);
    for step in 0..4 {
        let (ids, y) = batch(step);
        let ids = Tensor::from_vec(ids, &[8, 5]).unwrap();
        let loss = cross_entropy(
            &logits(&local, &head_l, &ids),
            &Tensor::from_vec(y, &[8]).unwrap(),
            Reduction::Mean,
        )
        .unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.clear_grad();
    }
    (local, head_l)
}

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5, "{what}: {x} vs {y}");
    }
}

/// The head on a heter trainer: mean rows `[4, DIM]` and labels in, cross-entropy out.
struct Head {
    layer: Linear,
    device: oar::Device,
}

impl DensePart for Head {
    fn forward(&mut self, inputs: &[Tensor], _train: bool) -> oar::Result<(Tensor, Vec<Tensor>)> {
        assert!(
            inputs.iter().all(|x| x.device() == self.device),
            "inputs on the heter device"
        );
        let logits = self.layer.forward(&inputs[0])?;
        let loss = cross_entropy(&logits, &inputs[1].cast(oar::ir::DType::I64)?, Reduction::Mean)?;
        Ok((loss, vec![logits]))
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.layer.parameters()
    }
}

/// Heterogeneous trainers: two CPU trainers (threads, sync mode) look the ids up on the
/// servers and send the mean rows to one heter trainer, which runs the head on another device
/// — `emu`, host memory with every kernel compiled by the cpu (Cranelift) backend — with its
/// parameters in a dense table sized by its first INIT. After 4 steps every row and the head
/// equal one process (1e-5), and evaluation through the heter trainer gives its logits.
#[test]
fn a_heter_split_trains_as_one_process() {
    let cpu = oar::backend::get("cpu").unwrap();
    let runtime = Arc::new(oar::device::HostRuntime::new("emu", 1, cpu));
    oar::device::register_runtime(runtime.clone());
    let emu = oar::Device::new("emu", 0);
    let tables = [
        TableConfig::sparse("emb", DIM, oar_ps_sgd(0.5)),
        TableConfig::from_spec("head,dense,opt=sgd,lr=0.5").unwrap(),
    ];
    let (servers, endpoints) = start_servers(2, &tables);
    let all: Vec<u64> = (0..VOCAB as u64).collect();
    let probe = Arc::new(PsClient::connect(&endpoints, Duration::from_secs(10)).unwrap());
    let (_, start) = probe.pull_sparse("emb", &all, true).unwrap();
    let (local, head_l) = one_process(start);

    let layer = head();
    layer.to(&emu).unwrap();
    let part = Head {
        layer,
        device: emu.clone(),
    };
    let heter = serve_heter(
        move || Ok(part),
        probe.clone(),
        "head",
        emu,
        2,
        ([127, 0, 0, 1], 0).into(),
    )
    .unwrap();
    let at = format!("http://{}", heter.addr());
    let trainers: Vec<_> = (0..2u32)
        .map(|t| {
            let (endpoints, at) = (endpoints.clone(), at.clone());
            std::thread::spawn(move || {
                let client = Arc::new(PsClient::connect(&endpoints, Duration::from_secs(20)).unwrap());
                let trainer = PsTrainer::new(client, Strategy::new(Mode::Sync, t, 2).unwrap()).unwrap();
                let emb = trainer.sparse_embedding("emb", DIM).unwrap();
                let link = HeterLink::connect(&at, Duration::from_secs(20)).unwrap();
                for step in 0..4 {
                    let (ids, y) = batch(step);
                    let half = t as usize * 4;
                    let ids = Tensor::from_vec(ids[half * 5..(half + 4) * 5].to_vec(), &[4, 5]).unwrap();
                    let y: Vec<f32> = y[half..half + 4].iter().map(|&c| c as f32).collect();
                    let x = emb.forward(&ids).unwrap().mean(&[1], false).unwrap();
                    let y = Tensor::from_vec(y, &[4]).unwrap();
                    link.step(&[("x", &x, true), ("y", &y, false)], true).unwrap();
                    trainer.step(&[&emb]).unwrap();
                }
                // Evaluation: the head's logits come back; nothing is learnt.
                let ids = Tensor::from_vec(vec![1i64, 2, 3, 4, 5], &[1, 5]).unwrap();
                let x = oar::with_no_grad(|| emb.forward(&ids).unwrap().mean(&[1], false).unwrap());
                let out = link.step(
                    &[
                        ("x", &x, true),
                        ("y", &Tensor::from_vec(vec![0f32], &[1]).unwrap(), false),
                    ],
                    false,
                );
                (x, out.unwrap().outputs.remove(0))
            })
        })
        .collect();
    let evals: Vec<(Tensor, Tensor)> = trainers.into_iter().map(|t| t.join().unwrap()).collect();
    let (_, rows) = probe.pull_sparse("emb", &all, false).unwrap();
    assert_close(&rows, &local.weight().to_vec::<f32>().unwrap(), "rows");
    let want: Vec<f32> = head_l
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec::<f32>().unwrap())
        .collect();
    assert_close(&probe.pull_dense("head").unwrap(), &want, "head");
    for (x, logits) in &evals {
        let expect = head_l.forward(x).unwrap().to_vec::<f32>().unwrap();
        assert_close(&logits.to_vec::<f32>().unwrap(), &expect, "eval logits");
    }
    assert!(runtime.compiles() > 0, "the head ran on the emu device");
    heter.stop().unwrap();
    drop(servers);
}

/// Sync mode: two trainers on threads, each with half of every batch, their embedding on 2
/// shards and their head in a dense table (both SGD on the servers), end where one process
/// training on the whole batches ends: the same rows and head after 4 steps (1e-5). Trainer 0
/// runs on the CPU, trainer 1 wholly on a device (`dev`: host memory, kernels compiled by the
/// cpu backend): kinds of trainers mix in one job.
#[test]
fn sync_trainers_train_as_one_process() {
    let cpu = oar::backend::get("cpu").unwrap();
    let runtime = Arc::new(oar::device::HostRuntime::new("dev", 1, cpu));
    oar::device::register_runtime(runtime.clone());
    let tables = [
        TableConfig::sparse("emb", DIM, oar_ps_sgd(0.5)),
        TableConfig::dense("head", DIM * 3 + 3, oar_ps_sgd(0.5)),
    ];
    let (servers, endpoints) = start_servers(2, &tables);
    let all: Vec<u64> = (0..VOCAB as u64).collect();
    let probe = PsClient::connect(&endpoints, Duration::from_secs(10)).unwrap();
    let (_, start) = probe.pull_sparse("emb", &all, true).unwrap();

    let (local, head_l) = one_process(start);

    // Two trainers, half a batch each.
    let trainers: Vec<_> = (0..2u32)
        .map(|t| {
            let endpoints = endpoints.clone();
            std::thread::spawn(move || {
                let client = Arc::new(PsClient::connect(&endpoints, Duration::from_secs(20)).unwrap());
                let trainer = PsTrainer::new(client, Strategy::new(Mode::Sync, t, 2).unwrap()).unwrap();
                let device = if t == 0 {
                    oar::Device::CPU
                } else {
                    oar::Device::new("dev", 0)
                };
                let emb = trainer.sparse_embedding("emb", DIM).unwrap().on(&device);
                let head = head();
                head.to(&device).unwrap();
                trainer.bind_dense("head", head.parameters()).unwrap();
                for step in 0..4 {
                    let (ids, y) = batch(step);
                    let half = t as usize * 4;
                    let ids = Tensor::from_vec(ids[half * 5..(half + 4) * 5].to_vec(), &[4, 5]).unwrap();
                    let y = Tensor::from_vec(y[half..half + 4].to_vec(), &[4])
                        .unwrap()
                        .to(&device)
                        .unwrap();
                    cross_entropy(&logits(&emb, &head, &ids), &y, Reduction::Mean)
                        .unwrap()
                        .backward()
                        .unwrap();
                    trainer.step(&[&emb]).unwrap();
                }
                assert!(head.parameters().iter().all(|p| p.device() == device));
                head.parameters()
                    .iter()
                    .flat_map(|p| p.to(&oar::Device::CPU).unwrap().to_vec::<f32>().unwrap())
                    .collect::<Vec<f32>>()
            })
        })
        .collect();
    let heads: Vec<Vec<f32>> = trainers.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(runtime.compiles() > 0, "trainer 1 ran on the device");
    let want: Vec<f32> = head_l
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec::<f32>().unwrap())
        .collect();
    let close = |a: &[f32], b: &[f32], what: &str| {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5, "{what}: {x} vs {y}");
        }
    };
    for h in &heads {
        close(h, &want, "head");
    }
    let (_, rows) = probe.pull_sparse("emb", &all, false).unwrap();
    close(&rows, &local.weight().to_vec::<f32>().unwrap(), "rows");
    drop(servers);
}

/// Click data with a planted teacher: `FIELDS` categorical fields of `IDS` ids (small ids
/// frequent), the click drawn from a logistic model of a per-id effect.
const FIELDS: usize = 4;
const IDS: u64 = 200;

struct Clicks {
    ids: Vec<i64>,
    y: Vec<f32>,
}

fn clicks(n: usize, seed: u64) -> Clicks {
    let mut s = seed;
    let mut uniform = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let effect = |f: usize, id: u64| {
        let h = oar::ir::ops::random_stream::mix64(((f as u64) << 32) ^ id ^ 0x5eed);
        1.5 * ((h >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 2.0
    };
    let (mut ids, mut y) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let mut logit = -0.7;
        for f in 0..FIELDS {
            let id = ((IDS as f64).powf(uniform()) - 1.0) as u64;
            logit += effect(f, id);
            ids.push((f as u64 * IDS + id) as i64);
        }
        y.push(f32::from(uniform() < 1.0 / (1.0 + (-logit).exp())));
    }
    Clicks { ids, y }
}

/// Train a logistic model of the fields' embeddings (dim 4) with `trainers` trainers in
/// `mode`, each on its share of the batches; the held-out AUC.
fn train_ctr(mode: Mode, trainers: u32, train: &Arc<Clicks>, test: &Clicks) -> f64 {
    let adagrad = ServerOptimizer::Adagrad {
        lr: 0.2,
        eps: 1e-6,
        initial: 0.1,
    };
    let tables = [
        TableConfig::sparse("emb", 4, adagrad),
        TableConfig::dense("head", FIELDS * 4 + 1, adagrad),
    ];
    let (servers, endpoints) = start_servers(2, &tables);
    let batch = 64;
    let rows = train.y.len();
    let run = |t: u32| {
        let (endpoints, train) = (endpoints.clone(), train.clone());
        std::thread::spawn(move || {
            let client = Arc::new(PsClient::connect(&endpoints, Duration::from_secs(20)).unwrap());
            let trainer = PsTrainer::new(client, Strategy::new(mode, t, trainers).unwrap()).unwrap();
            let emb = trainer.sparse_embedding("emb", 4).unwrap();
            let head = fixed_linear(FIELDS * 4, 1);
            trainer.bind_dense("head", head.parameters()).unwrap();
            let slice = |b: usize| {
                let (lo, hi) = (b * batch, ((b + 1) * batch).min(rows));
                (
                    Tensor::from_vec(train.ids[lo * FIELDS..hi * FIELDS].to_vec(), &[hi - lo, FIELDS]).unwrap(),
                    Tensor::from_vec(train.y[lo..hi].to_vec(), &[hi - lo, 1]).unwrap(),
                )
            };
            let mine: Vec<usize> = (0..rows.div_ceil(batch))
                .filter(|b| b % trainers as usize == t as usize)
                .collect();
            for _epoch in 0..3 {
                for (k, &b) in mine.iter().enumerate() {
                    let (ids, y) = slice(b);
                    let x = emb.forward(&ids).unwrap().flatten(1, -1).unwrap();
                    binary_cross_entropy_with_logits(&head.forward(&x).unwrap(), &y, Reduction::Mean)
                        .unwrap()
                        .backward()
                        .unwrap();
                    trainer.step(&[&emb]).unwrap();
                    // The next batch's rows are pulled while this trainer waits or computes.
                    if mode != Mode::Sync
                        && let Some(&next) = mine.get(k + 1)
                    {
                        emb.prefetch(&slice(next).0).unwrap();
                    }
                }
            }
            trainer.flush(&[&emb]).unwrap();
            (emb, head, trainer)
        })
    };
    let handles: Vec<_> = (0..trainers).map(run).collect();
    let mut done: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Evaluate with trainer 0's layers, its dense parameters brought up to date.
    let (mut emb, head, trainer) = done.remove(0);
    let values = trainer.client().pull_dense("head").unwrap();
    let w = Tensor::from_vec(values[..FIELDS * 4].to_vec(), &[FIELDS * 4, 1]).unwrap();
    let b = Tensor::from_vec(values[FIELDS * 4..].to_vec(), &[1]).unwrap();
    let _ = head;
    emb.set_training(false);
    let n = test.y.len();
    let p = oar::with_no_grad(|| {
        let x = emb
            .forward(&Tensor::from_vec(test.ids.clone(), &[n, FIELDS]).unwrap())
            .unwrap()
            .flatten(1, -1)
            .unwrap();
        oar::nn::functional::sigmoid(&(&x.matmul(&w).unwrap() + &b).unwrap()).unwrap()
    });
    let mut auc = Auc::new();
    auc.update(&p, &Tensor::from_vec(test.y.clone(), &[n, 1]).unwrap())
        .unwrap();
    drop(done);
    drop(servers);
    auc.accumulate()[0]
}

/// Async and GEO trainers (2 of them) reach the held-out AUC of one process (a lone sync
/// trainer, which trains as one process does) within 0.005.
#[test]
fn async_and_geo_trainers_reach_the_auc_of_one_process() {
    let train = Arc::new(clicks(20000, 1));
    let test = clicks(3000, 2);
    let one = train_ctr(Mode::Sync, 1, &train, &test);
    let asynchronous = train_ctr(Mode::Async, 2, &train, &test);
    let geo = train_ctr(Mode::Geo { k: 4, lr: 2.0 }, 2, &train, &test);
    eprintln!("AUC: one process {one:.4}, async {asynchronous:.4}, geo {geo:.4}");
    assert!(one > 0.7, "one process reaches only {one}");
    assert!((asynchronous - one).abs() <= 0.005, "async {asynchronous} vs {one}");
    assert!((geo - one).abs() <= 0.005, "geo {geo} vs {one}");
}

/// A compiled training step (`jit::to_static_step`: the lookup, the head, backward and the
/// head's SGD update in one graph, run by the cpu backend) trains as the eager step: the rows
/// come in through `SparseEmbedding::lookup` as a fixed-size block, their gradient comes out
/// and is pushed. Four steps of the same data: losses, rows and head agree (1e-5).
#[test]
fn a_compiled_step_trains_as_the_eager_one() {
    use oar::jit::{InputSpec, to_static_step};
    use oar::nn::functional::embedding;
    let tables = [TableConfig::sparse("emb", DIM, oar_ps_sgd(0.5))];
    let ((eager_servers, eager_at), (compiled_servers, compiled_at)) =
        (start_servers(1, &tables), start_servers(2, &tables));
    let connect = |at: &[String]| Arc::new(PsClient::connect(at, Duration::from_secs(10)).unwrap());
    let (eager_ps, compiled_ps) = (connect(&eager_at), connect(&compiled_at));
    let sparse_e = SparseEmbedding::new(eager_ps.clone(), "emb", DIM).unwrap();
    let sparse_c = SparseEmbedding::new(compiled_ps.clone(), "emb", DIM).unwrap();
    let (head_e, head_c) = (head(), head());
    let mut opt_e = SGD::new(head_e.named_parameters(), 0.5);
    let mut opt_c = SGD::new(head_c.named_parameters(), 0.5);
    const CAP: usize = 30;
    let specs = [
        InputSpec::new(&[Some(CAP), Some(DIM)], oar::ir::DType::F32, "rows"),
        InputSpec::new(&[Some(6), Some(5)], oar::ir::DType::I64, "index"),
        InputSpec::new(&[Some(6)], oar::ir::DType::I64, "y"),
    ];
    let step = to_static_step(&head_c, &specs, |xs| {
        let rows = xs[0].clone().requires_grad_(true)?;
        let e = embedding(&xs[1], &rows)?.mean(&[1], false)?;
        let loss = cross_entropy(&head_c.forward(&e)?, &xs[2], Reduction::Mean)?;
        loss.backward()?;
        opt_c.step()?;
        opt_c.clear_grad();
        let g = rows
            .grad()
            .ok_or_else(|| oar::Error::invalid("test", "no row gradient"))?;
        Ok(vec![loss.detach(), g])
    })
    .unwrap();
    for s in 0..4 {
        let ids: Vec<i64> = (0..30).map(|i| ((i * 7 + s * 3) % VOCAB) as i64).collect();
        let ids = Tensor::from_vec(ids, &[6, 5]).unwrap();
        let y = Tensor::from_vec((0..6).map(|i| ((i + s) % 3) as i64).collect(), &[6]).unwrap();
        let want = cross_entropy(&logits(&sparse_e, &head_e, &ids), &y, Reduction::Mean).unwrap();
        want.backward().unwrap();
        sparse_e.push_gradients().unwrap();
        opt_e.step().unwrap();
        opt_e.clear_grad();

        let lookup = sparse_c.lookup(&ids, CAP).unwrap();
        let out = step.call(&[&lookup.rows, &lookup.index, &y]).unwrap();
        sparse_c.set_lookup_gradient(&lookup, &out[1]).unwrap();
        sparse_c.push_gradients().unwrap();
        let (a, b) = (out[0].item().unwrap(), want.item().unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "step {s}: loss {a} vs {b}");
    }
    let all: Vec<u64> = (0..VOCAB as u64).collect();
    assert_close(
        &compiled_ps.pull_sparse("emb", &all, false).unwrap().1,
        &eager_ps.pull_sparse("emb", &all, false).unwrap().1,
        "rows",
    );
    for (a, b) in head_c.parameters().iter().zip(head_e.parameters()) {
        assert_close(&a.to_vec::<f32>().unwrap(), &b.to_vec::<f32>().unwrap(), "head");
    }
    assert!(
        sparse_c
            .lookup(&Tensor::from_vec((0..40i64).collect(), &[40]).unwrap(), CAP)
            .is_err()
    );
    drop((eager_servers, compiled_servers));
}
