//! Eager CPU kernel throughput: matmul and conv (im2col + gemm), median of several runs.
//! Run through `bench/kernels.sh`, which also times numpy on the same shapes and prints ratios.

use oar::ir::{DType, Graph, Op, TensorType, Weights};
use oar::tensor::apply_op;
use std::collections::BTreeMap;

#[path = "timing.rs"]
mod timing;
use oar::ir::ops::Conv;
use timing::median_secs;

fn main() -> oar::Result<()> {
    oar::seed(0);
    for n in [256usize, 512, 1024] {
        let a = oar::randn(&[n, n], DType::F32)?;
        let b = oar::randn(&[n, n], DType::F32)?;
        let s = median_secs(7, || {
            apply_op(Op::MatMul, &[&a, &b]).expect("matmul");
        });
        println!(
            "matmul f32 {n}x{n}x{n}: {:.3} ms, {:.1} GFLOP/s",
            s * 1e3,
            2.0 * (n * n * n) as f64 / s / 1e9
        );
    }
    // The same matmuls as a compiled graph on the `cpu` backend (gemm through the runtime's
    // contraction step), inputs passed by name each run as a user would.
    let cpu = oar::backend::get("cpu")?;
    for n in [256usize, 512, 1024] {
        let mut g = Graph::new("matmul");
        let ty = TensorType::of(DType::F32, &[n, n]);
        let a = g.add_input("a", ty.clone())?;
        let b = g.add_input("b", ty)?;
        let y = g.add_op1(Op::MatMul, &[a, b])?;
        g.add_output("y", y)?;
        let exe = cpu.compile(&g, &Weights::new())?;
        let inputs = BTreeMap::from([
            ("a".to_string(), oar::randn(&[n, n], DType::F32)?.data()),
            ("b".to_string(), oar::randn(&[n, n], DType::F32)?.data()),
        ]);
        let s = median_secs(7, || {
            exe.run(&inputs).expect("compiled matmul");
        });
        println!(
            "cpu-backend matmul f32 {n}x{n}x{n}: {:.3} ms, {:.1} GFLOP/s",
            s * 1e3,
            2.0 * (n * n * n) as f64 / s / 1e9
        );
    }
    // A ResNet-18 stage-1 convolution: 64→64 channels, 3×3, 56×56, batch 1.
    let x = oar::randn(&[1, 64, 56, 56], DType::F32)?;
    let w = oar::randn(&[64, 64, 3, 3], DType::F32)?;
    let op = Op::Conv(Conv {
        stride: vec![1, 1],
        pad_before: vec![1, 1],
        pad_after: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    });
    let s = median_secs(7, || {
        apply_op(op.clone(), &[&x, &w]).expect("conv");
    });
    let flops = 2.0 * 64.0 * 56.0 * 56.0 * 64.0 * 9.0;
    println!(
        "conv f32 1x64x56x56 k3 64: {:.3} ms, {:.1} GFLOP/s",
        s * 1e3,
        flops / s / 1e9
    );
    Ok(())
}
