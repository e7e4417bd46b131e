//! The GPU path: the same kernels generated for [`Target::Gpu`] (one `gpu.launch` each),
//! outlined and lowered through NVVM to PTX by MLIR (`gpu-module-to-binary{format=isa}`).
//! Memrefs are passed with MLIR's bare-pointer convention: every buffer is one `.u64` device
//! pointer. The transcendentals arrive expanded (`oar_passes::legalize`); the rounding ops
//! left in `math` (`math.floor`, ...) become libdevice calls (`__nv_floor`), linked from
//! `libdevice.10.bc` when one is given, else left as `.extern` functions. Nothing here needs
//! a GPU; [`crate::ptx_module`] assembles the kernels into one PTX module that the `ptx`
//! backend's cudarc runtime launches (`mlir-gpu`, see `docs/MLIR.md`).

use crate::codegen::{CodegenError, Target, generate_for};
use crate::{MlirError, engine};
use oar_ir::kernel::{BufferId, KernelBody, KernelProgram};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The first stage: every `gpu.launch` becomes a `gpu.module` with one kernel, launched by a
/// `gpu.launch_func` whose operands give the kernel's parameter order and launch sizes.
pub const OUTLINING: &str = "builtin.module(gpu-kernel-outlining)";

/// The second stage, after [`OUTLINING`]: the kernels lowered for `chip` (`sm_80`) through
/// NVVM to PTX with bare-pointer memref arguments, linking `libdevice` if given.
pub fn lowering(chip: &str, libdevice: Option<&Path>) -> String {
    let link = libdevice.map(|p| format!(" l={}", p.display())).unwrap_or_default();
    format!(
        "builtin.module(nvvm-attach-target{{chip={chip} O=3{link}}},\
gpu.module(convert-scf-to-cf,arith-expand{{include-bf16=true}},\
convert-gpu-to-nvvm{{use-bare-ptr-memref-call-conv=true}},reconcile-unrealized-casts),\
gpu-to-llvm{{use-bare-pointers-for-kernels=true}},reconcile-unrealized-casts,gpu-module-to-binary{{format=isa}})"
    )
}

/// `libdevice.10.bc`: `$OAR_LIBDEVICE`, `$CUDA_HOME`/`$CUDA_PATH`/`/usr/local/cuda`
/// (`nvvm/libdevice/`), Debian's `nvidia-cuda-toolkit`, or the `nvidia-cuda-nvcc-cu12` Python
/// wheel (asked once per process through `python3`). `None` when none is found.
pub fn find_libdevice() -> Option<PathBuf> {
    const REL: &str = "nvvm/libdevice/libdevice.10.bc";
    if let Some(p) = std::env::var_os("OAR_LIBDEVICE") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let roots = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .chain([PathBuf::from("/usr/local/cuda")]);
    let candidates = roots
        .map(|r| r.join(REL))
        .chain([PathBuf::from("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc")]);
    for p in candidates {
        if p.is_file() {
            return Some(p);
        }
    }
    static WHEEL: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    WHEEL
        .get_or_init(|| {
            let out = std::process::Command::new("python3")
                .args(["-c", "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])"])
                .stderr(std::process::Stdio::null())
                .output()
                .ok()?;
            let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(REL);
            (out.status.success() && p.is_file()).then_some(p)
        })
        .clone()
}

/// One kernel's PTX.
#[derive(Clone, Debug)]
pub struct PtxKernel {
    /// The kernel's name in the program.
    pub kernel: String,
    /// The PTX module MLIR produced for it (`.entry oar_k<N>_kernel`).
    pub ptx: String,
}

/// A parameter of a generated kernel's `.entry` (each one `.u64` pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelArg {
    /// A program buffer's device pointer.
    Buffer(BufferId),
    /// The kernel's error word (a `memref<1xi32>`: 4 bytes the kernel ORs error bits into).
    ErrorWord,
}

/// One generated kernel lowered to PTX, with what launching it needs.
#[derive(Clone, Debug)]
pub struct GpuKernel {
    /// Kernel index in the program.
    pub index: usize,
    /// The kernel's name in the program.
    pub kernel: String,
    /// The `.entry` name (`oar_k<N>_kernel`).
    pub entry: String,
    /// The `.entry` parameters, in order (from the outlined `gpu.launch_func`).
    pub args: Vec<KernelArg>,
    /// Blocks per grid (x, y, z), from the `gpu.launch`.
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z), from the `gpu.launch`.
    pub block: (u32, u32, u32),
    /// The PTX module MLIR produced for it (its own `.version`/`.target` header).
    pub ptx: String,
}

