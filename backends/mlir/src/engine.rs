//! Parse, lower and compile a generated module to machine code in this process (MLIR 19's
//! execution engine, through melior).

use crate::MlirError;
use melior::dialect::DialectRegistry;
use melior::ir::Module;
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::{Context, ExecutionEngine};
use std::cell::RefCell;
use std::rc::Rc;

/// The CPU lowering pipeline: structured control flow to branches, math to libm / LLVM
/// intrinsics, everything to the LLVM dialect.
pub const CPU_PIPELINE: &str = "builtin.module(convert-scf-to-cf,convert-math-to-libm,convert-math-to-llvm,\
arith-expand{include-bf16=true},convert-arith-to-llvm,expand-strided-metadata,finalize-memref-to-llvm,\
convert-cf-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts)";

/// A fresh context with every dialect, translation and pass registered; diagnostics are
/// collected into the returned buffer (MLIR otherwise prints them to stderr).
pub fn context() -> (Context, Rc<RefCell<Vec<String>>>) {
    register_all_passes();
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let ctx = Context::new();
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    register_all_llvm_translations(&ctx);
    ctx.enable_multi_threading(false);
    let diags = Rc::new(RefCell::new(Vec::new()));
    let sink = diags.clone();
    ctx.attach_diagnostic_handler(move |d| {
        sink.borrow_mut().push(format!("{} {}", d.location(), d));
        true
    });
    (ctx, diags)
}

fn take(diags: &Rc<RefCell<Vec<String>>>) -> String {
    diags.borrow_mut().drain(..).collect::<Vec<_>>().join("\n")
}

/// Parse `text` (verifying it).
pub fn parse<'c>(ctx: &'c Context, diags: &Rc<RefCell<Vec<String>>>, text: &str) -> Result<Module<'c>, MlirError> {
    let m = Module::parse(ctx, text).ok_or_else(|| MlirError::parse(text, take(diags)))?;
    if !m.as_operation().verify() {
        return Err(MlirError::parse(text, take(diags)));
    }
    Ok(m)
}

/// Run `pipeline` (textual, `builtin.module(...)`) on `m`.
pub fn run_pipeline(
    ctx: &Context,
    diags: &Rc<RefCell<Vec<String>>>,
    m: &mut Module,
    pipeline: &str,
) -> Result<(), MlirError> {
    let pm = PassManager::new(ctx);
    parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline)
        .map_err(|e| MlirError::Lower(format!("pipeline `{pipeline}`: {e}")))?;
    pm.run(m).map_err(|e| MlirError::Lower(format!("{e}: {}", take(diags))))
}

/// Create the JIT for a lowered module (LLVM `-O2`).
pub fn engine(m: &Module) -> ExecutionEngine {
    ExecutionEngine::new(m, 2, &[], false)
}

unsafe extern "C" {
    fn LLVMContextCreate() -> mlir_sys::LLVMContextRef;
    fn LLVMContextDispose(c: mlir_sys::LLVMContextRef);
    fn LLVMPrintModuleToString(m: mlir_sys::LLVMModuleRef) -> *mut std::ffi::c_char;
    fn LLVMDisposeMessage(s: *mut std::ffi::c_char);
    fn LLVMDisposeModule(m: mlir_sys::LLVMModuleRef);
}

/// Translate a module lowered to the LLVM dialect into LLVM IR text
/// (`mlirTranslateModuleToLLVMIR`, printed with the LLVM C API).
pub fn llvm_ir(m: &Module) -> Result<String, MlirError> {
    // Safety: the LLVM context outlives the module translated into it; both are disposed here,
    // the module first; the printed string is copied before it is freed.
    unsafe {
        let ctx = LLVMContextCreate();
        let module = mlir_sys::mlirTranslateModuleToLLVMIR(m.as_operation().to_raw(), ctx);
        if module.is_null() {
            LLVMContextDispose(ctx);
            return Err(MlirError::Lower("translation to LLVM IR failed".into()));
        }
        let s = LLVMPrintModuleToString(module);
        let text = std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned();
        LLVMDisposeMessage(s);
        LLVMDisposeModule(module);
        LLVMContextDispose(ctx);
        Ok(text)
    }
}
