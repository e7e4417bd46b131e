//! A small GPT trained with hybrid parallelism: data parallel × pipeline × tensor parallel
//! (`--dp`, `--pp`, `--mp`, whose product is the number of ranks). The task is a synthetic
//! language whose next token is a fixed function of the current one, `(3t + 1) mod 32`, so a
//! model that learns it drives the loss towards 0 (from ln 32 ≈ 3.47 at the start).
//!
//! ```text
//! cargo build --release --features distributed --example hybrid_gpt
//! oar launch -n 8 target/release/examples/hybrid_gpt -- --dp 2 --mp 2 --pp 2
//! ```
//!
//! The model: a vocabulary-parallel embedding, two tensor-parallel transformer blocks, a
//! column-parallel head and the parallel cross-entropy, cut into pipeline stages (1F1B over
//! `accumulate_steps` micro-batches) and replicated over the data-parallel group. Rank 0
//! prints the loss; every rank exits non-zero unless the last loss is under 0.5.

use clap::Parser;
use oar::distributed::{
    ColumnParallelLinear, DistributedStrategy, LayerDesc, ParallelTransformerLayer, PipelineLayer,
    VocabParallelEmbedding, init_hybrid, parallel_cross_entropy,
};
use oar::nn::{Layer, Reduction};
use oar::optimizer::Adam;
use oar::{Result, Tensor};

const VOCAB: usize = 32;
const WIDTH: usize = 32;
const SEQ: usize = 16;
const BATCH: usize = 16;

#[derive(Parser)]
#[command(about = "Train a small GPT with dp × pp × mp hybrid parallelism")]
struct Args {
    /// Data-parallel replicas.
    #[arg(long, default_value_t = 1)]
    dp: usize,
    /// Tensor-parallel ranks per layer.
    #[arg(long, default_value_t = 1)]
    mp: usize,
    /// Pipeline stages.
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Training steps.
    #[arg(long, default_value_t = 80)]
    steps: usize,
}

/// `[B, S, W]` hidden states as `[B·S, W]` rows for the head.
struct Rows;

impl Layer for Rows {
    fn forward(&self, h: &Tensor) -> Result<Tensor> {
        h.reshape(&[-1, WIDTH as i64])
    }
}

/// `BATCH` sequences of the language, from random first tokens (the same on every rank for a
/// step): the tokens and the next tokens.
fn batch(step: usize) -> Result<(Tensor, Tensor)> {
    oar::seed(1000 + step as u64);
    let starts = oar::rand(&[BATCH], oar::DType::F64)?.to_vec::<f64>()?;
    let (mut ids, mut next) = (Vec::new(), Vec::new());
    for s in starts {
        let mut t = (s * VOCAB as f64) as usize % VOCAB;
        for _ in 0..SEQ {
            ids.push(t as i64);
            t = (3 * t + 1) % VOCAB;
            next.push(t as i64);
        }
    }
    Ok((
        Tensor::from_vec(ids, &[BATCH, SEQ])?,
        Tensor::from_vec(next, &[BATCH, SEQ])?,
    ))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let world = oar::distributed::init()?;
    let strategy = DistributedStrategy {
        dp_degree: args.dp,
        mp_degree: args.mp,
        pp_degree: args.pp,
        accumulate_steps: 4,
        micro_batch_size: BATCH / args.dp.max(1) / 4,
    };
    let hy = init_hybrid(&world, strategy)?;
    let mp = hy.mp.clone();
    let layer = |f: fn(&oar::distributed::ProcessGroup) -> Result<Box<dyn Layer>>| {
        let g = mp.clone();
        LayerDesc::new(move || f(&g))
    };
    let descs = vec![
        layer(|g| Ok(Box::new(VocabParallelEmbedding::new(VOCAB, WIDTH, g)?))),
        layer(|g| Ok(Box::new(ParallelTransformerLayer::new(WIDTH, 4, 4 * WIDTH, g)?))),
        layer(|g| Ok(Box::new(ParallelTransformerLayer::new(WIDTH, 4, 4 * WIDTH, g)?))),
        LayerDesc::new(|| Ok(Rows)),
        layer(|g| Ok(Box::new(ColumnParallelLinear::new(WIDTH, VOCAB, g)?))),
    ];
    oar::seed(0);
    let model = PipelineLayer::new(descs, &hy.pp)?.data_parallel(&hy.dp)?;
    let mut opt = Adam::new(model.named_parameters(), 3e-3);
    let loss = |h: &Tensor, t: &Tensor| parallel_cross_entropy(h, &t.reshape(&[-1])?, &hy.mp, Reduction::Mean);
    let rows = hy.data_slice(BATCH)?;
    let (lo, hi) = (rows.start as i64, rows.end as i64);
    let (d, p, m) = hy.coords();
    if world.rank() == 0 {
        println!(
            "hybrid_gpt: {} ranks as dp {} × pp {} × mp {}; rank 0 is (dp {d}, pp {p}, mp {m}) with layers {:?}",
            world.size(),
            args.dp,
            args.pp,
            args.mp,
            model.stage_layers(p)
        );
    }
    let mut last = f64::NAN;
    for step in 0..args.steps {
        let (x, y) = batch(step)?;
        let (x, y) = (x.slice(0, lo, hi, 1)?, y.slice(0, lo, hi, 1)?);
        last = model.train_batch(&x, &y, strategy.accumulate_steps, loss, &mut opt)?;
        if world.rank() == 0 && (step % 10 == 0 || step + 1 == args.steps) {
            println!("step {step:3}  loss {last:.4}");
        }
    }
    if last.is_nan() || last >= 0.5 {
        return Err(oar::Error::invalid(
            "hybrid_gpt",
            format!("the loss ended at {last:.4}, not under 0.5"),
        ));
    }
    Ok(())
}
