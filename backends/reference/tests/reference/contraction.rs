//! MatMul and Conv against hand values and independent direct loops (tolerance 1e-6 rel).

use crate::common::*;
use oar_ir::ops::Conv;
use oar_ir::{DType, Op};
use std::time::Instant;

/// Deterministic test data in [-1, 1).
fn data(n: usize, salt: u64) -> Vec<f64> {
    (0..n as u64)
        .map(|i| oar_ir::ops::random_stream::uniform(salt, i) * 2.0 - 1.0)
        .collect()
}

#[test]
fn matmul_by_hand_and_int() {
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32s(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    assert_close(&op1(Op::MatMul, &[a, b]), &[2, 2], &[58.0, 64.0, 139.0, 154.0], 0.0);
    let ai = tensor(DType::I32, &[1, 2], &[65536.0, 1.0]);
    let bi = tensor(DType::I32, &[2, 1], &[65536.0, 5.0]);
    // 2^32 wraps to 0 in i32, plus 5.
    assert_exact(&op1(Op::MatMul, &[ai, bi]), DType::I32, &[1, 1], &[5.0]);
}

#[test]
fn batched_matmul_broadcasts_batch_dims() {
    // a[2,1,2,3] x b[3,3,2] -> [2,3,2,2]
    let (av, bv) = (data(12, 1), data(18, 2));
    let y = op1(Op::MatMul, &[f32s(&[2, 1, 2, 3], &av), f32s(&[3, 3, 2], &bv)]);
    let a32: Vec<f64> = av.iter().map(|&v| v as f32 as f64).collect();
    let b32: Vec<f64> = bv.iter().map(|&v| v as f32 as f64).collect();
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for m in 0..2 {
                for n in 0..2 {
                    let s: f64 = (0..3).map(|k| a32[i * 6 + m * 3 + k] * b32[j * 6 + k * 2 + n]).sum();
                    want.push(s);
                }
            }
        }
    }
    assert_close(&y, &[2, 3, 2, 2], &want, 1e-6);
}

#[test]
fn matmul_64_cubed_is_fast() {
    let a = f32s(&[64, 64], &data(4096, 3));
    let b = f32s(&[64, 64], &data(4096, 4));
    let t = Instant::now();
    let y = op1(Op::MatMul, &[a.clone(), b.clone()]);
    assert!(t.elapsed().as_secs_f64() < 1.0, "{:?}", t.elapsed());
    let (av, bv, yv) = (a.to_f64_vec(), b.to_f64_vec(), y.to_f64_vec());
    let s: f64 = (0..64).map(|k| av[5 * 64 + k] * bv[k * 64 + 7]).sum();
    assert!((yv[5 * 64 + 7] - s).abs() < 1e-5);
}

/// Direct 2-d convolution over an explicitly zero-padded input, written independently of
/// the backend (different loop order, explicit padding).
#[allow(clippy::too_many_arguments)]
fn naive_conv2d(
    x: &[f64],
    (n, c, h, w): (usize, usize, usize, usize),
    wt: &[f64],
    (o, kh, kw): (usize, usize, usize),
    stride: [usize; 2],
    pad: [usize; 4],
    dil: [usize; 2],
    groups: usize,
) -> (Vec<f64>, [usize; 4]) {
    let (ph, pw) = (h + pad[0] + pad[2], w + pad[1] + pad[3]);
    let mut xp = vec![0.0; n * c * ph * pw];
    for b in 0..n {
        for ch in 0..c {
            for i in 0..h {
                for j in 0..w {
                    xp[((b * c + ch) * ph + i + pad[0]) * pw + j + pad[1]] = x[((b * c + ch) * h + i) * w + j];
                }
            }
        }
    }
    let oh = (ph - (dil[0] * (kh - 1) + 1)) / stride[0] + 1;
    let ow = (pw - (dil[1] * (kw - 1) + 1)) / stride[1] + 1;
    let cg = c / groups;
    let mut y = vec![0.0; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            let g = oc / (o / groups);
            for i in 0..oh {
                for j in 0..ow {
                    let mut s = 0.0;
                    for cl in 0..cg {
                        for a in 0..kh {
                            for e in 0..kw {
                                let xi = i * stride[0] + a * dil[0];
                                let xj = j * stride[1] + e * dil[1];
                                s += xp[((b * c + g * cg + cl) * ph + xi) * pw + xj]
                                    * wt[((oc * cg + cl) * kh + a) * kw + e];
                            }
                        }
                    }
                    y[((b * o + oc) * oh + i) * ow + j] = s;
                }
            }
        }
    }
    (y, [n, o, oh, ow])
}

