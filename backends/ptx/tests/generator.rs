//! The PTX generator on hand-made kernels: the instructions each kernel kind must contain, its
//! launch shape, and which kernels fall back to the host. (`conformance/tests/kit/ptxas.rs` in the `oar`
//! crate assembles every conformance kernel with `ptxas`.)

use oar_backend_ptx::codegen::{Arch, Launch, Step, generate};
use oar_backend_ptx::{PtxBackend, runtime};
use oar_ir::kernel::{
    AffineExpr, Buffer, BufferId, BufferKind, Contraction, ContractionKernel, IndexMap, Inst, Kernel, KernelBody,
    KernelProgram, Load, LoopKernel, OpaqueKernel, Operand, Reduction, ScalarOp,
};
use oar_ir::ops::{ArgReduce, Concat, Conv, Gather, Iota, Pad, Random, Scatter};
use oar_ir::ops::{BinaryOp, Float, Op, ReduceOp, UnaryOp};
use oar_ir::{Backend, BackendError, DType, Dim, Graph, TensorType, Weights};

fn dims(d: &[usize]) -> Vec<Dim> {
    d.iter().map(|&n| Dim::Static(n)).collect()
}

fn buf(kind: BufferKind, dt: DType, d: &[usize]) -> Buffer {
    Buffer {
        kind,
        ty: TensorType::of(dt, d),
        value: "%0".into(),
    }
}

fn input(name: &str, dt: DType, d: &[usize]) -> Buffer {
    buf(BufferKind::Input { name: name.into() }, dt, d)
}

fn inst(op: ScalarOp, dtype: DType) -> Inst {
    Inst { op, dtype }
}

fn program(buffers: Vec<Buffer>, body: KernelBody, out: u32) -> KernelProgram {
    KernelProgram {
        name: "t".into(),
        buffers,
        kernels: vec![Kernel {
            name: "k".into(),
            body,
            outputs: vec![BufferId(out)],
        }],
        outputs: vec![("y".into(), BufferId(out))],
    }
}

/// `y[i, j] = exp(x[i, j]) + b[j]` on `dt`.
fn exp_add_bias(dt: DType) -> KernelProgram {
    let body = vec![
        inst(ScalarOp::Load(0), dt),
        inst(ScalarOp::Unary(UnaryOp::Exp, 0), dt),
        inst(ScalarOp::Load(1), dt),
        inst(ScalarOp::Binary(BinaryOp::Add, 1, 2), dt),
    ];
    let k = LoopKernel {
        shape: dims(&[3, 1000]),
        loads: vec![
            Load {
                buffer: BufferId(0),
                map: IndexMap::identity(&dims(&[3, 1000])),
            },
            Load {
                buffer: BufferId(1),
                map: IndexMap {
                    view: dims(&[1000]),
                    axes: vec![AffineExpr::loop_index(1)],
                },
            },
        ],
        outer: 2,
        reduce: vec![],
        body,
    };
    program(
        vec![
            input("x", dt, &[3, 1000]),
            input("b", dt, &[1000]),
            buf(BufferKind::Output, dt, &[3, 1000]),
        ],
        KernelBody::Loop(k),
        2,
    )
}

#[test]
fn elementwise_kernel_is_a_grid_stride_loop_with_broadcast_loads() {
    let m = generate(&exp_add_bias(DType::F32), Arch::Sm80);
    assert_eq!(m.entries.len(), 1, "{:?}", m.steps);
    let e = &m.entries[0];
    let t = m.text();
    for needle in [
        ".version 7.8",
        ".target sm_80",
        ".visible .entry oar_k0_k(",
        // exp, legalized: 2^k built from the exponent bits.
        "shl.b32",
        "add.rn.f32",
        "ld.global.f32",
        "st.global.f32",
        "%nctaid.x",
        "rem.u64",
    ] {
        assert!(t.contains(needle), "missing `{needle}` in\n{t}");
    }
    assert_eq!(e.params, vec![BufferId(2), BufferId(0), BufferId(1)]);
    assert_eq!(
        e.launch,
        Launch {
            grid: (12, 1, 1),
            block: (256, 1, 1)
        }
    );
    assert!(
        generate(&exp_add_bias(DType::F32), Arch::Sm90)
            .text()
            .contains(".target sm_90")
    );
}

