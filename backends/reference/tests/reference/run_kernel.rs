//! `run_kernel`: one kernel of a program run alone, as a compiled backend delegates it.

use oar_backend_reference::run_kernel;
use oar_ir::kernel::{
    Buffer, BufferId, BufferKind, IndexMap, Inst, Kernel, KernelBody, KernelProgram, Load, LoopKernel, ScalarOp,
};
use oar_ir::ops::UnaryOp;
use oar_ir::{BackendError, DType, TensorData, TensorType, Weights};

fn buffer(kind: BufferKind, value: &str) -> Buffer {
    Buffer {
        kind,
        ty: TensorType::of(DType::F32, &[3]),
        value: value.into(),
    }
}

/// `b1 = neg(b0)`, then `b2 = neg(b1)`; `b1` is a temporary the caller holds.
fn program() -> KernelProgram {
    let neg = |from: u32, to: u32| Kernel {
        name: format!("k_neg{to}"),
        body: KernelBody::Loop(LoopKernel {
            shape: TensorType::of(DType::F32, &[3]).shape.dims().to_vec(),
            loads: vec![Load {
                buffer: BufferId(from),
                map: IndexMap::identity(TensorType::of(DType::F32, &[3]).shape.dims()),
            }],
            outer: 1,
            reduce: vec![],
            body: vec![
                Inst {
                    op: ScalarOp::Load(0),
                    dtype: DType::F32,
                },
                Inst {
                    op: ScalarOp::Unary(UnaryOp::Neg, 0),
                    dtype: DType::F32,
                },
            ],
        }),
        outputs: vec![BufferId(to)],
    };
    KernelProgram {
        name: "p".into(),
        buffers: vec![
            buffer(BufferKind::Input { name: "x".into() }, "%0"),
            buffer(BufferKind::Temp, "%1"),
            buffer(BufferKind::Output, "%2"),
        ],
        kernels: vec![neg(0, 1), neg(1, 2)],
        outputs: vec![("y".into(), BufferId(2))],
    }
}

#[test]
fn runs_one_kernel_on_the_buffers_the_caller_holds() {
    let held = TensorData::from_vec(vec![3], vec![1.0f32, -2.0, 3.0]).unwrap();
    let mut asked = Vec::new();
    let mut read = |id: BufferId| {
        asked.push(id);
        Ok(held.clone())
    };
    let out = run_kernel(&program(), 1, &Weights::new(), &mut read).unwrap();
    assert_eq!(asked, [BufferId(1)], "only the kernel's operands are read");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), [-1.0, 2.0, -3.0]);
}

#[test]
fn a_bad_index_or_a_failed_read_is_an_error() {
    let mut read = |_: BufferId| -> Result<TensorData, BackendError> {
        Err(BackendError::Unavailable {
            backend: "npu".into(),
            reason: "device lost".into(),
        })
    };
    let e = run_kernel(&program(), 7, &Weights::new(), &mut read)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no kernel 7 (2 kernels)"), "{e}");
    let e = run_kernel(&program(), 0, &Weights::new(), &mut read)
        .unwrap_err()
        .to_string();
    assert!(e.contains("device lost"), "{e}");
}