#[test]
fn conv2d_groups_stride_dilation_padding_vs_direct_loop() {
    for &(groups, stride, pad, dil) in &[
        (1, [1, 1], [0, 0, 0, 0], [1, 1]),
        (2, [2, 1], [1, 2, 0, 1], [1, 2]),
        (4, [1, 3], [2, 0, 1, 1], [2, 1]),
    ] {
        let (n, c, h, w, o, kh, kw) = (2, 4, 7, 6, 8, 3, 2);
        let xv: Vec<f64> = data(n * c * h * w, 5).iter().map(|&v| v as f32 as f64).collect();
        let wv: Vec<f64> = data(o * (c / groups) * kh * kw, 6)
            .iter()
            .map(|&v| v as f32 as f64)
            .collect();
        let (want, shape) = naive_conv2d(&xv, (n, c, h, w), &wv, (o, kh, kw), stride, pad, dil, groups);
        let op = Op::Conv(Conv {
            stride: stride.to_vec(),
            pad_before: vec![pad[0], pad[1]],
            pad_after: vec![pad[2], pad[3]],
            dilation: dil.to_vec(),
            groups,
        });
        let y = op1(op, &[f32s(&[n, c, h, w], &xv), f32s(&[o, c / groups, kh, kw], &wv)]);
        assert_close(&y, &shape, &want, 1e-6);
    }
}

#[test]
fn conv1d_and_conv3d_by_hand() {
    // 1-d: x = [1, 2, 3, 4], w = [1, -1], pad 1 both sides, stride 2:
    // padded [0,1,2,3,4,0] → windows at 0, 2, 4: (0-1), (2-3), (4-0) = -1, -1, 4.
    let op = Op::Conv(Conv {
        stride: vec![2],
        pad_before: vec![1],
        pad_after: vec![1],
        dilation: vec![1],
        groups: 1,
    });
    let y = op1(
        op,
        &[f32s(&[1, 1, 4], &[1.0, 2.0, 3.0, 4.0]), f32s(&[1, 1, 2], &[1.0, -1.0])],
    );
    assert_close(&y, &[1, 1, 3], &[-1.0, -1.0, 4.0], 0.0);
    // 3-d: a 2x2x2 kernel of ones over a 2x2x2 input sums everything.
    let op3 = Op::Conv(Conv {
        stride: vec![1; 3],
        pad_before: vec![0; 3],
        pad_after: vec![0; 3],
        dilation: vec![1; 3],
        groups: 1,
    });
    let xv: Vec<f64> = (1..=8).map(f64::from).collect();
    let y3 = op1(op3, &[f32s(&[1, 1, 2, 2, 2], &xv), f32s(&[1, 1, 2, 2, 2], &[1.0; 8])]);
    assert_close(&y3, &[1, 1, 1, 1, 1], &[36.0], 0.0);
}

#[test]
fn small_conv_is_fast() {
    let op = Op::Conv(Conv {
        stride: vec![1, 1],
        pad_before: vec![1, 1],
        pad_after: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    });
    let x = f32s(&[2, 16, 32, 32], &data(2 * 16 * 32 * 32, 7));
    let w = f32s(&[16, 16, 3, 3], &data(16 * 16 * 9, 8));
    let t = Instant::now();
    let y = op1(op, &[x, w]);
    assert_eq!(y.shape(), &[2, 16, 32, 32]);
    assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
}