#[test]
fn half_precision_is_computed_in_f32_and_rounded_after_each_op() {
    let t = generate(&exp_add_bias(DType::F16), Arch::Sm80).text();
    for needle in ["ld.global.b16", "cvt.f32.f16", "cvt.rn.f16.f32", "st.global.b16"] {
        assert!(t.contains(needle), "missing `{needle}`");
    }
    // bf16 widens by shifting bits (cvt.f32.bf16 would need sm_90).
    let t = generate(&exp_add_bias(DType::BF16), Arch::Sm80).text();
    assert!(t.contains("cvt.rn.bf16.f32") && t.contains("shl.b32") && !t.contains("cvt.f32.bf16"));
}

#[test]
fn transcendentals_are_legalized_polynomials() {
    let t = generate(&exp_add_bias(DType::F32), Arch::Sm80).text();
    assert!(
        !t.contains("ex2.approx"),
        "no hardware approximation: the legalized expansion"
    );
    let m = generate(&exp_add_bias(DType::F64), Arch::Sm80);
    assert!(m.host_steps().is_empty(), "{:?}", m.host_steps());
    let t = m.text();
    assert!(
        t.contains("mul.rn.f64") && t.contains("shl.b64") && t.contains("mov.b64"),
        "polynomial and 2^k from bits"
    );
    assert!(!t.contains("ex2.approx"), "no f32 approximation in f64 code");
}

#[test]
fn reduction_uses_warp_shuffles_and_shared_memory() {
    // y[i, 0] = max over j of x[i, j], then relu.
    let k = LoopKernel {
        shape: dims(&[4, 1]),
        loads: vec![Load {
            buffer: BufferId(0),
            map: IndexMap {
                view: dims(&[4, 300]),
                axes: vec![AffineExpr::loop_index(0), AffineExpr::loop_index(2)],
            },
        }],
        outer: 2,
        reduce: vec![Reduction {
            op: ReduceOp::Max,
            dims: dims(&[300]),
            body: vec![inst(ScalarOp::Load(0), DType::F32)],
        }],
        body: vec![
            inst(ScalarOp::Acc(0), DType::F32),
            inst(ScalarOp::Const(Float(0.0)), DType::F32),
            inst(ScalarOp::Binary(BinaryOp::Max, 0, 1), DType::F32),
        ],
    };
    let p = program(
        vec![
            input("x", DType::F32, &[4, 300]),
            buf(BufferKind::Output, DType::F32, &[4, 1]),
        ],
        KernelBody::Loop(k),
        1,
    );
    let m = generate(&p, Arch::Sm80);
    let t = m.text();
    for needle in [
        "shfl.sync.bfly.b32",
        ".shared .align 8 .b8 red_smem[64]",
        "st.shared.f32",
        "bar.sync 0",
        "max.NaN.f32",
        "0fFF800000",
    ] {
        assert!(t.contains(needle), "missing `{needle}` in\n{t}");
    }
    assert_eq!(
        m.entries[0].launch,
        Launch {
            grid: (4, 1, 1),
            block: (256, 1, 1)
        }
    );
}

#[test]
fn f64_reduction_shuffles_both_halves() {
    let k = LoopKernel {
        shape: dims(&[2]),
        loads: vec![Load {
            buffer: BufferId(0),
            map: IndexMap::identity(&dims(&[2, 50])),
        }],
        outer: 1,
        reduce: vec![Reduction {
            op: ReduceOp::Mean,
            dims: dims(&[50]),
            body: vec![inst(ScalarOp::Load(0), DType::F64)],
        }],
        body: vec![inst(ScalarOp::Acc(0), DType::F64)],
    };
    let p = program(
        vec![
            input("x", DType::F64, &[2, 50]),
            buf(BufferKind::Output, DType::F64, &[2]),
        ],
        KernelBody::Loop(k),
        1,
    );
    let t = generate(&p, Arch::Sm80).text();
    assert!(t.contains("mov.b64 {"), "64-bit values split for the shuffle");
    assert!(t.contains("div.rn.f64"), "mean divides by the count");
}

