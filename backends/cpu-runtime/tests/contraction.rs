//! The runtime's matmul and conv (`Step::Contraction`) against the reference interpreter
//! (`oar_backend_reference::run_kernel_program`) on random inputs: one-kernel programs whose
//! operands are read through transposed, broadcast, sliced, reversed and reshaped index maps.
//!
//! Tolerance: `|got - want| <= tol · max(1, max |want|)` per element, tol 1e-4 for f32 (the
//! runtime accumulates in f32, the reference in f64) and 1e-10 for f64. Every program runs with
//! 1 and 4 threads.
//!
//! `bench_contractions` (ignored) prints throughput: run it with
//! `cargo test --release -p oar-cpu-runtime --test contraction -- --ignored --nocapture`.

use oar_cpu_runtime::{CpuProgram, Model, Step};
use oar_ir::kernel::{
    AffineExpr, Buffer, BufferId, BufferKind, Contraction, ContractionKernel, IndexMap, Inst, Kernel, KernelBody,
    KernelProgram, Load, Operand, ScalarOp,
};
use oar_ir::ops::Conv;
use oar_ir::{DType, Dim, TensorData, TensorType, Weights};
use std::collections::BTreeMap;

/// A deterministic generator of values in [-1, 1) (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

fn dims(s: &[usize]) -> Vec<Dim> {
    s.iter().map(|&d| Dim::Static(d)).collect()
}

/// `offset + Σ coef · i[loop]`.
fn ax(terms: &[(usize, i64)], offset: i64) -> AffineExpr {
    AffineExpr {
        terms: terms.to_vec(),
        offset,
    }
}

/// An operand of `shape` read from buffer `b` (of shape `view`) through `axes`.
fn mapped(b: u32, shape: &[usize], view: &[usize], axes: Vec<AffineExpr>) -> Operand {
    Operand {
        shape: dims(shape),
        load: Load {
            buffer: BufferId(b),
            map: IndexMap { view: dims(view), axes },
        },
        round: None,
    }
}

/// An operand that is its whole buffer `b`.
fn whole(b: u32, shape: &[usize]) -> Operand {
    Operand {
        shape: dims(shape),
        load: Load {
            buffer: BufferId(b),
            map: IndexMap::identity(&dims(shape)),
        },
        round: None,
    }
}

/// A one-kernel program: inputs `a` (b0) and `b` (b1) of the given shapes, output b2 of
/// `out`, the contraction `op(lhs, rhs)` with an identity epilogue.
fn program(
    dtype: DType,
    a: &[usize],
    b: &[usize],
    op: Contraction,
    lhs: Operand,
    rhs: Operand,
    out: &[usize],
) -> KernelProgram {
    let buf = |kind, s: &[usize]| Buffer {
        kind,
        ty: TensorType::new(dtype, dims(s)),
        value: String::new(),
    };
    KernelProgram {
        name: "contraction".into(),
        buffers: vec![
            buf(BufferKind::Input { name: "a".into() }, a),
            buf(BufferKind::Input { name: "b".into() }, b),
            buf(BufferKind::Output, out),
        ],
        kernels: vec![Kernel {
            name: "k0".into(),
            body: KernelBody::Contraction(ContractionKernel {
                op,
                lhs,
                rhs,
                acc_dtype: dtype,
                shape: dims(out),
                loads: vec![],
                epilogue: vec![Inst {
                    op: ScalarOp::Acc(0),
                    dtype,
                }],
            }),
            outputs: vec![BufferId(2)],
        }],
        outputs: vec![("y".into(), BufferId(2))],
    }
}

fn random(dtype: DType, shape: &[usize], rng: &mut Rng) -> TensorData {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.next()).collect();
    TensorData::from_f64_slice(dtype, shape.to_vec(), &v).unwrap()
}

fn model(p: &KernelProgram) -> Result<Model, String> {
    let plan = oar_passes::memory_plan(p, &BTreeMap::new()).map_err(|e| e.to_string())?;
    let prog = CpuProgram {
        program: p.clone(),
        plan,
        steps: vec![Step::Contraction {
            kernel: 0,
            epilogue: None,
            plane_iters: 0,
        }],
        n_funcs: 0,
        regions: Vec::new(),
    };
    Model::new(prog, vec![], &Weights::new()).map_err(|e| e.to_string())
}