/// Generate `program`'s kernels for the GPU, lower them for `chip` and return each generated
/// kernel's PTX (opaque kernels have none: they would run on the host).
pub fn ptx(program: &KernelProgram, chip: &str, libdevice: Option<&Path>) -> Result<Vec<PtxKernel>, MlirError> {
    Ok(kernels(program, chip, libdevice)?
        .into_iter()
        .filter_map(Result::ok)
        .map(|k| PtxKernel {
            kernel: k.kernel,
            ptx: k.ptx,
        })
        .collect())
}

/// Generate `program`'s kernels for the GPU and lower them for `chip`: per program kernel,
/// its [`GpuKernel`], or why it has none (an opaque kernel left to the host). A loop or
/// contraction kernel the generator cannot express is an error.
pub fn kernels(
    program: &KernelProgram,
    chip: &str,
    libdevice: Option<&Path>,
) -> Result<Vec<Result<GpuKernel, CodegenError>>, MlirError> {
    let module = generate_for(program, Target::Gpu);
    for (k, r) in program.kernels.iter().zip(&module.kernels) {
        if let (Err(reason), false) = (r, matches!(k.body, KernelBody::Opaque(_))) {
            let (kernel, reason) = (k.name.clone(), reason.clone());
            return Err(MlirError::Codegen { kernel, reason });
        }
    }
    let (outlined, text) = if module.kernels.iter().any(Result::is_ok) {
        let (ctx, diags) = engine::context();
        let mut m = engine::parse(&ctx, &diags, &module.text)?;
        engine::run_pipeline(&ctx, &diags, &mut m, OUTLINING)?;
        let outlined = m.as_operation().to_string();
        engine::run_pipeline(&ctx, &diags, &mut m, &lowering(chip, libdevice))?;
        (outlined, m.as_operation().to_string())
    } else {
        (String::new(), String::new())
    };
    let mut out = Vec::with_capacity(program.kernels.len());
    for (index, (k, r)) in program.kernels.iter().zip(module.kernels).enumerate() {
        let f = match r {
            Ok(f) => f,
            Err(reason) => {
                out.push(Err(reason));
                continue;
            }
        };
        let kernel = k.name.clone();
        let sym = &f.symbol;
        let fail = |detail: String| MlirError::Lower(format!("kernel {kernel}: {detail}"));
        let launch = launch_of(&outlined, sym, &f.params).map_err(fail)?;
        let ptx = assembly(&text, &format!("gpu.binary @{sym}_kernel "))
            .ok_or_else(|| fail(format!("no PTX for `{sym}` in the lowered module")))?;
        out.push(Ok(GpuKernel {
            index,
            kernel,
            entry: format!("{sym}_kernel"),
            args: launch.args,
            grid: launch.grid,
            block: launch.block,
            ptx,
        }));
    }
    Ok(out)
}

struct LaunchFunc {
    args: Vec<KernelArg>,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
}

