//! Wide&Deep or DeepFM on a parameter server, trained on synthetic Criteo-like click data
//! streamed from files (issue 22's recommendation example).
//!
//! ```sh
//! oar ps gen-data --out data/ctr --rows 1000000 --files 4      # 13 dense + 26 categorical
//! # alone: two shards in this process, one trainer
//! cargo run --release --features ps --example ps_ctr -- --data data/ctr
//! # a job: 2 shard processes, 2 trainer processes
//! oar ps launch --servers 2 --trainers 2 --mode async \
//!     --table wide,sparse,dim=1,opt=adagrad,lr=0.05 --table emb,sparse,dim=8,opt=adagrad,lr=0.05 \
//!     --table dense,dense,opt=adam,lr=0.001 \
//!     -- target/release/examples/ps_ctr --data data/ctr --model deepfm
//! ```
//!
//! The sparse features' rows live on the shards (created on first use, ≥ 10^6 possible ids);
//! the dense parameters live in the dense table; each trainer reads its share of the training
//! files. Every trainer takes the same number of steps (`rows / (trainers · batch)` per
//! epoch), so sync jobs stay in step. Trainer 0 then reports the held-out AUC beside the
//! teacher's (the best reachable AUC, from `test/meta.json`).
//!
//! Options: `--data DIR` (required), `--model wide_deep|deepfm`, `--epochs N` (1), `--batch B`
//! (512), `--embed K` (8, the `emb` table's dim), `--eval-rows N` (all), `--min-auc-gap G`
//! (fail if the AUC is more than G below the teacher's).

use oar::ir::DType;
use oar::metric::{Auc, Metric};
use oar::nn::Layer;
use oar::nn::functional::{Reduction, binary_cross_entropy_with_logits, sigmoid};
use oar::ps::{
    DensePart, HeterLink, PsClient, PsTrainer, RunningServer, ServerConfig, Strategy, TableConfig, serve_heter,
};
use oar::rec::data::{CRITEO_DENSE, CRITEO_FIELDS, CtrBatch, CtrStream};
use oar::rec::models::{CtrConfig, DeepFM, WideDeep};
use oar::{Error, Result, Tensor};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tables the example needs (the same specs `oar ps launch --table` takes).
fn table_specs(embed: usize) -> Vec<String> {
    vec![
        "wide,sparse,dim=1,opt=adagrad,lr=0.2".into(),
        format!("emb,sparse,dim={embed},opt=adagrad,lr=0.2"),
        "dense,dense,opt=adam,lr=0.001".into(),
    ]
}

#[derive(Clone)]
struct Args {
    data: PathBuf,
    model: String,
    epochs: usize,
    batch: usize,
    embed: usize,
    eval_rows: usize,
    min_auc_gap: Option<f64>,
    heter_device: String,
}

fn parse_args() -> Result<Args> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let get = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    let num = |name: &str, default: usize| -> Result<usize> {
        get(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| Error::invalid("ps_ctr", format!("{name} {v} is not a number")))
        })
    };
    Ok(Args {
        data: get("--data")
            .map(PathBuf::from)
            .ok_or_else(|| Error::invalid("ps_ctr", "--data DIR is required (make it with `oar ps gen-data`)"))?,
        model: get("--model").unwrap_or_else(|| "wide_deep".into()),
        epochs: num("--epochs", 1)?,
        batch: num("--batch", 512)?,
        embed: num("--embed", 8)?,
        eval_rows: num("--eval-rows", usize::MAX)?,
        min_auc_gap: get("--min-auc-gap").and_then(|v| v.parse().ok()),
        heter_device: get("--heter-device").unwrap_or_else(|| "emu".into()),
    })
}

/// A number field of a generated `meta.json`.
fn meta_number(dir: &Path, key: &str) -> Result<f64> {
    let path = dir.join("meta.json");
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::invalid("ps_ctr", format!("{}: {e}", path.display())))?;
    let meta: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::invalid("ps_ctr", format!("{}: {e}", path.display())))?;
    meta[key]
        .as_f64()
        .ok_or_else(|| Error::invalid("ps_ctr", format!("{} has no number `{key}`", path.display())))
}