fn feeds(p: &KernelProgram, seed: u64) -> BTreeMap<String, TensorData> {
    let mut rng = Rng(seed);
    p.inputs()
        .iter()
        .map(|(name, b)| {
            let ty = &p.buffer(*b).ty;
            (
                name.to_string(),
                random(ty.dtype, &ty.shape.as_static().unwrap(), &mut rng),
            )
        })
        .collect()
}

/// Run `p` on the runtime (1 and 4 threads) and on the reference; compare.
fn check(p: &KernelProgram) {
    let inputs = feeds(p, 7);
    let want = oar_backend_reference::run_kernel_program(p, &Weights::new(), &inputs).expect("reference");
    let want = &want[0].1;
    let tol = if want.dtype() == DType::F32 { 1e-4 } else { 1e-10 };
    let mut m = model(p).expect("model");
    for threads in [1, 4] {
        m.set_threads(threads);
        let got = m.run(&inputs).expect("runtime");
        let got = &got[0].1;
        assert_eq!(got.tensor_type(), want.tensor_type());
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        let scale = w.iter().fold(1.0f64, |a, &x| a.max(x.abs()));
        for (i, (x, y)) in g.iter().zip(&w).enumerate() {
            assert!(
                (x - y).abs() <= tol * scale,
                "{}: element {i} of {:?}: got {x}, want {y} ({threads} threads)",
                p.kernels[0].body_summary(),
                want.shape()
            );
        }
    }
}

/// A short description of a program's kernel for failure messages.
trait Summary {
    fn body_summary(&self) -> String;
}

impl Summary for Kernel {
    fn body_summary(&self) -> String {
        match &self.body {
            KernelBody::Contraction(c) => format!("{:?} {:?} x {:?} -> {:?}", c.op, c.lhs.shape, c.rhs.shape, c.shape),
            _ => self.name.clone(),
        }
    }
}

/// A plain `a[.., M, K] x b[.., K, N]` on whole buffers.
fn matmul_plain(dtype: DType, a: &[usize], b: &[usize], out: &[usize]) -> KernelProgram {
    program(dtype, a, b, Contraction::MatMul, whole(0, a), whole(1, b), out)
}

#[test]
fn matmul_sizes() {
    for dtype in [DType::F32, DType::F64] {
        for (m, k, n) in [
            (1, 1, 1),
            (1, 7, 1),
            (3, 5, 7),
            (2, 1, 3),
            (17, 33, 9),
            (1, 40, 31),
            (31, 40, 1),
            (64, 64, 64),
            (257, 300, 129),
        ] {
            check(&matmul_plain(dtype, &[m, k], &[k, n], &[m, n]));
        }
    }
}

#[test]
fn matmul_zero_sizes() {
    for dtype in [DType::F32, DType::F64] {
        for (m, k, n) in [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0)] {
            check(&matmul_plain(dtype, &[m, k], &[k, n], &[m, n]));
        }
        check(&matmul_plain(dtype, &[0, 3, 4], &[4, 2], &[0, 3, 2]));
        check(&matmul_plain(dtype, &[2, 3, 0], &[2, 0, 5], &[2, 3, 5]));
    }
}

#[test]
fn matmul_transposed_operands() {
    for dtype in [DType::F32, DType::F64] {
        let (m, k, n) = (13, 21, 17);
        // a stored [K, M], b stored [N, K] (attention's k^T).
        let lhs = mapped(0, &[m, k], &[k, m], vec![ax(&[(1, 1)], 0), ax(&[(0, 1)], 0)]);
        let rhs = mapped(1, &[k, n], &[n, k], vec![ax(&[(1, 1)], 0), ax(&[(0, 1)], 0)]);
        check(&program(
            dtype,
            &[k, m],
            &[n, k],
            Contraction::MatMul,
            lhs,
            rhs,
            &[m, n],
        ));
        // Big enough for gemm's threads.
        let (m, k, n) = (140, 150, 160);
        let lhs = mapped(0, &[m, k], &[k, m], vec![ax(&[(1, 1)], 0), ax(&[(0, 1)], 0)]);
        let rhs = mapped(1, &[k, n], &[n, k], vec![ax(&[(1, 1)], 0), ax(&[(0, 1)], 0)]);
        check(&program(
            dtype,
            &[k, m],
            &[n, k],
            Contraction::MatMul,
            lhs,
            rhs,
            &[m, n],
        ));
    }
}

