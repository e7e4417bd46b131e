//! The GPU path: the same kernels generated for [`Target::Gpu`] (one `gpu.launch` each),
//! outlined and lowered through NVVM to PTX by MLIR (`gpu-module-to-binary{format=isa}`).
//! Float math (`math.exp`, ...) becomes libdevice calls (`__nv_exp`), linked from
//! `libdevice.10.bc` when one is given, else left as `.extern` functions. Nothing here needs
//! a GPU; launching the PTX is not wired up (see `docs/MLIR.md`).

use crate::codegen::{Target, generate_for};
use crate::{MlirError, jit};
use oar_ir::kernel::{KernelBody, KernelProgram};
use std::path::Path;

/// The GPU pipeline for `chip` (`sm_80`), linking `libdevice` if given.
pub fn pipeline(chip: &str, libdevice: Option<&Path>) -> String {
    let link = libdevice.map(|p| format!(" l={}", p.display())).unwrap_or_default();
    format!(
        "builtin.module(gpu-kernel-outlining,nvvm-attach-target{{chip={chip} O=3{link}}},\
gpu.module(convert-scf-to-cf,arith-expand{{include-bf16=true}},convert-gpu-to-nvvm,reconcile-unrealized-casts),\
gpu-to-llvm,reconcile-unrealized-casts,gpu-module-to-binary{{format=isa}})"
    )
}

/// One kernel's PTX.
#[derive(Clone, Debug)]
pub struct PtxKernel {
    /// The kernel's name in the program.
    pub kernel: String,
    /// The PTX module MLIR produced for it (`.entry oar_k<N>_kernel`).
    pub ptx: String,
}

/// Generate `program`'s kernels for the GPU, lower them for `chip` and return each generated
/// kernel's PTX (opaque kernels have none: they would run on the host).
pub fn ptx(program: &KernelProgram, chip: &str, libdevice: Option<&Path>) -> Result<Vec<PtxKernel>, MlirError> {
    let module = generate_for(program, Target::Gpu);
    for (k, r) in program.kernels.iter().zip(&module.kernels) {
        if let (Err(reason), false) = (r, matches!(k.body, KernelBody::Opaque(_))) {
            let (kernel, reason) = (k.name.clone(), reason.clone());
            return Err(MlirError::Codegen { kernel, reason });
        }
    }
    let symbols: Vec<(String, String)> = program
        .kernels
        .iter()
        .zip(&module.kernels)
        .filter_map(|(k, r)| r.as_ref().ok().map(|f| (k.name.clone(), f.symbol.clone())))
        .collect();
    if symbols.is_empty() {
        return Ok(Vec::new());
    }
    let (ctx, diags) = jit::context();
    let mut m = jit::parse(&ctx, &diags, &module.text)?;
    jit::run_pipeline(&ctx, &diags, &mut m, &pipeline(chip, libdevice))?;
    let text = m.as_operation().to_string();
    symbols
        .into_iter()
        .map(|(kernel, sym)| {
            let ptx = assembly(&text, &format!("gpu.binary @{sym}_kernel ")).ok_or_else(|| {
                MlirError::Lower(format!("kernel {kernel}: no PTX for `{sym}` in the lowered module"))
            })?;
            Ok(PtxKernel { kernel, ptx })
        })
        .collect()
}

/// The `assembly = "..."` string of the `gpu.binary` op starting with `head`, unescaped
/// (MLIR prints `"`, `\` and non-printable bytes as `\XX`).
fn assembly(text: &str, head: &str) -> Option<String> {
    let start = text.find(head)?;
    let rest = &text[start..];
    let body = &rest[rest.find("assembly = \"")? + "assembly = \"".len()..];
    let bytes = body.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < bytes.len() && bytes[i] != b'"' {
        if bytes[i] == b'\\' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}