/// Wide&Deep or DeepFM over the tables `wide` and `emb` (the servers', or the rows a heter
/// trainer was sent).
fn model(args: &Args, wide: Box<dyn Layer>, emb: Box<dyn Layer>) -> Result<Box<dyn CtrModel>> {
    let config = CtrConfig {
        field_dims: vec![1; CRITEO_FIELDS],
        dense_dim: CRITEO_DENSE,
        embed_dim: args.embed,
        hidden_sizes: vec![256, 128],
        dropout: 0.0,
    };
    let (w, e) = (wide, emb);
    Ok(match args.model.as_str() {
        "wide_deep" => Box::new(WideDeep::with_tables(&config, w, e)?),
        "deepfm" => Box::new(DeepFM::with_tables(&config, w, e)?),
        m => return Err(Error::invalid("ps_ctr", format!("--model {m}: wide_deep or deepfm"))),
    })
}

/// What the example needs of either model.
trait CtrModel: Layer {
    fn logits(&self, dense: &Tensor, ids: &Tensor) -> Result<Tensor>;
}

impl CtrModel for WideDeep {
    fn logits(&self, dense: &Tensor, ids: &Tensor) -> Result<Tensor> {
        WideDeep::logits(self, dense, ids)
    }
}

impl CtrModel for DeepFM {
    fn logits(&self, dense: &Tensor, ids: &Tensor) -> Result<Tensor> {
        DeepFM::logits(self, dense, ids)
    }
}

/// A table a heter trainer is fed: `forward` gives the rows the CPU trainer sent.
#[derive(Clone, Default)]
struct Fed(Arc<Mutex<Option<Tensor>>>);

impl Layer for Fed {
    fn forward(&self, _ids: &Tensor) -> Result<Tensor> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| Error::invalid("ps_ctr", "no rows were sent"))
    }
}

/// The dense part on a heter trainer: inputs `[wide rows, emb rows, dense, label]`.
struct HeterPart {
    net: Box<dyn CtrModel>,
    wide: Fed,
    emb: Fed,
}

impl DensePart for HeterPart {
    fn forward(&mut self, x: &[Tensor], _train: bool) -> Result<(Tensor, Vec<Tensor>)> {
        if x.len() != 4 {
            return Err(Error::invalid(
                "ps_ctr",
                format!("the heter part takes 4 inputs, got {}", x.len()),
            ));
        }
        *self.wide.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(x[0].clone());
        *self.emb.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(x[1].clone());
        // The tables ignore the ids: any of the right shape.
        let ids = oar::tensor::zeros(&[x[2].shape()[0], CRITEO_FIELDS], DType::I64)?.to(&x[2].device())?;
        let logits = self.net.logits(&x[2], &ids)?;
        let loss = binary_cross_entropy_with_logits(&logits, &x[3], Reduction::Mean)?;
        Ok((loss, vec![sigmoid(&logits)?]))
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.net.parameters()
    }
}

