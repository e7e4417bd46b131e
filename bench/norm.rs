//! layer_norm and softmax over rows, compiled on the `cpu` backend (each one fused kernel with
//! two reduction stages per row, run a block of rows at a time), and the elementwise
//! transcendentals gelu (erf) and tanh (the legalized math), single-threaded.
//! Run through `bench/norm.sh`, which times PyTorch on the same shapes and prints ratios.

use oar::ir::ops::Composite;
use oar::ir::{DType, Float, Graph, Op, TensorType, Weights};
use std::collections::BTreeMap;

#[path = "timing.rs"]
mod timing;
use oar::ir::ops::{Gelu, LayerNorm, Softmax, UnaryOp};
use timing::median_secs;

fn main() -> oar::Result<()> {
    oar::seed(0);
    let cpu = oar::backend::get("cpu")?;
    for (rows, d) in [(4096usize, 768usize), (16384, 128)] {
        for what in ["add", "layer_norm", "softmax", "gelu", "tanh"] {
            let mut g = Graph::new(what);
            let x = g.add_input("x", TensorType::of(DType::F32, &[rows, d]))?;
            let mut w = Weights::new();
            let y = if what == "add" {
                // The floor: one elementwise pass (read x, write y) through the same runtime.
                let one = g.add_scalar(DType::F32, 1.0);
                g.binary(oar::ir::ops::BinaryOp::Add, x, one)?
            } else if what == "layer_norm" {
                let gw = g.add_param("g", TensorType::of(DType::F32, &[d]))?;
                let gb = g.add_param("b", TensorType::of(DType::F32, &[d]))?;
                w.insert("g".into(), oar::randn(&[d], DType::F32)?.data());
                w.insert("b".into(), oar::randn(&[d], DType::F32)?.data());
                let c = Composite::LayerNorm(LayerNorm {
                    normalized_ndim: 1,
                    epsilon: Float(1e-5),
                });
                g.add_op1(Op::Composite(c), &[x, gw, gb])?
            } else if what == "gelu" {
                g.add_op1(Op::Composite(Composite::Gelu(Gelu { approximate: false })), &[x])?
            } else if what == "tanh" {
                g.add_op1(Op::Unary(UnaryOp::Tanh), &[x])?
            } else {
                g.add_op1(Op::Composite(Composite::Softmax(Softmax { axis: 1 })), &[x])?
            };
            g.add_output("y", y)?;
            let exe = cpu.compile(&g, &w)?;
            let inputs = BTreeMap::from([("x".to_string(), oar::randn(&[rows, d], DType::F32)?.data())]);
            let s = median_secs(15, || {
                exe.run(&inputs).expect("compiled kernel");
            });
            // Bytes a single pass moves: read x once, write y once.
            let gbs = 2.0 * (rows * d * 4) as f64 / s / 1e9;
            println!("{what} f32 {rows}x{d}: {:.3} ms, {gbs:.1} GB/s", s * 1e3);
        }
    }
    Ok(())
}
