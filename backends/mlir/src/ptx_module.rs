//! MLIR-made kernels as one [`PtxModule`] of the `ptx` backend, so that its cudarc runtime
//! (`oar_backend_ptx::runtime::GpuProgram`) loads and launches them: one [`Entry`] per
//! generated kernel, a host step per opaque kernel MLIR does not generate.
//!
//! Each kernel's PTX (one module per kernel, from [`gpu::kernels`]) loses its
//! `.version`/`.target`/`.address_size` lines ([`PtxModule::text`] writes the `ptx` backend's
//! header: ISA [`PTX_VERSION`], which must be at least the version MLIR declared). Its other
//! top-level items are kept, except that the functions and variables a kernel defines besides
//! its `.entry` (libdevice functions LLVM did not inline, libdevice tables such as
//! `__cudart_i2opi_f`) are renamed with the entry's name as a suffix, so that two kernels
//! never define the same symbol, and `.extern` declarations (libdevice functions when
//! `libdevice.10.bc` was not linked) appear once, in the first entry that needs them.

use crate::MlirError;
use crate::codegen::CodegenError;
use crate::gpu::{self, GpuKernel, KernelArg};
use oar_backend_ptx::codegen::{Arch, Entry, Launch, PTX_VERSION, PtxModule, Step};
use oar_ir::kernel::KernelProgram;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Generate `program`'s kernels for the GPU, lower them through MLIR to PTX for `arch`
/// (linking `libdevice` if given) and assemble them into one module with its schedule.
pub fn ptx_module(program: &KernelProgram, arch: Arch, libdevice: Option<&Path>) -> Result<PtxModule, MlirError> {
    assemble(arch, gpu::kernels(program, arch.name(), libdevice)?)
}

/// Assemble lowered kernels (one per program kernel, in order, as [`gpu::kernels`] returns
/// them) into one module for `arch`.
pub fn assemble(arch: Arch, kernels: Vec<Result<GpuKernel, CodegenError>>) -> Result<PtxModule, MlirError> {
    let (mut entries, mut steps, mut externs) = (Vec::new(), Vec::new(), HashSet::new());
    for (kernel, k) in kernels.into_iter().enumerate() {
        match k {
            Ok(k) => {
                let fail = |detail: String| MlirError::Ptx {
                    kernel: k.kernel.clone(),
                    detail,
                };
                let e = entry(&k, arch, &mut externs).map_err(fail)?;
                steps.push(Step::Launch {
                    kernel: k.index,
                    entry: entries.len(),
                });
                entries.push(e);
            }
            Err(reason) => steps.push(Step::Host {
                kernel,
                reason: reason.to_string(),
            }),
        }
    }
    Ok(PtxModule { arch, entries, steps })
}