/// A heter trainer (`oar ps launch --heter-trainers H`): serve the dense part on its device
/// until the job stops it.
fn run_heter(args: &Args, deadline: Duration) -> Result<()> {
    let err = |e: oar::ps::PsError| Error::invalid("ps_ctr", e.to_string());
    let endpoints = oar::ps::endpoints_from_env().unwrap_or_default();
    let client = Arc::new(PsClient::connect(&endpoints, deadline).map_err(err)?);
    let strategy = Strategy::from_env()?;
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let (id, heters): (u32, u32) = (
        var("OAR_PS_HETER_ID").parse().unwrap_or(0),
        var("OAR_PS_HETER_TRAINERS").parse().unwrap_or(1),
    );
    let port: u16 = var("OAR_PS_HETER_PORT")
        .parse()
        .map_err(|_| Error::invalid("ps_ctr", "OAR_PS_HETER_PORT is not set"))?;
    // "emu": another device — host memory, every kernel compiled by the cpu (Cranelift)
    // backend — standing in for an accelerator; "gpu" where there is one.
    let device = if args.heter_device == "emu" {
        let cpu = oar::backend::get("cpu")?;
        oar::device::register_runtime(Arc::new(oar::device::HostRuntime::new("emu", 1, cpu)));
        oar::Device::new("emu", 0)
    } else {
        oar::Device::new(&args.heter_device, 0)
    };
    // Sync: the trainers this heter trainer serves send one request each per step.
    let merge = match strategy.mode {
        oar::ps::Mode::Sync => (strategy.trainers / heters).max(1) as usize,
        _ => 1,
    };
    let (config_args, dev) = (args.clone(), device.clone());
    let heter = serve_heter(
        move || {
            oar::seed(1);
            let (wide, emb) = (Fed::default(), Fed::default());
            let net = model(&config_args, Box::new(wide.clone()), Box::new(emb.clone()))?;
            net.to(&dev)?;
            Ok(HeterPart { net, wide, emb })
        },
        client,
        "dense",
        device.clone(),
        merge,
        ([127, 0, 0, 1], port).into(),
    )?;
    eprintln!("heter trainer {id} of {heters}: the dense part on {device}, {merge} request(s) per update, port {port}");
    heter.wait_for_signal().map_err(err)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let deadline = Duration::from_secs(120);
    if std::env::var("OAR_PS_ROLE").as_deref() == Ok("heter") {
        return run_heter(&args, deadline);
    }
    // Under `oar ps launch`: this process's place in the job. Alone: two shards here.
    let mut own_servers: Vec<RunningServer> = Vec::new();
    let trainer = if oar::ps::endpoints_from_env().is_some() {
        PsTrainer::from_env(deadline)?
    } else {
        let tables = table_specs(args.embed)
            .iter()
            .map(|s| TableConfig::from_spec(s))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::invalid("ps_ctr", e.to_string()))?;
        for s in 0..2 {
            let server = RunningServer::start(ServerConfig::new(s, 2, tables.clone()), ([127, 0, 0, 1], 0).into())
                .map_err(|e| Error::invalid("ps_ctr", e.to_string()))?;
            own_servers.push(server);
        }
        let endpoints: Vec<String> = own_servers.iter().map(|s| format!("http://{}", s.addr())).collect();
        let client = PsClient::connect(&endpoints, deadline).map_err(|e| Error::invalid("ps_ctr", e.to_string()))?;
        PsTrainer::new(Arc::new(client), Strategy::from_env()?)?
    };
    let strategy = trainer.strategy();
    let (me, trainers) = (strategy.trainer as usize, strategy.trainers as usize);
    let wide = trainer.sparse_embedding("wide", 1)?;
    let emb = trainer.sparse_embedding("emb", args.embed)?;
    // The dense part: here, or on a heter trainer.
    let heter = HeterLink::from_env(deadline)?;
    let mut net = None;
    if heter.is_none() {
        oar::seed(1);
        let m = model(&args, Box::new(wide.clone()), Box::new(emb.clone()))?;
        trainer.bind_dense("dense", m.parameters())?;
        net = Some(m);
    }
    // One step's loss (training) or probabilities (evaluation) of a batch.
    let run = |b: &CtrBatch, train: bool| -> Result<(f64, Option<Tensor>)> {
        match (&net, &heter) {
            (Some(net), _) => {
                let logits = net.logits(&b.dense, &b.ids)?;
                if !train {
                    return Ok((0.0, Some(sigmoid(&logits)?)));
                }
                let loss = binary_cross_entropy_with_logits(&logits, &b.label, Reduction::Mean)?;
                loss.backward()?;
                Ok((loss.item()?, None))
            }
            (None, Some(link)) => {
                let (w, e) = (wide.forward(&b.ids)?, emb.forward(&b.ids)?);
                let inputs = [
                    ("wide", &w, true),
                    ("emb", &e, true),
                    ("dense", &b.dense, false),
                    ("label", &b.label, false),
                ];
                let r = link.step(&inputs, train)?;
                Ok((f64::from(r.loss), r.outputs.into_iter().next()))
            }
            (None, None) => unreachable!("the dense part is somewhere"),
        }
    };

    let train_dir = args.data.join("train");
    let rows = meta_number(&train_dir, "rows")? as usize;
    let steps = rows / (trainers * args.batch);
    if steps == 0 {
        return Err(Error::invalid(
            "ps_ctr",
            format!(
                "{rows} training rows are too few for {trainers} trainers × batch {}",
                args.batch
            ),
        ));
    }
    let open = || CtrStream::open(&[&train_dir], args.batch)?.shard(me, trainers);
    let mut stream = open()?;
    let mut next = move || -> Result<oar::rec::data::CtrBatch> {
        // A trainer whose share runs out first starts it again, so all take `steps` steps.
        loop {
            match stream.next() {
                Some(b) => return b,
                None => stream = open()?,
            }
        }
    };
    eprintln!(
        "trainer {me} of {trainers} ({:?}): {} on {} rows, {steps} steps of {} per epoch",
        strategy.mode, args.model, rows, args.batch
    );
    let start = Instant::now();
    let mut batch = next()?;
    for epoch in 0..args.epochs {
        let (mut loss_sum, mut seen) = (0.0, 0usize);
        for step in 0..steps {
            let (loss, _) = run(&batch, true)?;
            trainer.step(&[&wide, &emb])?;
            loss_sum += loss;
            seen += batch.rows();
            // Read the next batch and start pulling its rows while the loop goes on (not
            // after the last step: a pull in training creates the rows it asks for).
            if epoch + 1 < args.epochs || step + 1 < steps {
                batch = next()?;
                wide.prefetch(&batch.ids)?;
                emb.prefetch(&batch.ids)?;
            }
            if (step + 1) % 200 == 0 || step + 1 == steps {
                eprintln!(
                    "trainer {me} epoch {epoch} step {}: loss {:.4}, {:.0} samples/s",
                    step + 1,
                    loss_sum / (step + 1) as f64,
                    seen as f64 / start.elapsed().as_secs_f64() * (epoch + 1) as f64
                );
            }
        }
    }
    trainer.flush(&[&wide, &emb])?;
    let secs = start.elapsed().as_secs_f64();
    // The servers' traffic and, with a heter trainer, the activations and gradients to and
    // from it.
    let mut traffic = trainer.client().traffic();
    if let Some(link) = &heter {
        let h = link.traffic();
        traffic.calls += h.calls;
        traffic.sent += h.sent;
        traffic.received += h.received;
    }
    let total_steps = (steps * args.epochs).max(1) as u64;
    // One line per trainer for bench/ps.sh.
    println!(
        "ps_ctr trainer={me} samples={} secs={secs:.3} samples_per_s={:.0} bytes_per_step={} calls_per_step={:.1}",
        steps * args.epochs * args.batch,
        (steps * args.epochs * args.batch) as f64 / secs,
        (traffic.sent + traffic.received) / total_steps,
        traffic.calls as f64 / total_steps as f64,
    );
    // Every trainer's last pushes are in before trainer 0 evaluates.
    trainer
        .client()
        .barrier(strategy.trainers)
        .map_err(|e| Error::invalid("ps_ctr", e.to_string()))?;
    if me != 0 {
        return Ok(());
    }
    // Eval mode for the tables (clones share it): unknown ids read as zeros, create nothing.
    // The dense part has no dropout or batch norm.
    wide.clone().eval();
    emb.clone().eval();
    let test_dir = args.data.join("test");
    let mut auc = Auc::new();
    let mut evaluated = 0;
    for b in CtrStream::open(&[&test_dir], 4096)? {
        let b = b?;
        let p = oar::with_no_grad(|| run(&b, false))?
            .1
            .ok_or_else(|| Error::invalid("ps_ctr", "no probabilities"))?;
        auc.update(&p, &b.label)?;
        evaluated += b.rows();
        if evaluated >= args.eval_rows {
            break;
        }
    }
    let auc = auc.accumulate()[0];
    let teacher = meta_number(&test_dir, "teacher_auc")?;
    let info = trainer
        .client()
        .info()
        .map_err(|e| Error::invalid("ps_ctr", e.to_string()))?;
    let materialised: u64 = info
        .iter()
        .flat_map(|s| s.tables.iter().filter(|t| t.name != "dense").map(|t| t.rows))
        .sum();
    println!(
        "{}: held-out AUC {auc:.4} on {evaluated} rows; the teacher's (best reachable) {teacher:.4}; {materialised} sparse rows on the servers; {:.1} s",
        args.model,
        start.elapsed().as_secs_f64()
    );
    println!("ps_ctr auc={auc:.4} teacher_auc={teacher:.4} rows={materialised}");
    if let Some(gap) = args.min_auc_gap
        && auc < teacher - gap
    {
        return Err(Error::invalid(
            "ps_ctr",
            format!("AUC {auc:.4} is more than {gap} below the teacher's {teacher:.4}"),
        ));
    }
    drop(own_servers);
    Ok(())
}