#[test]
fn matmul_is_a_shared_memory_tiled_kernel_with_its_epilogue() {
    let (m, k, n) = (33, 20, 17);
    let c = ContractionKernel {
        op: Contraction::MatMul,
        lhs: Operand {
            shape: dims(&[m, k]),
            load: Load {
                buffer: BufferId(0),
                map: IndexMap::identity(&dims(&[m, k])),
            },
            round: None,
        },
        rhs: Operand {
            shape: dims(&[k, n]),
            load: Load {
                buffer: BufferId(1),
                map: IndexMap::identity(&dims(&[k, n])),
            },
            round: None,
        },
        acc_dtype: DType::F32,
        shape: dims(&[m, n]),
        loads: vec![Load {
            buffer: BufferId(2),
            map: IndexMap {
                view: dims(&[n]),
                axes: vec![AffineExpr::loop_index(1)],
            },
        }],
        epilogue: vec![
            inst(ScalarOp::Acc(0), DType::F32),
            inst(ScalarOp::Load(0), DType::F32),
            inst(ScalarOp::Binary(BinaryOp::Add, 0, 1), DType::F32),
            inst(ScalarOp::Unary(UnaryOp::Tanh, 2), DType::F32),
        ],
    };
    let p = program(
        vec![
            input("a", DType::F32, &[m, k]),
            input("b", DType::F32, &[k, n]),
            input("bias", DType::F32, &[n]),
            buf(BufferKind::Output, DType::F32, &[m, n]),
        ],
        KernelBody::Contraction(c),
        3,
    );
    let md = generate(&p, Arch::Sm90);
    let t = md.text();
    for needle in [
        ".shared .align 8 .b8 tile_a[1024]",
        ".shared .align 8 .b8 tile_b[1024]",
        "ld.shared.f32",
        "fma.rn.f32",
        "bar.sync 0",
        // The epilogue's tanh, legalized (a bitcast of 2^k).
        "mov.b32",
    ] {
        assert!(t.contains(needle), "missing `{needle}` in\n{t}");
    }
    assert!(t.matches("fma.rn.f32").count() >= 16, "the K step is unrolled");
    assert_eq!(
        md.entries[0].launch,
        Launch {
            grid: (2, 3, 1),
            block: (16, 16, 1)
        }
    );
}

/// A one-kernel program: `y = conv(x[xs], w[ws])` on `dt`, 3 × 3-style padding 1, stride 1.
fn conv_program(dt: DType, xs: [usize; 4], ws: [usize; 4], groups: usize) -> KernelProgram {
    let ys = [xs[0], ws[0], xs[2] + 3 - ws[2], xs[3] + 3 - ws[3]];
    let c = ContractionKernel {
        op: Contraction::Conv(Conv {
            stride: vec![1, 1],
            pad_before: vec![1, 1],
            pad_after: vec![1, 1],
            dilation: vec![1, 1],
            groups,
        }),
        lhs: Operand {
            shape: dims(&xs),
            load: Load {
                buffer: BufferId(0),
                map: IndexMap::identity(&dims(&xs)),
            },
            round: None,
        },
        rhs: Operand {
            shape: dims(&ws),
            load: Load {
                buffer: BufferId(1),
                map: IndexMap::identity(&dims(&ws)),
            },
            round: None,
        },
        acc_dtype: dt,
        shape: dims(&ys),
        loads: vec![],
        epilogue: vec![inst(ScalarOp::Acc(0), dt)],
    };
    program(
        vec![
            input("x", dt, &xs),
            input("w", dt, &ws),
            buf(BufferKind::Output, dt, &ys),
        ],
        KernelBody::Contraction(c),
        2,
    )
}

#[test]
fn conv_is_an_implicit_gemm_per_group() {
    // x[1, 4, 5, 5] * w[6, 2, 3, 3], groups 2, pad 1 -> [1, 6, 5, 5]
    let p = conv_program(DType::F32, [1, 4, 5, 5], [6, 2, 3, 3], 2);
    let m = generate(&p, Arch::Sm80);
    let t = m.text();
    assert!(t.contains("setp.ge.and.s64"), "padding checks");
    assert_eq!(
        m.entries[0].launch,
        Launch {
            grid: (2, 1, 2),
            block: (16, 16, 1)
        }
    );
}

