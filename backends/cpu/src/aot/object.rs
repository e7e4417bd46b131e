//! The relocatable object of an AOT model: kernel functions, blob, function table and the
//! entry function; and the CLIF listing.

use crate::CpuError;
use crate::codegen;
use crate::lower::Lowered;
use crate::machine::{CpuTarget, isa};
use cranelift_codegen::ir::{AbiParam, InstBuilder, types};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{DataDescription, DataId, FuncId, Linkage, Module};
use cranelift_object::{ObjectBuilder, ObjectModule};
use oar_cpu_runtime::Step;
use std::fmt::Write;

/// Which entry function the object gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// `int main(int argc, char** argv)` calling `oar_rt_exe_main`.
    Main,
    /// `oar_model* oar_model_create(const char* weights_path, char** error)` calling
    /// `oar_rt_model_create`.
    Library,
}

fn module_err(what: &str) -> impl Fn(cranelift_module::ModuleError) -> CpuError + '_ {
    move |e| CpuError::Module(format!("{what}: {e}"))
}

fn new_module(name: &str, target: CpuTarget) -> Result<ObjectModule, CpuError> {
    let builder = ObjectBuilder::new(isa(target, true)?, name, cranelift_module::default_libcall_names())
        .map_err(module_err("object module"))?;
    Ok(ObjectModule::new(builder))
}

/// Define every kernel function of `lowered`; returns their ids and CLIF texts (if wanted).
fn define_kernels(
    module: &mut ObjectModule,
    lowered: &Lowered,
    want_clif: bool,
) -> Result<Vec<(FuncId, Option<String>)>, CpuError> {
    lowered
        .funcs
        .iter()
        .map(|spec| codegen::define_function(module, spec, &spec.buffers, want_clif))
        .collect()
}

/// The object file of a lowered model with its blob and entry function.
pub(crate) fn build_object(
    lowered: &Lowered,
    blob: &[u8],
    entry: Entry,
    target: CpuTarget,
) -> Result<Vec<u8>, CpuError> {
    let mut module = new_module(&lowered.cpu.program.name, target)?;
    let funcs = define_kernels(&mut module, lowered, false)?;
    let ptr = module.isa().pointer_bytes() as usize;

    let blob_id = module
        .declare_data("oar_aot_blob", Linkage::Local, false, false)
        .map_err(module_err("blob"))?;
    let mut d = DataDescription::new();
    d.define(blob.to_vec().into_boxed_slice());
    d.set_align(16);
    module.define_data(blob_id, &d).map_err(module_err("blob"))?;

    let table_id = module
        .declare_data("oar_aot_kernels", Linkage::Local, false, false)
        .map_err(module_err("kernel table"))?;
    let mut d = DataDescription::new();
    d.define(vec![0u8; ptr * funcs.len().max(1)].into_boxed_slice());
    d.set_align(ptr as u64);
    for (i, (id, _)) in funcs.iter().enumerate() {
        let f = module.declare_func_in_data(*id, &mut d);
        d.write_function_addr((i * ptr) as u32, f);
    }
    module.define_data(table_id, &d).map_err(module_err("kernel table"))?;

    define_entry(&mut module, entry, blob_id, blob.len(), table_id, funcs.len())?;
    let product = module.finish();
    product
        .emit()
        .map_err(|e| CpuError::Module(format!("writing the object file: {e}")))
}

/// The entry function: forwards its arguments plus (blob, blob_len, table, n_funcs) to the
/// runtime.
fn define_entry(
    module: &mut ObjectModule,
    entry: Entry,
    blob: DataId,
    blob_len: usize,
    table: DataId,
    n_funcs: usize,
) -> Result<(), CpuError> {
    let ptr = module.isa().pointer_type();
    let (name, runtime, params, ret): (&str, &str, Vec<_>, _) = match entry {
        Entry::Main => ("main", "oar_rt_exe_main", vec![types::I32, ptr], types::I32),
        Entry::Library => ("oar_model_create", "oar_rt_model_create", vec![ptr, ptr], ptr),
    };
    let mut sig = module.make_signature();
    sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
    sig.returns.push(AbiParam::new(ret));
    // runtime(first param, [second param,] blob, blob_len, table, n_funcs [, rest]):
    // oar_rt_exe_main(argc, argv, blob, len, table, n) and
    // oar_rt_model_create(blob, len, table, n, weights_path, error).
    let mut rsig = module.make_signature();
    let data_args = [ptr, types::I64, ptr, types::I64];
    let rparams: Vec<_> = match entry {
        Entry::Main => params.iter().chain(&data_args).copied().collect(),
        Entry::Library => data_args.iter().chain(&params).copied().collect(),
    };
    rsig.params.extend(rparams.into_iter().map(AbiParam::new));
    rsig.returns.push(AbiParam::new(ret));
    let fid = module
        .declare_function(name, Linkage::Export, &sig)
        .map_err(module_err(name))?;
    let rid = module
        .declare_function(runtime, Linkage::Import, &rsig)
        .map_err(module_err(runtime))?;

    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        let block = b.create_block();
        b.append_block_params_for_function_params(block);
        b.switch_to_block(block);
        b.seal_block(block);
        let args = b.block_params(block).to_vec();
        let gv_blob = module.declare_data_in_func(blob, b.func);
        let gv_table = module.declare_data_in_func(table, b.func);
        let blob_ptr = b.ins().symbol_value(ptr, gv_blob);
        let len = b.ins().iconst(types::I64, blob_len as i64);
        let table_ptr = b.ins().symbol_value(ptr, gv_table);
        let n = b.ins().iconst(types::I64, n_funcs as i64);
        let data = [blob_ptr, len, table_ptr, n];
        let call_args: Vec<_> = match entry {
            Entry::Main => args.iter().chain(&data).copied().collect(),
            Entry::Library => data.iter().chain(&args).copied().collect(),
        };
        let callee = module.declare_func_in_func(rid, b.func);
        let call = b.ins().call(callee, &call_args);
        let r = b.inst_results(call)[0];
        b.ins().return_(&[r]);
        b.finalize(module.isa().frontend_config());
    }
    module.define_function(fid, &mut ctx).map_err(module_err(name))?;
    Ok(())
}

