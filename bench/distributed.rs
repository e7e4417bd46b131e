//! Data-parallel training throughput on this machine: a training step (forward, backward,
//! gradient all-reduce, Adam) of an MLP or a CIFAR-size ResNet-18 at a fixed global batch,
//! split over the ranks of the job. Rank 0 prints one line: ranks, model, samples per second
//! (median over timed steps, after warm-ups), the step's all-reduce volume and the ring
//! all-reduce's minimum per rank, 2 (N − 1) / N × gradient bytes.
//!
//! `bench/distributed.sh` runs it on 1 and 2 ranks; alone:
//! `mpirun -n 2 target/release/examples/bench_distributed mlp 20 [overlap]` (`overlap`: the
//! gradients averaged while backward runs, `DataParallel::backward`).

use oar::distributed::{DataParallel, ReduceOp};
use oar::nn::functional::{Reduction, cross_entropy};
use oar::nn::{Layer, Linear, ReLU, Sequential};
use oar::optimizer::{Adam, Optimizer};
use oar::vision::models::resnet18;
use oar::{DType, Result, Tensor};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map_or("mlp", String::as_str);
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    // `overlap`: gradients averaged while backward runs (`DataParallel::backward`).
    let overlap = args.get(2).is_some_and(|s| s == "overlap");
    let group = oar::distributed::init()?;
    let (rank, world) = (group.rank(), group.size());
    oar::seed(0);
    let (net, global, input): (Box<dyn Layer>, usize, Vec<usize>) = match model {
        "mlp" => (
            Box::new(
                Sequential::new()
                    .add(Linear::new(784, 1024)?)
                    .add(ReLU)
                    .add(Linear::new(1024, 1024)?)
                    .add(ReLU)
                    .add(Linear::new(1024, 10)?),
            ),
            256,
            vec![784],
        ),
        "resnet18" => (Box::new(resnet18(10)?), 32, vec![3, 32, 32]),
        other => {
            return Err(oar::Error::invalid(
                "bench_distributed",
                format!("unknown model {other}"),
            ));
        }
    };
    if global % world != 0 {
        return Err(oar::Error::invalid(
            "bench_distributed",
            format!("{world} ranks do not divide {global}"),
        ));
    }
    let local = global / world;
    let net = DataParallel::new(net, &group)?;
    let mut opt = Adam::new(net.named_parameters(), 1e-3);
    let shape: Vec<usize> = std::iter::once(local).chain(input).collect();
    let x = oar::randn(&shape, DType::F32)?;
    let y = Tensor::from_vec((0..local as i64).map(|i| i % 10).collect(), &[local])?;
    let mut times = Vec::with_capacity(steps);
    for step in 0..steps + 3 {
        group.barrier()?;
        let start = Instant::now();
        let loss = cross_entropy(&net.forward(&x)?, &y, Reduction::Mean)?;
        let sync = if overlap {
            // The sync is hidden in backward; what is left of it is not separable.
            net.backward(&loss)?;
            0.0
        } else {
            loss.backward()?;
            let sync_start = Instant::now();
            net.sync_gradients()?;
            sync_start.elapsed().as_secs_f64()
        };
        opt.step()?;
        opt.clear_grad();
        // The step ends when the slowest rank's does.
        let took = group.all_reduce(
            &Tensor::from_vec(vec![start.elapsed().as_secs_f64()], &[1])?,
            ReduceOp::Max,
        )?;
        let sync = group.all_reduce(&Tensor::from_vec(vec![sync], &[1])?, ReduceOp::Max)?;
        if step >= 3 {
            times.push((took.item()?, sync.item()?));
        }
    }
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (median, sync) = times[times.len() / 2];
    let bytes: usize = net.parameters().iter().map(|p| p.numel() * 4).sum();
    let ring = if world > 1 {
        2.0 * (world - 1) as f64 / world as f64 * bytes as f64
    } else {
        0.0
    };
    if rank == 0 {
        println!(
            "{world} {model}{} {:.1} samples/s, step {:.2} ms (gradient sync {:.2} ms), all-reduce {:.2} MB per rank per step (ring minimum {:.2} MB sent)",
            if overlap { " (overlapped)" } else { "" },
            global as f64 / median,
            median * 1e3,
            sync * 1e3,
            if world > 1 { bytes as f64 / 1e6 } else { 0.0 },
            ring / 1e6
        );
    }
    Ok(())
}
