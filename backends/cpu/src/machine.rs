//! Machine code in this process: the generated kernels compiled by Cranelift into executable
//! memory (they call nothing: math arrives expanded by `oar_passes::legalize`). ("jit" in oar
//! means tracing, `oar::jit`; this is the code generator's in-process output.)

use crate::CpuError;
use crate::codegen;
use crate::lower::Lowered;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use oar_cpu_runtime::KernelFn;

/// Which instruction-set features generated code may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuTarget {
    /// Every x86-64 CPU since 2009 (x86-64-v2: SSE4.2 and POPCNT, Cranelift's `nehalem`
    /// preset); other architectures their baseline. The default for AOT binaries: the runtime's
    /// hand-written kernels choose AVX2 or AVX-512 when the binary runs, the generated glue
    /// (128-bit SIMD either way) does not need them.
    #[default]
    Portable,
    /// What the compiling host has (the JIT's choice): AVX encodings, FMA, BMI, AVX-512 where
    /// present. A binary compiled so may not run on an older CPU.
    Native,
}

impl std::str::FromStr for CpuTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<CpuTarget, String> {
        match s {
            "portable" => Ok(CpuTarget::Portable),
            "native" => Ok(CpuTarget::Native),
            _ => Err(format!("unknown cpu target `{s}` (portable, native)")),
        }
    }
}

/// The ISA for `target` with oar's code generation settings (optimized for speed).
/// `pic`: position-independent code, needed for objects linked into shared libraries;
/// cranelift-jit needs it off.
pub fn isa(target: CpuTarget, pic: bool) -> Result<OwnedTargetIsa, CpuError> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v)
            .map_err(|e| CpuError::Module(format!("cranelift flag {k}={v}: {e}")))
    };
    set(&mut flags, "opt_level", "speed")?;
    set(&mut flags, "is_pic", if pic { "true" } else { "false" })?;
    set(
        &mut flags,
        "enable_verifier",
        if cfg!(debug_assertions) { "true" } else { "false" },
    )?;
    let builder = match target {
        CpuTarget::Native => cranelift_native::builder().map_err(|e| CpuError::Module(format!("host ISA: {e}")))?,
        CpuTarget::Portable => {
            let triple = target_lexicon::Triple::host();
            let mut b = cranelift_codegen::isa::lookup(triple.clone())
                .map_err(|e| CpuError::Module(format!("ISA for {triple}: {e}")))?;
            if triple.architecture == target_lexicon::Architecture::X86_64 {
                b.enable("nehalem")
                    .map_err(|e| CpuError::Module(format!("x86-64-v2 preset: {e}")))?;
            }
            b
        }
    };
    builder
        .finish(settings::Flags::new(flags))
        .map_err(|e| CpuError::Module(format!("ISA: {e}")))
}

/// The host ISA with every feature it has (what the in-process compiler uses).
pub fn host_isa(pic: bool) -> Result<OwnedTargetIsa, CpuError> {
    isa(CpuTarget::Native, pic)
}

/// Machine code for a lowered program, kept alive as long as its functions are used.
pub struct MachineCode {
    module: Option<JITModule>,
    /// The function table, in `Lowered::funcs` order.
    pub funcs: Vec<KernelFn>,
}

// Safety: the module is only kept to own the executable memory; it is never touched again
// until it is dropped, and the function pointers are plain code.
unsafe impl Send for MachineCode {}
unsafe impl Sync for MachineCode {}

impl Drop for MachineCode {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // Safety: nothing else holds the function pointers once the MachineCode is dropped
            // (executables keep the MachineCode in an Arc next to their Model).
            unsafe { m.free_memory() };
        }
    }
}

/// Compile every function of `lowered` into executable memory.
pub fn compile(lowered: &Lowered) -> Result<MachineCode, CpuError> {
    let isa = host_isa(false)?;
    let builder = JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    let mut module = JITModule::new(builder);
    let mut ids = Vec::with_capacity(lowered.funcs.len());
    for spec in &lowered.funcs {
        let (id, _) = codegen::define_function(&mut module, spec, &spec.buffers, false)?;
        ids.push(id);
    }
    module
        .finalize_definitions()
        .map_err(|e| CpuError::Module(format!("finalizing JIT code: {e}")))?;
    let funcs = ids
        .into_iter()
        .map(|id| {
            let p = module.get_finalized_function(id);
            // Safety: every function was defined with the KernelFn signature.
            unsafe { std::mem::transmute::<*const u8, KernelFn>(p) }
        })
        .collect();
    Ok(MachineCode {
        module: Some(module),
        funcs,
    })
}