/// Half-precision convolutions and matmuls (f16 × f16, bf16 × bf16, f32 accumulators) run on
/// the tensor cores: half tiles in shared memory, two `mma.sync` m16n8k16 per K step by warp 0,
/// the f32 sums through shared memory to every thread's epilogue; ptxas assembles them for
/// sm_80 and sm_90. f32 contractions keep the FMA loop.
#[test]
fn half_contractions_use_tensor_cores() {
    for (dt, ht) in [(DType::BF16, "bf16"), (DType::F16, "f16"), (DType::F32, "")] {
        let p = conv_program(dt, [2, 8, 6, 6], [20, 8, 3, 3], 1);
        for arch in [Arch::Sm80, Arch::Sm90] {
            let t = generate(&p, arch).text();
            let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ht}.{ht}.f32");
            if dt == DType::F32 {
                assert!(
                    !t.contains("mma.sync") && t.contains("fma.rn.f32"),
                    "f32 keeps the FMA loop"
                );
                continue;
            }
            assert_eq!(t.matches(&mma).count(), 2, "{dt}: {t}");
            assert!(
                t.contains("st.shared.b16") && t.contains("tile_c"),
                "{dt}: half tiles, shared C tile"
            );
            if let Some(ptxas) = oar_backend_ptx::ptxas::find_ptxas() {
                let dir = std::env::temp_dir().join(format!("oar-mma-{}-{dt}-{}", std::process::id(), arch.name()));
                let assembled = oar_backend_ptx::ptxas::assemble(&ptxas, &dir.with_extension("ptx"), &t, arch.name());
                for ext in ["ptx", "cubin"] {
                    let _ = std::fs::remove_file(dir.with_extension(ext));
                }
                assembled.unwrap_or_else(|e| panic!("{dt} ptxas -arch={}: {e}", arch.name()));
            }
        }
    }
}

#[test]
fn gather_checks_its_indices_and_scatter_runs_on_the_host() {
    let program = |op: Op, inputs: Vec<BufferId>, buffers: Vec<Buffer>, out: u32| KernelProgram {
        name: "t".into(),
        buffers,
        kernels: vec![Kernel {
            name: format!("k0_{}", op.name()),
            body: KernelBody::Opaque(OpaqueKernel {
                op,
                inputs,
                regions: vec![],
            }),
            outputs: vec![BufferId(out)],
        }],
        outputs: vec![("y".into(), BufferId(out))],
    };
    let gather = program(
        Op::Gather(Gather { axis: 0 }),
        vec![BufferId(0), BufferId(1)],
        vec![
            input("x", DType::F32, &[4, 3]),
            input("i", DType::I64, &[2]),
            buf(BufferKind::Output, DType::F32, &[2, 3]),
        ],
        2,
    );
    let m = generate(&gather, Arch::Sm80);
    assert!(m.host_steps().is_empty());
    let e = &m.entries[0];
    assert!(e.error_word, "gather reports bad indices through an error word");
    assert!(
        e.text.contains(&format!("{}_p3", e.name)),
        "one parameter after the 3 buffers"
    );
    assert!(e.text.contains("st.global.b32"), "sets the error word");
    let scatter = program(
        Op::Scatter(Scatter {
            axis: 0,
            reduce: oar_ir::ops::ScatterReduce::Add,
        }),
        vec![BufferId(0), BufferId(1), BufferId(2)],
        vec![
            input("x", DType::F32, &[4, 3]),
            input("i", DType::I64, &[2]),
            input("u", DType::F32, &[2, 3]),
            buf(BufferKind::Output, DType::F32, &[4, 3]),
        ],
        3,
    );
    let m = generate(&scatter, Arch::Sm80);
    assert!(m.entries.is_empty());
    assert!(matches!(&m.steps[0], Step::Host { reason, .. } if reason.contains("opaque op `scatter`")));
}

#[test]
fn without_a_driver_compile_is_a_typed_unavailable_error() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::of(DType::F32, &[2])).unwrap();
    g.add_output("y", x).unwrap();
    let r = PtxBackend::new().compile(&g, &Weights::new());
    if runtime::driver_present() {
        eprintln!("a CUDA driver is present: the error path is not exercised here");
        return;
    }
    match r {
        Err(BackendError::Unavailable { backend, reason }) => {
            assert_eq!(backend, "ptx");
            assert!(reason.contains("no CUDA driver (libcuda.so not found)"), "{reason}");
        }
        Err(e) => panic!("expected Unavailable, got {e}"),
        Ok(_) => panic!("compiled without a driver"),
    }
    // Asking again gives the same error, without panicking.
    assert!(matches!(
        PtxBackend::new().compile(&g, &Weights::new()),
        Err(BackendError::Unavailable { .. })
    ));
}