/// The functions a module declares `.extern` and nobody defines: libdevice functions when
/// `libdevice.10.bc` was not linked (the driver cannot load such a module).
pub fn unresolved_externs(module: &PtxModule) -> Vec<String> {
    let mut names = Vec::new();
    for e in &module.entries {
        for item in items(&strip_comments(&e.text)) {
            if let Item::Extern(name) = classify(&item) {
                names.push(name);
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

fn entry(k: &GpuKernel, arch: Arch, externs: &mut HashSet<String>) -> Result<Entry, String> {
    // MLIR's `assembly` string ends with the C string's NUL; the runtime hands the whole
    // module to the driver as one C string, so no NUL may remain inside it.
    let ptx = k.ptx.trim_end_matches('\0');
    if ptx.contains('\0') {
        return Err("a NUL byte inside its PTX".into());
    }
    let mut body = String::new();
    for line in strip_comments(ptx).lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix(".version ") {
            let (have, max) = (version(v), version(PTX_VERSION));
            if have.is_none() || have > max {
                return Err(format!("MLIR emitted PTX ISA {v}, the module declares {PTX_VERSION}"));
            }
        } else if let Some(t) = t.strip_prefix(".target ") {
            if t.split(',').next().map(str::trim) != Some(arch.name()) {
                return Err(format!("MLIR emitted PTX for `{t}`, the module targets {arch}"));
            }
        } else if let Some(a) = t.strip_prefix(".address_size ") {
            if a.trim() != "64" {
                return Err(format!("MLIR emitted PTX with .address_size {a}"));
            }
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    let items = items(&body);
    let mut renames = HashMap::new();
    let mut entry_params = None;
    for item in &items {
        match classify(item) {
            Item::Entry(name, params) if name == k.entry => {
                if entry_params.replace(params).is_some() {
                    return Err(format!("`.entry {name}` twice"));
                }
            }
            Item::Entry(name, _) => return Err(format!("unexpected `.entry {name}`")),
            Item::Defines(name) => {
                renames.insert(name.clone(), format!("{name}_{}", k.entry));
            }
            Item::Extern(_) | Item::Other => {}
        }
    }
    let Some(n_params) = entry_params else {
        return Err(format!("no `.entry {}` in its PTX", k.entry));
    };
    if n_params != k.args.len() {
        return Err(format!(
            "`.entry {}` has {n_params} parameters, the launch passes {}",
            k.entry,
            k.args.len()
        ));
    }
    let error_word = k.args.last() == Some(&KernelArg::ErrorWord);
    let buffers = &k.args[..k.args.len() - usize::from(error_word)];
    let mut params = Vec::with_capacity(buffers.len());
    for a in buffers {
        match a {
            KernelArg::Buffer(b) if !params.contains(b) => params.push(*b),
            KernelArg::Buffer(b) => return Err(format!("buffer {} passed twice", b.0)),
            KernelArg::ErrorWord => return Err("the error word is not the last parameter".into()),
        }
    }
    let mut text = format!("// kernel {} `{}` (MLIR)\n", k.index, k.kernel);
    for item in &items {
        let normalized = || item.split_whitespace().collect::<Vec<_>>().join(" ");
        if matches!(classify(item), Item::Extern(_)) && !externs.insert(normalized()) {
            continue;
        }
        text.push_str(&rename(item, &renames));
        text.push('\n');
    }
    Ok(Entry {
        name: k.entry.clone(),
        text,
        params,
        launch: Launch {
            grid: k.grid,
            block: k.block,
        },
        error_word,
    })
}

/// `major.minor` as a comparable pair.
fn version(v: &str) -> Option<(u32, u32)> {
    let (a, b) = v.trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// `text` without `//` comments (outside string literals).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut quoted = false;
        let mut prev = '\0';
        let mut end = line.len();
        for (i, c) in line.char_indices() {
            if c == '"' {
                quoted = !quoted;
            } else if c == '/' && prev == '/' && !quoted {
                end = i - 1;
                break;
            }
            prev = c;
        }
        out.push_str(line[..end].trim_end());
        out.push('\n');
    }
    out
}

/// The top-level items of a PTX text without comments: each ends with a `;` or with the
/// `}` closing a body (a `}` closing an initializer is followed by its `;`).
fn items(text: &str) -> Vec<String> {
    let (mut out, mut start, mut depth, mut quoted) = (Vec::new(), 0, 0usize, false);
    let bytes = text.as_bytes();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'"' => quoted = !quoted,
            _ if quoted => {}
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                let next = bytes[i + 1..].iter().find(|b| !b.is_ascii_whitespace());
                if depth == 0 && next != Some(&b';') {
                    out.push(text[start..=i].trim().to_string());
                    start = i + 1;
                }
            }
            b';' if depth == 0 => {
                out.push(text[start..=i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out.retain(|s| !s.is_empty());
    out
}

enum Item {
    /// `.entry NAME(...)` with its parameter count.
    Entry(String, usize),
    /// An `.extern` declaration of NAME.
    Extern(String),
    /// A function or variable NAME defined (or declared for a later definition) here.
    Defines(String),
    Other,
}

fn classify(item: &str) -> Item {
    let head = &item[..item.find('{').unwrap_or(item.len())];
    let words: Vec<&str> = head.split_whitespace().collect();
    let has = |d: &str| words.contains(&d);
    if let Some(at) = head.find(".entry") {
        let rest = &head[at + ".entry".len()..];
        let name = ident_at(rest.trim_start());
        let params = rest.find('(').map_or(0, |p| {
            let inner = &rest[p + 1..];
            inner[..inner.find(')').unwrap_or(inner.len())]
                .matches(".param")
                .count()
        });
        return Item::Entry(name, params);
    }
    let name = if let Some(at) = head.find(".func") {
        // `.func (.param ... retval) NAME(...)`: skip the return list.
        let mut rest = head[at + ".func".len()..].trim_start();
        if rest.starts_with('(') {
            rest = rest[rest.find(')').map_or(rest.len(), |p| p + 1)..].trim_start();
        }
        ident_at(rest)
    } else if has(".global") || has(".const") || has(".shared") {
        // `.global .align 4 .b8 NAME[24] = {...};`: the first word that is not a directive
        // or a number.
        words
            .iter()
            .find(|w| !w.starts_with('.') && !w.starts_with(|c: char| c.is_ascii_digit()))
            .map(|w| ident_at(w))
            .unwrap_or_default()
    } else {
        return Item::Other;
    };
    if name.is_empty() {
        Item::Other
    } else if has(".extern") {
        Item::Extern(name)
    } else {
        Item::Defines(name)
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$'
}

/// The identifier at the start of `s` (empty if none).
fn ident_at(s: &str) -> String {
    s.chars().take_while(|&c| is_ident(c) || c == '%').collect()
}

/// `item` with every identifier token in `renames` replaced (not directive or modifier
/// parts after a `.`, registers, numbers or string contents).
fn rename(item: &str, renames: &HashMap<String, String>) -> String {
    if renames.is_empty() {
        return item.to_string();
    }
    let mut out = String::with_capacity(item.len());
    let mut chars = item.char_indices().peekable();
    let mut prev = '\0';
    let mut quoted = false;
    while let Some((i, c)) = chars.next() {
        if quoted || c == '"' || !(is_ident(c) || c == '%') {
            quoted ^= c == '"';
            out.push(c);
            prev = c;
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if !is_ident(d) {
                break;
            }
            end = j + d.len_utf8();
            chars.next();
        }
        let token = &item[i..end];
        match renames.get(token) {
            Some(new) if prev != '.' && !c.is_ascii_digit() => out.push_str(new),
            _ => out.push_str(token),
        }
        prev = token.chars().last().unwrap_or(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oar_ir::kernel::BufferId;

    const K: &str = "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 7.0\n.target sm_80\n.address_size 64\n\n\
\t// .globl\toar_k0_kernel\n.global .align 4 .b8 __cudart_i2opi_f[2] = {65, 144};\n\
.extern .func  (.param .b32 func_retval0) __nv_expf\n(\n\t.param .b32 __nv_expf_param_0\n)\n;\n\
.func  (.param .b32 func_retval0) __nv_sinf(\n\t.param .b32 __nv_sinf_param_0\n)\n{\n\tmov.u64 %rd1, __cudart_i2opi_f;\n\tret;\n}\n\
.visible .entry oar_k0_kernel(\n\t.param .u64 oar_k0_kernel_param_0,\n\t.param .u64 oar_k0_kernel_param_1\n)\n.maxntid 256, 1, 1\n{\n\
\t.pragma \"nounroll\";\n\tcall.uni (r), __nv_sinf, (a);\n\tcall.uni (r), __nv_expf, (a);\n\tret;\n\n}\n";

    fn kernel(index: usize, ptx: &str) -> GpuKernel {
        GpuKernel {
            index,
            kernel: format!("k{index}"),
            entry: format!("oar_k{index}_kernel"),
            args: vec![KernelArg::Buffer(BufferId(3)), KernelArg::ErrorWord],
            grid: (2, 1, 1),
            block: (256, 1, 1),
            ptx: ptx.replace("oar_k0_kernel", &format!("oar_k{index}_kernel")) + "\0",
        }
    }

    #[test]
    fn kernels_merge_into_one_module() {
        let m = assemble(
            Arch::Sm80,
            vec![
                Ok(kernel(0, K)),
                Err(CodegenError::Opaque("scatter".into())),
                Ok(kernel(2, K)),
            ],
        )
        .unwrap();
        assert_eq!(m.entries.len(), 2);
        assert!(matches!(m.steps[1], Step::Host { kernel: 1, .. }));
        assert!(matches!(m.steps[2], Step::Launch { kernel: 2, entry: 1 }));
        let e = &m.entries[1];
        assert_eq!((e.params.clone(), e.error_word), (vec![BufferId(3)], true));
        assert_eq!(e.launch.grid, (2, 1, 1));
        let text = m.text();
        assert!(!text.contains('\0'), "MLIR's trailing NUL is dropped");
        assert_eq!(text.matches(".version").count(), 1, "{text}");
        assert_eq!(text.matches(".extern .func").count(), 1, "{text}");
        for k in ["oar_k0_kernel", "oar_k2_kernel"] {
            assert!(
                text.contains(&format!("__cudart_i2opi_f_{k}[2] = {{65, 144}};")),
                "{text}"
            );
            assert!(text.contains(&format!("mov.u64 %rd1, __cudart_i2opi_f_{k};")), "{text}");
            assert!(text.contains(&format!("call.uni (r), __nv_sinf_{k}, (a);")), "{text}");
            assert!(text.contains(&format!(") __nv_sinf_{k}(")), "{text}");
        }
        assert!(text.contains("call.uni (r), __nv_expf, (a);"), "{text}");
        assert!(text.contains("__nv_sinf_param_0"), "{text}");
        assert!(text.contains(".pragma \"nounroll\";"), "{text}");
        assert_eq!(unresolved_externs(&m), vec!["__nv_expf".to_string()]);
    }

    #[test]
    fn mismatches_are_typed_errors() {
        let err = |k: GpuKernel| match assemble(Arch::Sm80, vec![Ok(k)]) {
            Err(MlirError::Ptx { detail, .. }) => detail,
            other => panic!("{other:?}"),
        };
        let mut k = kernel(0, K);
        k.args.pop();
        assert!(err(k).contains("has 2 parameters, the launch passes 1"));
        let mut k = kernel(0, K);
        k.args.reverse();
        assert!(err(k).contains("not the last"));
        assert!(err(kernel(0, &K.replace("7.0", "9.9"))).contains("PTX ISA 9.9"));
        assert!(err(kernel(0, &K.replace("sm_80", "sm_90"))).contains("sm_90"));
        let mut k = kernel(0, K);
        k.entry = "other".into();
        assert!(err(k).contains("unexpected `.entry oar_k0_kernel`"));
        assert!(err(kernel(0, "garbage")).contains("no `.entry"));
        assert!(err(kernel(0, &K.replace("ret;\n\n}", "ret;\0\n}"))).contains("NUL"));
    }
}