/// How each kernel of a lowered program runs, as `;` comment lines.
fn step_listing(lowered: &Lowered) -> String {
    let p = &lowered.cpu.program;
    let mut s = String::new();
    let funcs = lowered.funcs.len();
    let interp = lowered
        .cpu
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Interpret { .. }))
        .count();
    let _ = writeln!(
        s,
        "; oar model `{}`: {} kernels, {funcs} generated functions, {interp} kernels interpreted",
        p.name,
        p.kernels.len()
    );
    for step in &lowered.cpu.steps {
        let line = match step {
            Step::Loop { kernel, call } => format!(
                "kernel {kernel} `{}`: generated function {} `{}` over {} outer iterations (cost {} per iteration)",
                p.kernels[*kernel as usize].name,
                call.func,
                lowered.funcs[call.func as usize].name,
                call.extent,
                call.cost
            ),
            Step::Contraction {
                kernel,
                epilogue,
                plane_iters,
            } => format!(
                "kernel {kernel} `{}`: gemm contraction{}",
                p.kernels[*kernel as usize].name,
                match epilogue {
                    Some(c) if *plane_iters > 0 => format!(
                        ", then epilogue function {} `{}` in place, plane by plane where the path completes planes ({plane_iters} iterations each)",
                        c.func, lowered.funcs[c.func as usize].name
                    ),
                    Some(c) => format!(
                        ", then epilogue function {} `{}` in place",
                        c.func, lowered.funcs[c.func as usize].name
                    ),
                    None => String::new(),
                }
            ),
            Step::Control { kernel, regions } => format!(
                "kernel {kernel} `{}`: control flow on the host, its regions compiled (region programs {regions:?})",
                p.kernels[*kernel as usize].name
            ),
            Step::Rows { kernel, rows, pieces } => format!(
                "kernel {kernel} `{}`: {} reduction stages then the epilogue over {rows} rows, {}: functions {}",
                p.kernels[*kernel as usize].name,
                pieces.len() - 1,
                if pieces.iter().all(|x| x.per_row > 0) {
                    "a block of rows at a time"
                } else {
                    "one piece after another"
                },
                pieces
                    .iter()
                    .map(|x| format!("{} `{}`", x.call.func, lowered.funcs[x.call.func as usize].name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Step::Native { kernel, epilogue } => format!(
                "kernel {kernel} `{}`: native kernel of the runtime{}",
                p.kernels[*kernel as usize].name,
                epilogue.as_ref().map_or(String::new(), |e| format!(
                    ", kernel {} as its epilogue: function {} `{}`{}",
                    e.kernel,
                    e.call.func,
                    lowered.funcs[e.call.func as usize].name,
                    if e.plane_iters > 0 { " plane by plane" } else { "" }
                ))
            ),
            Step::Fused { kernel, into } => format!(
                "kernel {kernel} `{}`: run by kernel {into}'s step, as its epilogue",
                p.kernels[*kernel as usize].name
            ),
            Step::Fail { kernel, detail } => format!(
                "kernel {kernel} `{}`: reports an error when reached ({detail})",
                p.kernels[*kernel as usize].name
            ),
            Step::Interpret { kernel, reason } => format!(
                "kernel {kernel} `{}`: interpreted by the reference backend ({reason})",
                p.kernels[*kernel as usize].name
            ),
        };
        let _ = writeln!(s, ";   {line}");
    }
    s
}

/// The CLIF text of every generated function, each under a comment naming its kernel, after
/// a listing of how every kernel runs (compiled, gemm, or interpreted and why).
pub fn clif_listing(lowered: &Lowered, target: CpuTarget) -> Result<String, CpuError> {
    let mut module = new_module(&lowered.cpu.program.name, target)?;
    let funcs = define_kernels(&mut module, lowered, true)?;
    let mut s = step_listing(lowered);
    let p = &lowered.cpu.program;
    for (i, ((_, clif), spec)) in funcs.iter().zip(&lowered.funcs).enumerate() {
        let kernel = lowered.cpu.steps.iter().find_map(|st| match st {
            Step::Loop { kernel, call } if call.func as usize == i => Some((*kernel, "loop kernel")),
            Step::Rows { kernel, pieces, .. } if pieces.iter().any(|x| x.call.func as usize == i) => {
                Some((*kernel, "piece of staged kernel"))
            }
            Step::Contraction {
                kernel,
                epilogue: Some(c),
                ..
            } if c.func as usize == i => Some((*kernel, "epilogue of contraction")),
            _ => None,
        });
        let _ = writeln!(s);
        let out = p.buffer(spec.out);
        match kernel {
            Some((k, what)) => {
                let _ = writeln!(
                    s,
                    "; function {i} `{}`: {what} {k} `{}`, writes {} ({}, {})",
                    spec.name, p.kernels[k as usize].name, spec.out, out.value, out.ty
                );
            }
            None => {
                let _ = writeln!(s, "; function {i} `{}`: writes {}", spec.name, spec.out);
            }
        }
        s.push_str(clif.as_deref().unwrap_or("; (no CLIF text)\n"));
    }
    Ok(s)
}