#[test]
fn iota_pad_and_concat_are_generated_kernels() {
    let opaque = |op: Op, inputs: Vec<BufferId>, buffers: Vec<Buffer>, out: u32| KernelProgram {
        name: "t".into(),
        buffers,
        kernels: vec![Kernel {
            name: format!("k0_{}", op.name()),
            body: KernelBody::Opaque(OpaqueKernel {
                op,
                inputs,
                regions: vec![],
            }),
            outputs: vec![BufferId(out)],
        }],
        outputs: vec![("y".into(), BufferId(out))],
    };
    let pad = opaque(
        Op::Pad(Pad {
            before: vec![1, 0],
            after: vec![0, 2],
            value: Float(-1.5),
        }),
        vec![BufferId(0)],
        vec![
            input("x", DType::F32, &[2, 3]),
            buf(BufferKind::Output, DType::F32, &[3, 5]),
        ],
        1,
    );
    let m = generate(&pad, Arch::Sm80);
    assert!(m.host_steps().is_empty(), "{:?}", m.host_steps());
    let t = m.text();
    assert!(
        t.contains("setp.lt.and.s64") && t.contains("0fBFC00000"),
        "bounds checks and the fill value"
    );
    let concat = opaque(
        Op::Concat(Concat { axis: 1 }),
        vec![BufferId(0), BufferId(1)],
        vec![
            input("a", DType::I64, &[2, 3]),
            input("b", DType::I64, &[2, 4]),
            buf(BufferKind::Output, DType::I64, &[2, 7]),
        ],
        2,
    );
    let m = generate(&concat, Arch::Sm80);
    assert_eq!(m.entries[0].params, vec![BufferId(2), BufferId(0), BufferId(1)]);
    assert!(m.text().contains("setp.lt.and.u64") && m.text().contains("ld.global.b64"));
    let iota = opaque(
        Op::Iota(Iota {
            shape: dims(&[4, 2]),
            axis: 0,
            dtype: DType::F32,
        }),
        vec![],
        vec![buf(BufferKind::Output, DType::F32, &[4, 2])],
        0,
    );
    let m = generate(&iota, Arch::Sm80);
    assert!(m.text().contains("cvt.rn.f32.s64"));
    let argmax = opaque(
        Op::ArgReduce(ArgReduce {
            op: oar_ir::ops::ArgReduceOp::ArgMax,
            axis: 1,
            keepdim: false,
        }),
        vec![BufferId(0)],
        vec![
            input("x", DType::F16, &[3, 5]),
            buf(BufferKind::Output, DType::I64, &[3]),
        ],
        1,
    );
    let t = generate(&argmax, Arch::Sm80).text();
    assert!(
        t.contains("setp.nan.f32") && t.contains("st.global.b64"),
        "NaN wins; i64 result"
    );
    let random = opaque(
        Op::Random(Random {
            dist: oar_ir::ops::RandomDist::Normal {
                mean: Float(1.0),
                std: Float(2.0),
            },
            shape: dims(&[10]),
            dtype: DType::F32,
            seed: u64::MAX,
        }),
        vec![],
        vec![buf(BufferKind::Output, DType::F32, &[10])],
        0,
    );
    let t = generate(&random, Arch::Sm80).text();
    for needle in [
        "0x9E3779B97F4A7C15",
        "0xFFFFFFFFFFFFFFFF",
        "cvt.rn.f64.u64",
        "sqrt.rn.f64",
        "cvt.rn.f32.f64",
    ] {
        assert!(t.contains(needle), "random: missing `{needle}`");
    }
}

#[test]
fn integer_division_sets_the_error_word() {
    let k = LoopKernel {
        shape: dims(&[8]),
        loads: vec![
            Load {
                buffer: BufferId(0),
                map: IndexMap::identity(&dims(&[8])),
            },
            Load {
                buffer: BufferId(1),
                map: IndexMap::identity(&dims(&[8])),
            },
        ],
        outer: 1,
        reduce: vec![],
        body: vec![
            inst(ScalarOp::Load(0), DType::I32),
            inst(ScalarOp::Load(1), DType::I32),
            inst(ScalarOp::Binary(BinaryOp::Div, 0, 1), DType::I32),
        ],
    };
    let p = program(
        vec![
            input("a", DType::I32, &[8]),
            input("b", DType::I32, &[8]),
            buf(BufferKind::Output, DType::I32, &[8]),
        ],
        KernelBody::Loop(k),
        2,
    );
    let m = generate(&p, Arch::Sm80);
    assert!(m.entries[0].error_word);
    assert!(m.text().contains("setp.eq.s32") && m.text().contains("st.global.b32"));
    // Float division cannot fail: no error word.
    assert!(!generate(&exp_add_bias(DType::F32), Arch::Sm80).entries[0].error_word);
}