#[test]
fn matmul_broadcast_operands() {
    for dtype in [DType::F32, DType::F64] {
        let (m, k, n) = (9, 11, 6);
        // Every row of a is the vector a[K]; every column of b is the vector b[K].
        let lhs = mapped(0, &[m, k], &[k], vec![ax(&[(1, 1)], 0)]);
        let rhs = mapped(1, &[k, n], &[k, 1], vec![ax(&[(0, 1)], 0), ax(&[], 0)]);
        check(&program(dtype, &[k], &[k, 1], Contraction::MatMul, lhs, rhs, &[m, n]));
        // A broadcast over K (a's columns all equal).
        let lhs = mapped(0, &[m, k], &[m], vec![ax(&[(0, 1)], 0)]);
        check(&program(
            dtype,
            &[m],
            &[k, n],
            Contraction::MatMul,
            lhs,
            whole(1, &[k, n]),
            &[m, n],
        ));
    }
}

#[test]
fn matmul_sliced_reversed_and_reshaped_operands() {
    for dtype in [DType::F32, DType::F64] {
        let (m, k, n) = (10, 12, 7);
        // a = buf[2:2+M, 1::2] of buf[M+3, 2K+1].
        let lhs = mapped(
            0,
            &[m, k],
            &[m + 3, 2 * k + 1],
            vec![ax(&[(0, 1)], 2), ax(&[(1, 2)], 1)],
        );
        // b = buf[::-1, :] of buf[K, N] (a reversed axis: negative stride).
        let rhs = mapped(
            1,
            &[k, n],
            &[k, n],
            vec![ax(&[(0, -1)], k as i64 - 1), ax(&[(1, 1)], 0)],
        );
        check(&program(
            dtype,
            &[m + 3, 2 * k + 1],
            &[k, n],
            Contraction::MatMul,
            lhs,
            rhs,
            &[m, n],
        ));
        // Flat buffers viewed as matrices.
        let lhs = mapped(0, &[m, k], &[m, k], vec![ax(&[(0, 1)], 0), ax(&[(1, 1)], 0)]);
        let rhs = mapped(1, &[k, n], &[k, n], vec![ax(&[(0, 1)], 0), ax(&[(1, 1)], 0)]);
        check(&program(
            dtype,
            &[m * k],
            &[k * n],
            Contraction::MatMul,
            lhs,
            rhs,
            &[m, n],
        ));
    }
}

#[test]
fn matmul_batched_and_broadcast_batches() {
    for dtype in [DType::F32, DType::F64] {
        let (m, k, n) = (5, 6, 7);
        check(&matmul_plain(dtype, &[2, 3, m, k], &[3, k, n], &[2, 3, m, n]));
        check(&matmul_plain(dtype, &[4, 1, m, k], &[1, 5, k, n], &[4, 5, m, n]));
        check(&matmul_plain(dtype, &[3, m, k], &[2, 1, k, n], &[2, 3, m, n]));
        // A linear layer: [B, S, D] x [D, E] folds into one product.
        check(&matmul_plain(dtype, &[3, 4, m, k], &[k, n], &[3, 4, m, n]));
        // Shared weights through a stride-0 batch axis of the map.
        let rhs = mapped(1, &[6, k, n], &[k, n], vec![ax(&[(1, 1)], 0), ax(&[(2, 1)], 0)]);
        check(&program(
            dtype,
            &[6, m, k],
            &[k, n],
            Contraction::MatMul,
            whole(0, &[6, m, k]),
            rhs,
            &[6, m, n],
        ));
        // a stored [M, B, K] read as [B, M, K] (batches not foldable) against shared weights.
        let lhs = mapped(
            0,
            &[4, m, k],
            &[m, 4, k],
            vec![ax(&[(1, 1)], 0), ax(&[(0, 1)], 0), ax(&[(2, 1)], 0)],
        );
        check(&program(
            dtype,
            &[m, 4, k],
            &[k, n],
            Contraction::MatMul,
            lhs,
            whole(1, &[k, n]),
            &[4, m, n],
        ));
        // Attention scores: q[B, H, S, D] x k^T where k is stored [B, S, H, D].
        let (b, h, s, d) = (2, 3, 9, 8);
        let rhs = mapped(
            1,
            &[b, h, d, s],
            &[b, s, h, d],
            vec![ax(&[(0, 1)], 0), ax(&[(3, 1)], 0), ax(&[(1, 1)], 0), ax(&[(2, 1)], 0)],
        );
        check(&program(
            dtype,
            &[b, h, s, d],
            &[b, s, h, d],
            Contraction::MatMul,
            whole(0, &[b, h, s, d]),
            rhs,
            &[b, h, s, s],
        ));
        // Many small products (threads over batches) and a few big ones (threads in gemm).
        check(&matmul_plain(dtype, &[64, 8, 8], &[64, 8, 8], &[64, 8, 8]));
        check(&matmul_plain(dtype, &[2, 128, 96], &[2, 96, 112], &[2, 128, 112]));
    }
}