/// Read the `gpu.launch_func` of host function `@sym` in the outlined module: its operands
/// (`%argN` is the function's N-th argument: `params[N]`, then the error word) and its launch
/// sizes (`arith.constant`s of the function).
fn launch_of(outlined: &str, sym: &str, params: &[BufferId]) -> Result<LaunchFunc, String> {
    let head = format!("func.func @{sym}(");
    let start = outlined
        .find(&head)
        .ok_or_else(|| format!("no host function `@{sym}` after outlining"))?;
    let body = &outlined[start + head.len()..];
    let at = body
        .find("gpu.launch_func")
        .ok_or_else(|| format!("`@{sym}` has no gpu.launch_func"))?;
    if body[..at].contains("func.func @") {
        return Err(format!("`@{sym}` has no gpu.launch_func"));
    }
    let consts: HashMap<&str, i64> = body[..at]
        .lines()
        .filter_map(|l| {
            let (name, rhs) = l.trim().split_once(" = arith.constant ")?;
            let v = rhs.strip_suffix(" : index")?.trim().parse().ok()?;
            Some((name, v))
        })
        .collect();
    let line = body[at..].lines().next().unwrap_or_default();
    let target = format!("@{sym}_kernel::@{sym}_kernel ");
    if !line.contains(&target) {
        return Err(format!("unexpected launch `{line}`"));
    }
    let sizes = |key: &str| -> Result<(u32, u32, u32), String> {
        let list = between(line, key, ")").ok_or_else(|| format!("no `{key}` in `{line}`"))?;
        let v = list
            .split(',')
            .map(|n| {
                let c = consts
                    .get(n.trim())
                    .ok_or_else(|| format!("launch size `{}` is not a constant", n.trim()))?;
                u32::try_from(*c).map_err(|_| format!("launch size {c} out of range"))
            })
            .collect::<Result<Vec<u32>, String>>()?;
        match v.as_slice() {
            [x, y, z] => Ok((*x, *y, *z)),
            _ => Err(format!("launch sizes `{list}`")),
        }
    };
    let (grid, block) = (sizes("blocks in (")?, sizes("threads in (")?);
    let list = between(line, "args(", ")").unwrap_or_default();
    let mut args = Vec::new();
    for a in list.split(", ").filter(|a| !a.trim().is_empty()) {
        let (name, ty) = a.split_once(" : ").ok_or_else(|| format!("launch operand `{a}`"))?;
        let n = name
            .trim()
            .strip_prefix("%arg")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|_| ty.trim().starts_with("memref<"))
            .ok_or_else(|| format!("the kernel captures `{a}`, not a buffer argument (only pointers can be passed)"))?;
        args.push(match n.cmp(&params.len()) {
            std::cmp::Ordering::Less => KernelArg::Buffer(params[n]),
            std::cmp::Ordering::Equal => KernelArg::ErrorWord,
            std::cmp::Ordering::Greater => return Err(format!("launch operand `{a}` is no argument")),
        });
    }
    Ok(LaunchFunc { args, grid, block })
}

/// The text after `open` up to the next `close`.
fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let rest = &s[s.find(open)? + open.len()..];
    Some(&rest[..rest.find(close)?])
}

/// The `assembly = "..."` string of the `gpu.binary` op starting with `head`, unescaped
/// (MLIR prints `"`, `\` and non-printable bytes as `\XX`), without the C string's
/// terminating NUL that MLIR keeps in it.
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
    while out.last() == Some(&0) {
        out.pop();
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outlined by MLIR 19 from a launch that used its block-size constant inside the body.
    const OUTLINED: &str = "module attributes {gpu.container_module} {
  func.func @oar_k0(%arg0: memref<300xf32>, %arg1: memref<300xf32>, %arg2: memref<1xi32>) {
    %c1 = arith.constant 1 : index
    %c256 = arith.constant 256 : index
    %c2 = arith.constant 2 : index
    gpu.launch_func  @oar_k0_kernel::@oar_k0_kernel blocks in (%c2, %c1, %c1) threads in (%c256, %c1, %c1)  args(%c256 : index, %arg1 : memref<300xf32>, %arg0 : memref<300xf32>, %arg2 : memref<1xi32>)
    return
  }
}";

    #[test]
    fn launch_operands_give_the_parameter_order_and_sizes() {
        let text = OUTLINED.replace("args(%c256 : index, ", "args(");
        let l = launch_of(&text, "oar_k0", &[BufferId(4), BufferId(7)]).unwrap();
        let want = [
            KernelArg::Buffer(BufferId(7)),
            KernelArg::Buffer(BufferId(4)),
            KernelArg::ErrorWord,
        ];
        assert_eq!(l.args, want);
        assert_eq!((l.grid, l.block), ((2, 1, 1), (256, 1, 1)));
    }

    #[test]
    fn a_captured_scalar_or_a_missing_launch_is_an_error() {
        let e = launch_of(OUTLINED, "oar_k0", &[BufferId(4), BufferId(7)])
            .err()
            .unwrap();
        assert!(e.contains("captures `%c256 : index`"), "{e}");
        let e = launch_of(OUTLINED, "oar_k1", &[]).err().unwrap();
        assert!(e.contains("no host function"), "{e}");
        let text = OUTLINED.replace("(%c2, %c1, %c1)", "(%x, %c1, %c1)");
        let e = launch_of(&text, "oar_k0", &[BufferId(4), BufferId(7)]).err().unwrap();
        assert!(e.contains("`%x` is not a constant"), "{e}");
    }
}
