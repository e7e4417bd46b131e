//! Data-parallel training of an MLP on the shipped digits: every rank trains its replica on
//! its share of each batch (`DataLoader::shard`), `DataParallel` averages the gradients, and
//! rank 0 reports the test accuracy: what one process at the full batch gets, up to the last
//! partial batch, which sharding pads by repeating samples from the epoch's start.
//!
//! `oar launch -n 2 target/release/examples/dp_mlp` (or `mpirun -n 2 …`; built with
//! `cargo build --release --features distributed --example dp_mlp`). Without a launcher it
//! trains as a single process. Exits non-zero below 95% test accuracy.

use oar::distributed::{DataParallel, ReduceOp};
use oar::io::DataLoader;
use oar::io::datasets::{Digits, Split};
use oar::nn::functional::{Reduction, cross_entropy};
use oar::nn::{Flatten, Layer, Linear, ReLU, Sequential};
use oar::optimizer::{Adam, Optimizer};
use oar::{Result, Tensor};

const BATCH: usize = 64;

fn main() -> Result<()> {
    let group = oar::distributed::init()?;
    let (rank, world) = (group.rank(), group.size());
    if !BATCH.is_multiple_of(world) {
        return Err(oar::Error::invalid(
            "dp_mlp",
            format!("{world} ranks do not divide the batch of {BATCH}"),
        ));
    }
    oar::seed(0);
    let net = Sequential::new()
        .add(Flatten::new(1, -1))
        .add(Linear::new(64, 128)?)
        .add(ReLU)
        .add(Linear::new(128, 10)?);
    let model = DataParallel::new(net, &group)?;
    let mut opt = Adam::new(model.named_parameters(), 5e-3);
    let train = DataLoader::new(Digits::new(Split::Train)?)
        .batch_size(BATCH / world)
        .shuffle(true)
        .seed(0)
        .shard(rank, world);
    for epoch in 1..=10 {
        let mut total = 0.0;
        for batch in &train {
            let (x, y) = batch?;
            let loss = cross_entropy(&model.forward(&x)?, &y, Reduction::Mean)?;
            loss.backward()?;
            model.sync_gradients()?;
            opt.step()?;
            opt.clear_grad();
            total += group.all_reduce(&loss.detach(), ReduceOp::Avg)?.item()?;
        }
        if rank == 0 && epoch % 5 == 0 {
            println!(
                "epoch {epoch}: mean loss {:.4} over {world} ranks",
                total / train.len() as f64
            );
        }
    }
    let _ng = oar::no_grad();
    let (mut right, mut seen) = (0usize, 0usize);
    for batch in &DataLoader::new(Digits::new(Split::Test)?).batch_size(360) {
        let (x, y) = batch?;
        let pred = model.forward(&x)?.argmax(-1, false)?.to_vec::<i64>()?;
        right += pred.iter().zip(y.to_vec::<i64>()?).filter(|(p, l)| **p == *l).count();
        seen += pred.len();
    }
    let acc = right as f64 / seen as f64;
    // Every replica holds the same weights: check it with one all-reduce of a checksum.
    let sum: f64 = model
        .parameters()
        .iter()
        .map(|p| p.sum(&[], false).and_then(|s| s.item()))
        .sum::<Result<f64>>()?;
    let spread = group
        .all_reduce(&Tensor::from_vec(vec![sum], &[1])?, ReduceOp::Max)?
        .item()?
        - sum;
    if rank == 0 {
        println!(
            "{world} ranks, batch {BATCH} ({} per rank): test accuracy {:.2}%",
            BATCH / world,
            acc * 100.0
        );
    }
    if spread.abs() > 1e-9 * sum.abs().max(1.0) {
        return Err(oar::Error::invalid(
            "dp_mlp",
            format!("rank {rank}'s replica drifted by {spread}"),
        ));
    }
    if acc < 0.95 {
        return Err(oar::Error::invalid(
            "dp_mlp",
            format!("test accuracy {acc:.3} is below 0.95"),
        ));
    }
    Ok(())
}