fn conv_op(
    stride: &[usize],
    pad_before: &[usize],
    pad_after: &[usize],
    dilation: &[usize],
    groups: usize,
) -> Contraction {
    Contraction::Conv(Conv {
        stride: stride.to_vec(),
        pad_before: pad_before.to_vec(),
        pad_after: pad_after.to_vec(),
        dilation: dilation.to_vec(),
        groups,
    })
}

/// The output shape of a convolution (as `Op::Conv` infers it).
fn conv_out(x: &[usize], w: &[usize], op: &Contraction) -> Vec<usize> {
    let Contraction::Conv(Conv {
        stride,
        pad_before,
        pad_after,
        dilation,
        ..
    }) = op
    else {
        unreachable!()
    };
    let mut out = vec![x[0], w[0]];
    for i in 0..x.len() - 2 {
        let span = (w[i + 2] - 1) * dilation[i] + 1;
        out.push((x[i + 2] + pad_before[i] + pad_after[i] - span) / stride[i] + 1);
    }
    out
}

fn conv_plain(dtype: DType, x: &[usize], w: &[usize], op: Contraction) -> KernelProgram {
    let out = conv_out(x, w, &op);
    program(dtype, x, w, op, whole(0, x), whole(1, w), &out)
}

#[test]
fn conv_1d_2d_3d() {
    for dtype in [DType::F32, DType::F64] {
        // 1-D: stride 2, asymmetric padding, dilation 2.
        check(&conv_plain(
            dtype,
            &[2, 5, 19],
            &[7, 5, 3],
            conv_op(&[2], &[1], &[2], &[2], 1),
        ));
        check(&conv_plain(
            dtype,
            &[3, 4, 30],
            &[6, 2, 5],
            conv_op(&[1], &[3], &[0], &[1], 2),
        ));
        // 2-D: groups 2, stride (2, 1), asymmetric padding.
        check(&conv_plain(
            dtype,
            &[2, 6, 11, 9],
            &[4, 3, 3, 2],
            conv_op(&[2, 1], &[1, 0], &[2, 1], &[1, 1], 2),
        ));
        // 2-D: dilation, padding bigger than the kernel's reach on one side.
        check(&conv_plain(
            dtype,
            &[1, 3, 10, 12],
            &[5, 3, 3, 3],
            conv_op(&[1, 3], &[4, 1], &[0, 3], &[2, 3], 1),
        ));
        // ResNet stem: 7×7 stride 2 pad 3 over 3 channels.
        check(&conv_plain(
            dtype,
            &[1, 3, 33, 30],
            &[8, 3, 7, 7],
            conv_op(&[2, 2], &[3, 3], &[3, 3], &[1, 1], 1),
        ));
        // 3-D: stride, dilation and asymmetric padding per axis.
        check(&conv_plain(
            dtype,
            &[1, 4, 6, 7, 5],
            &[6, 4, 3, 2, 3],
            conv_op(&[1, 2, 1], &[1, 0, 2], &[0, 1, 1], &[2, 1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[2, 6, 5, 4, 6],
            &[9, 2, 2, 3, 1],
            conv_op(&[2, 1, 3], &[0, 1, 0], &[1, 1, 0], &[1, 1, 1], 3),
        ));
    }
}

#[test]
fn conv_many_tiles_and_odd_channels() {
    for dtype in [DType::F32, DType::F64] {
        // A patch matrix too big for one tile (tiles that do not end on output rows).
        check(&conv_plain(
            dtype,
            &[1, 64, 30, 31],
            &[8, 64, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[3, 7, 23, 17],
            &[5, 7, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[2, 3, 9, 8],
            &[5, 3, 2, 2],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
        ));
    }
}

#[test]
fn conv_large_kernels_build_patches_by_position() {
    // Fewer output positions than kernel taps (a weight gradient's shape): whole kernel rows
    // copied, rows in the padding, partial rows at the edges, a dilated last axis, groups.
    for dtype in [DType::F32, DType::F64] {
        check(&conv_plain(
            dtype,
            &[2, 5, 12, 11],
            &[3, 5, 9, 8],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[1, 3, 10, 9],
            &[4, 3, 7, 6],
            conv_op(&[2, 2], &[2, 2], &[1, 1], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[1, 3, 10, 9],
            &[2, 3, 5, 4],
            conv_op(&[3, 1], &[0, 1], &[0, 1], &[1, 2], 1),
        ));
        check(&conv_plain(
            dtype,
            &[3, 4, 40],
            &[2, 4, 33],
            conv_op(&[1], &[1], &[2], &[1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[2, 6, 10, 10],
            &[4, 3, 8, 8],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 2),
        ));
    }
}

#[test]
fn conv_depthwise() {
    for dtype in [DType::F32, DType::F64] {
        // MobileNet-style 3×3, stride 1 and 2.
        check(&conv_plain(
            dtype,
            &[2, 8, 13, 12],
            &[8, 1, 3, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 8),
        ));
        check(&conv_plain(
            dtype,
            &[2, 8, 13, 12],
            &[8, 1, 3, 3],
            conv_op(&[2, 2], &[0, 1], &[1, 1], &[1, 1], 8),
        ));
        // Channel multiplier 2, dilation, stride 3 on one axis.
        check(&conv_plain(
            dtype,
            &[1, 5, 14, 15],
            &[10, 1, 3, 2],
            conv_op(&[1, 3], &[2, 0], &[1, 2], &[2, 1], 5),
        ));
        // One input channel, many outputs (LeNet's first layer).
        check(&conv_plain(
            dtype,
            &[2, 1, 12, 12],
            &[6, 1, 5, 5],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
        ));
        // 1-D and 3-D depthwise.
        check(&conv_plain(
            dtype,
            &[2, 6, 40],
            &[6, 1, 5],
            conv_op(&[2], &[2], &[1], &[1], 6),
        ));
        check(&conv_plain(
            dtype,
            &[1, 3, 5, 6, 7],
            &[3, 1, 3, 3, 3],
            conv_op(&[1, 2, 1], &[1, 1, 0], &[1, 0, 2], &[1, 1, 2], 3),
        ));
        // Kernel widths 1, 6 and 7; a stride wider than the input row.
        for (kw, stride) in [(1, 2), (6, 1), (7, 2), (7, 1)] {
            check(&conv_plain(
                dtype,
                &[1, 3, 9, 17],
                &[3, 1, 2, kw],
                conv_op(&[1, stride], &[1, 3], &[0, 2], &[1, 1], 3),
            ));
        }
        check(&conv_plain(
            dtype,
            &[1, 2, 4, 2],
            &[2, 1, 2, 2],
            conv_op(&[1, 3], &[0, 2], &[0, 2], &[1, 1], 2),
        ));
        // Huge strides and padding (the direct path's padded planes would be huge: im2col).
        check(&conv_plain(
            dtype,
            &[1, 2, 5, 5],
            &[2, 1, 1, 2],
            conv_op(&[100_000, 1], &[200_000, 1], &[200_000, 0], &[1, 3], 2),
        ));
        // Wider than the padding reach: the kernel window misses the input in some rows.
        check(&conv_plain(
            dtype,
            &[1, 4, 3, 3],
            &[4, 1, 3, 3],
            conv_op(&[1, 1], &[3, 2], &[3, 2], &[1, 1], 4),
        ));
    }
}

#[test]
fn conv_pointwise() {
    for dtype in [DType::F32, DType::F64] {
        check(&conv_plain(
            dtype,
            &[2, 12, 7, 5],
            &[10, 12, 1, 1],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[2, 12, 7, 5],
            &[9, 4, 1, 1],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 3),
        ));
        check(&conv_plain(
            dtype,
            &[1, 40, 30, 30],
            &[24, 40, 1, 1],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
        ));
        // Not the fast path: stride 2, or padding.
        check(&conv_plain(
            dtype,
            &[2, 12, 7, 5],
            &[10, 12, 1, 1],
            conv_op(&[2, 2], &[0, 0], &[0, 0], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[1, 6, 4, 5],
            &[3, 6, 1, 1],
            conv_op(&[1, 1], &[1, 0], &[0, 2], &[1, 1], 1),
        ));
        check(&conv_plain(
            dtype,
            &[1, 6, 30],
            &[3, 6, 1],
            conv_op(&[1], &[0], &[0], &[1], 1),
        ));
    }
}

#[test]
fn conv_strided_operands() {
    for dtype in [DType::F32, DType::F64] {
        // x stored NHWC, read as NCHW; w sliced out of a bigger buffer on the output axis.
        let (n, c, h, w) = (2, 5, 9, 8);
        let x = mapped(
            0,
            &[n, c, h, w],
            &[n, h, w, c],
            vec![ax(&[(0, 1)], 0), ax(&[(2, 1)], 0), ax(&[(3, 1)], 0), ax(&[(1, 1)], 0)],
        );
        let wt = mapped(
            1,
            &[4, c, 3, 3],
            &[9, c, 3, 3],
            vec![ax(&[(0, 2)], 1), ax(&[(1, 1)], 0), ax(&[(2, 1)], 0), ax(&[(3, 1)], 0)],
        );
        let op = conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1);
        let out = conv_out(&[n, c, h, w], &[4, c, 3, 3], &op);
        check(&program(dtype, &[n, h, w, c], &[9, c, 3, 3], op, x, wt, &out));
        // The same for the depthwise and pointwise paths.
        let x = mapped(
            0,
            &[n, c, h, w],
            &[n, h, w, c],
            vec![ax(&[(0, 1)], 0), ax(&[(2, 1)], 0), ax(&[(3, 1)], 0), ax(&[(1, 1)], 0)],
        );
        let op = conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], c);
        let out = conv_out(&[n, c, h, w], &[c, 1, 3, 3], &op);
        check(&program(
            dtype,
            &[n, h, w, c],
            &[c, 1, 3, 3],
            op,
            x.clone(),
            whole(1, &[c, 1, 3, 3]),
            &out,
        ));
        let op = conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1);
        let out = conv_out(&[n, c, h, w], &[7, c, 1, 1], &op);
        check(&program(
            dtype,
            &[n, h, w, c],
            &[7, c, 1, 1],
            op,
            x,
            whole(1, &[7, c, 1, 1]),
            &out,
        ));
        // A broadcast batch: every image is the same one.
        let x = mapped(
            0,
            &[3, c, h, w],
            &[c, h, w],
            vec![ax(&[(1, 1)], 0), ax(&[(2, 1)], 0), ax(&[(3, 1)], 0)],
        );
        let op = conv_op(&[2, 1], &[0, 1], &[1, 0], &[1, 1], 1);
        let out = conv_out(&[3, c, h, w], &[4, c, 2, 3], &op);
        check(&program(
            dtype,
            &[c, h, w],
            &[4, c, 2, 3],
            op,
            x,
            whole(1, &[4, c, 2, 3]),
            &out,
        ));
    }
}

#[test]
fn conv_zero_sizes() {
    for dtype in [DType::F32, DType::F64] {
        let op = || conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 1);
        check(&conv_plain(dtype, &[0, 3, 5, 5], &[4, 3, 3, 3], op()));
        check(&conv_plain(dtype, &[2, 3, 5, 5], &[0, 3, 3, 3], op()));
        // No input channels: all zeros.
        check(&conv_plain(dtype, &[2, 0, 5, 5], &[4, 0, 3, 3], op()));
        // An empty input axis that the padding alone covers: all zeros.
        check(&conv_plain(dtype, &[1, 2, 0, 4], &[3, 2, 1, 3], op()));
        check(&conv_plain(
            dtype,
            &[1, 2, 0, 4],
            &[2, 1, 1, 3],
            conv_op(&[1, 1], &[1, 1], &[1, 1], &[1, 1], 2),
        ));
    }
}

/// Run `p` on the runtime and expect an error (not a panic).
fn expect_error(p: &KernelProgram, what: &str) {
    let m = model(p).expect("model");
    let inputs = feeds(p, 1);
    match m.run(&inputs) {
        Ok(_) => panic!("{what}: ran, but should have failed"),
        Err(e) => assert!(!e.to_string().is_empty(), "{what}"),
    }
}

#[test]
fn malformed_contractions_are_errors() {
    let f = DType::F32;
    // Output shape disagrees with the product.
    expect_error(
        &program(
            f,
            &[3, 4],
            &[4, 5],
            Contraction::MatMul,
            whole(0, &[3, 4]),
            whole(1, &[4, 5]),
            &[3, 6],
        ),
        "matmul output",
    );
    // Inner dims differ.
    expect_error(
        &program(
            f,
            &[3, 4],
            &[5, 5],
            Contraction::MatMul,
            whole(0, &[3, 4]),
            whole(1, &[5, 5]),
            &[3, 5],
        ),
        "inner dims",
    );
    // Batch dims do not broadcast.
    expect_error(&matmul_plain(f, &[2, 3, 4], &[3, 4, 5], &[3, 3, 5]), "batch");
    // Rank-1 operand.
    expect_error(
        &program(
            f,
            &[4],
            &[4, 5],
            Contraction::MatMul,
            whole(0, &[4]),
            whole(1, &[4, 5]),
            &[5],
        ),
        "rank 1",
    );
    // An index map that leaves its buffer.
    let lhs = mapped(0, &[3, 4], &[3, 4], vec![ax(&[(0, 1)], 1), ax(&[(1, 1)], 0)]);
    expect_error(
        &program(
            f,
            &[3, 4],
            &[4, 5],
            Contraction::MatMul,
            lhs,
            whole(1, &[4, 5]),
            &[3, 5],
        ),
        "out-of-bounds map",
    );
    // A map naming a loop the operand does not have.
    let lhs = mapped(0, &[3, 4], &[3, 4], vec![ax(&[(0, 1)], 0), ax(&[(2, 1)], 0)]);
    expect_error(
        &program(
            f,
            &[3, 4],
            &[4, 5],
            Contraction::MatMul,
            lhs,
            whole(1, &[4, 5]),
            &[3, 5],
        ),
        "unknown loop",
    );
    // A view whose size is not the buffer's.
    let lhs = mapped(0, &[3, 4], &[3, 5], vec![ax(&[(0, 1)], 0), ax(&[(1, 1)], 0)]);
    expect_error(
        &program(
            f,
            &[3, 4],
            &[4, 5],
            Contraction::MatMul,
            lhs,
            whole(1, &[4, 5]),
            &[3, 5],
        ),
        "view size",
    );
    // Integer conv is not a runtime contraction (integer matmul is: tests/cpu/native.rs), nor
    // is a bool matmul.
    expect_error(
        &program(
            DType::I64,
            &[1, 2, 3, 3],
            &[2, 2, 1, 1],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
            whole(0, &[1, 2, 3, 3]),
            whole(1, &[2, 2, 1, 1]),
            &[1, 2, 3, 3],
        ),
        "i64 conv",
    );
    expect_error(&matmul_plain(DType::Bool, &[2, 2], &[2, 2], &[2, 2]), "bool");
    // Conv: groups that do not divide the channels, wrong weight channels, bad attributes,
    // a window that does not fit, a wrong output shape.
    let conv =
        |x: &[usize], w: &[usize], op: Contraction, out: &[usize]| program(f, x, w, op, whole(0, x), whole(1, w), out);
    expect_error(
        &conv(
            &[1, 4, 5, 5],
            &[6, 1, 3, 3],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 3),
            &[1, 6, 3, 3],
        ),
        "groups",
    );
    expect_error(
        &conv(
            &[1, 4, 5, 5],
            &[6, 3, 3, 3],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
            &[1, 6, 3, 3],
        ),
        "weight channels",
    );
    expect_error(
        &conv(
            &[1, 4, 5, 5],
            &[6, 4, 3, 3],
            conv_op(&[0, 1], &[0, 0], &[0, 0], &[1, 1], 1),
            &[1, 6, 3, 3],
        ),
        "stride 0",
    );
    expect_error(
        &conv(
            &[1, 4, 5, 5],
            &[6, 4, 3, 3],
            conv_op(&[1], &[0], &[0], &[1], 1),
            &[1, 6, 3, 3],
        ),
        "attribute lengths",
    );
    expect_error(
        &conv(
            &[1, 4, 2, 5],
            &[6, 4, 3, 3],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
            &[1, 6, 1, 3],
        ),
        "window",
    );
    expect_error(
        &conv(
            &[1, 4, 5, 5],
            &[6, 4, 3, 3],
            conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1),
            &[1, 6, 9, 1],
        ),
        "conv output",
    );
}

