//! A training step of an MLP (64-128-10, batch 64, AdamW): eager vs the same step traced into
//! one graph (`jit::to_static_train_step`) and run on the default backend. Prints the median
//! step time of each and their ratio, from the same run.

#[path = "timing.rs"]
mod timing;
use oar::jit::{InputSpec, to_static_train_step};
use oar::nn::functional::cross_entropy;
use oar::nn::{Layer, Linear, ReLU, Reduction, Sequential};
use oar::optimizer::{AdamW, Optimizer};
use oar::{DType, Result, Tensor};
use timing::median_ms;

fn mlp() -> Result<Sequential> {
    Ok(Sequential::new()
        .add(Linear::new(64, 128)?)
        .add(ReLU)
        .add(Linear::new(128, 10)?))
}

fn main() -> Result<()> {
    oar::seed(0);
    let x = oar::randn(&[64, 64], DType::F32)?;
    let y = Tensor::from_vec((0..64).map(|i| i % 10).collect::<Vec<i64>>(), &[64])?;

    let eager = mlp()?;
    let mut opt = AdamW::new(eager.named_parameters(), 1e-3);
    let eager_ms = median_ms(1, 51, || -> Result<()> {
        let loss = cross_entropy(&eager.forward(&x)?, &y, Reduction::Mean)?;
        loss.backward()?;
        opt.step()?;
        opt.clear_grad();
        Ok(())
    })?;

    let model = mlp()?;
    let mut opt = AdamW::new(model.named_parameters(), 1e-3);
    let specs = [
        InputSpec::new(&[None, Some(64)], DType::F32, "x"),
        InputSpec::new(&[None], DType::I64, "y"),
    ];
    let step = to_static_train_step(&model, &mut opt, &specs, |xs| {
        cross_entropy(&model.forward(&xs[0])?, &xs[1], Reduction::Mean)
    })?;
    let nodes = step.graph().node_count();
    let static_ms = median_ms(1, 51, || -> Result<()> {
        step.call(&[&x, &y])?;
        Ok(())
    })?;
    println!("eager step:  {eager_ms:.3} ms (median of 51)");
    println!(
        "static step: {static_ms:.3} ms (median of 51; one graph of {nodes} nodes on the `{}` backend)",
        oar::backend::DEFAULT_BACKEND
    );
    println!("static/eager time ratio: {:.2}", static_ms / eager_ms);
    Ok(())
}