/// Throughput of the contractions on typical shapes (no asserts; prints).
#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn bench_contractions() {
    use std::time::Instant;
    // The best of several runs (the least disturbed by other processes).
    fn best(runs: usize, mut f: impl FnMut()) -> f64 {
        f();
        (0..runs)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    }
    // OAR_BENCH=substring selects cases.
    let filter = std::env::var("OAR_BENCH").unwrap_or_default();
    let threads_all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let time = |p: &KernelProgram, flops: f64, label: &str| {
        if !label.contains(&filter) {
            return;
        }
        let inputs = feeds(p, 3);
        let mut m = model(p).expect("model");
        for threads in [1, threads_all] {
            m.set_threads(threads);
            let s = best(15, || {
                m.run(&inputs).expect("run");
            });
            println!(
                "{label} [{threads} thr]: {:.3} ms, {:.1} GFLOP/s",
                s * 1e3,
                flops / s / 1e9
            );
        }
    };
    let f = DType::F32;
    for n in [256usize, 512, 1024] {
        time(
            &matmul_plain(f, &[n, n], &[n, n], &[n, n]),
            2.0 * (n * n * n) as f64,
            &format!("matmul f32 {n}^3"),
        );
    }
    let n = 1024;
    time(
        &matmul_plain(DType::F64, &[n, n], &[n, n], &[n, n]),
        2.0 * (n * n * n) as f64,
        "matmul f64 1024^3",
    );
    // ResNet-18 convolutions, batch 1: (channels in, out, size, kernel, stride, pad).
    for (ci, co, s, k, st, pd) in [
        (3, 64, 224, 7, 2, 3),
        (64, 64, 56, 3, 1, 1),
        (64, 128, 56, 3, 2, 1),
        (128, 128, 28, 3, 1, 1),
        (256, 256, 14, 3, 1, 1),
        (512, 512, 7, 3, 1, 1),
        (64, 128, 56, 1, 2, 0),
    ] {
        let op = conv_op(&[st, st], &[pd, pd], &[pd, pd], &[1, 1], 1);
        let p = conv_plain(f, &[1, ci, s, s], &[co, ci, k, k], op);
        let out = conv_out(&[1, ci, s, s], &[co, ci, k, k], &p_conv_op(&p));
        let flops = 2.0 * (out.iter().product::<usize>() * ci * k * k) as f64;
        time(&p, flops, &format!("conv resnet18 {ci}->{co} {s}x{s} k{k} s{st}"));
    }
    // MobileNetV2 depthwise 3×3 layers, batch 1: (channels, size, stride); and a pointwise.
    for (c, s, st) in [
        (32, 112, 1),
        (96, 112, 2),
        (144, 56, 1),
        (144, 56, 2),
        (384, 14, 1),
        (960, 7, 1),
    ] {
        let op = conv_op(&[st, st], &[1, 1], &[1, 1], &[1, 1], c);
        let p = conv_plain(f, &[1, c, s, s], &[c, 1, 3, 3], op);
        let out = conv_out(&[1, c, s, s], &[c, 1, 3, 3], &p_conv_op(&p));
        let flops = 2.0 * (out.iter().product::<usize>() * 9) as f64;
        time(&p, flops, &format!("conv mobilenetv2 dw {c} {s}x{s} s{st}"));
    }
    let op = conv_op(&[1, 1], &[0, 0], &[0, 0], &[1, 1], 1);
    let p = conv_plain(f, &[1, 144, 56, 56], &[24, 144, 1, 1], op);
    time(
        &p,
        2.0 * (24 * 56 * 56 * 144) as f64,
        "conv mobilenetv2 pw 144->24 56x56",
    );
}

/// The conv op of a one-kernel program.
fn p_conv_op(p: &KernelProgram) -> Contraction {
    match &p.kernels[0].body {
        KernelBody::Contraction(c) => c.op.clone(),
        _ => unreachable!(),
    }
}
