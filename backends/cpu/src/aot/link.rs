//! Linking AOT objects with the runtime's static library through the system C compiler.

use crate::CpuError;
use oar_cpu_runtime::capi::C_API_SYMBOLS;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Environment variable naming the runtime static library explicitly.
pub const RUNTIME_LIB_ENV: &str = "OAR_CPU_RUNTIME_LIB";

/// The gzip-compressed runtime library a program carries (see [`embed_runtime`]).
static EMBEDDED: OnceLock<&'static [u8]> = OnceLock::new();

/// Register the runtime static library this program carries, gzip-compressed (what
/// `oar_cpu_runtime_embed::embedded_runtime!()` expands to in a program that depends on
/// `oar-cpu-runtime` directly): AOT binaries then link against it unless a library is named
/// (`AotOptions::runtime_lib`, `$OAR_CPU_RUNTIME_LIB`), wherever the program was copied to.
/// It must be the archive of the runtime this program was built with (the model blob's format
/// is that version's). The first registration wins.
pub fn embed_runtime(gz: &'static [u8]) {
    let _ = EMBEDDED.set(gz);
}

/// Where the runtime library to link with comes from.
pub(crate) enum Runtime {
    File(PathBuf),
    /// gzip-compressed bytes, unpacked into the link's scratch directory.
    Embedded(&'static [u8]),
}

/// `$OAR_CPU_RUNTIME_LIB`, else the registered archive, else [`find_runtime_lib`]'s search.
pub(crate) fn runtime() -> Result<Runtime, CpuError> {
    if std::env::var_os(RUNTIME_LIB_ENV).is_none()
        && let Some(gz) = EMBEDDED.get()
    {
        return Ok(Runtime::Embedded(gz));
    }
    find_runtime_lib().map(Runtime::File)
}

/// The runtime static library (`liboar_cpu_runtime*.a`) to link AOT binaries with:
/// `$OAR_CPU_RUNTIME_LIB` if set, else the newest one beside the running executable, in its
/// `deps/` directory, or in its parent's `deps/` (cargo puts it there whenever
/// `oar-cpu-runtime` is built, as it has a `staticlib` crate type).
pub fn find_runtime_lib() -> Result<PathBuf, CpuError> {
    if let Some(p) = std::env::var_os(RUNTIME_LIB_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(CpuError::Io(format!(
                "{RUNTIME_LIB_ENV}={}: no such file (it should name liboar_cpu_runtime.a)",
                p.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(|e| CpuError::Io(format!("cannot find the running executable: {e}")))?;
    let mut dirs = Vec::new();
    if let Some(dir) = exe.parent() {
        dirs.push(dir.to_path_buf());
        dirs.push(dir.join("deps"));
        if let Some(up) = dir.parent() {
            dirs.push(up.join("deps"));
        }
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with("liboar_cpu_runtime") && name.ends_with(".a")) {
                continue;
            }
            let Ok(t) = e.metadata().and_then(|m| m.modified()) else {
                continue;
            };
            if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                best = Some((t, e.path()));
            }
        }
    }
    best.map(|(_, p)| p).ok_or_else(|| {
        CpuError::Io(format!(
            "the oar CPU runtime static library (liboar_cpu_runtime*.a) was not found beside {} or in its deps/ \
             directory: build it with `cargo build -p oar-cpu-runtime` (same profile) and set {RUNTIME_LIB_ENV} \
             to the .a file (target/<profile>/deps/liboar_cpu_runtime-*.a or target/<profile>/liboar_cpu_runtime.a)",
            exe.display()
        ))
    })
}

/// Run `cc` with `args`; the error says what failed with the compiler's own message.
fn cc(args: &[String]) -> Result<(), String> {
    let out = Command::new("cc")
        .args(args)
        .output()
        .map_err(|e| format!("running the C compiler `cc` (needed to link): {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = err.lines().rev().take(12).collect();
    Err(format!(
        "`cc {}` failed ({}):\n{}",
        args.join(" "),
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    ))
}

/// A scratch directory beside `out`, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(out: &Path) -> Result<Scratch, CpuError> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = out
            .file_name()
            .map_or("out".into(), |n| n.to_string_lossy().into_owned());
        let p = dir.join(format!(".{name}.link-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| CpuError::Io(format!("{}: {e}", p.display())))?;
        Ok(Scratch(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Link `obj` with the runtime library `rt` into an executable or (`shared`) a shared
/// library at `out`. Executables are linked fully static when the C library allows it,
/// otherwise against libc/libm only (libgcc linked in); shared libraries export only the C
/// API and need only libc/libm.
pub(crate) fn link(shared: bool, obj: &[u8], rt: &Runtime, out: &Path) -> Result<(), CpuError> {
    let scratch = Scratch::new(out)?;
    let rt = match rt {
        Runtime::File(p) => p.clone(),
        Runtime::Embedded(gz) => {
            let mut bytes = Vec::new();
            flate2::read::GzDecoder::new(*gz)
                .read_to_end(&mut bytes)
                .map_err(|e| CpuError::Io(format!("unpacking the runtime library this program carries: {e}")))?;
            let p = scratch.0.join("liboar_cpu_runtime.a");
            std::fs::write(&p, bytes).map_err(|e| CpuError::Io(format!("{}: {e}", p.display())))?;
            p
        }
    };
    let rt = rt.as_path();
    let o = scratch.0.join("model.o");
    std::fs::write(&o, obj).map_err(|e| CpuError::Io(format!("{}: {e}", o.display())))?;
    let tmp_out = scratch.0.join("linked");
    let libs = ["-lm", "-lpthread", "-ldl", "-lc"].map(String::from);
    let common = |extra_front: &[String]| -> Vec<String> {
        let mut a: Vec<String> = extra_front.to_vec();
        a.extend(["-o".into(), s(&tmp_out), s(&o), s(rt)]);
        a.extend([
            "-Wl,--gc-sections".into(),
            "-Wl,--strip-debug".into(),
            "-Wl,--as-needed".into(),
        ]);
        a.extend(libs.iter().cloned());
        a
    };
    if shared {
        let vs = scratch.0.join("exports.map");
        let globals: String = C_API_SYMBOLS.iter().map(|s| format!("{s}; ")).collect();
        std::fs::write(&vs, format!("{{ global: {globals}local: *; }};\n"))
            .map_err(|e| CpuError::Io(format!("{}: {e}", vs.display())))?;
        let mut front = vec!["-shared".to_string(), "-static-libgcc".to_string()];
        front.extend(C_API_SYMBOLS.iter().map(|s| format!("-Wl,--undefined={s}")));
        front.push(format!("-Wl,--version-script={}", s(&vs)));
        front.push("-Wl,-z,defs".into());
        if let Some(name) = out.file_name() {
            front.push(format!("-Wl,-soname,{}", name.to_string_lossy()));
        }
        cc(&common(&front)).map_err(|e| CpuError::Io(format!("linking the shared library: {e}")))?;
    } else {
        let static_args = common(&["-static".to_string()]);
        if let Err(first) = cc(&static_args) {
            let dynamic = common(&["-static-libgcc".to_string()]);
            cc(&dynamic).map_err(|e| {
                CpuError::Io(format!(
                    "linking the executable: static link failed: {first}\nthen dynamic link failed: {e}"
                ))
            })?;
        }
    }
    // The scratch directory may be on another filesystem: then copy through an atomic write
    // (never a half-written binary over a good one) and keep the linker's permissions.
    std::fs::rename(&tmp_out, out)
        .or_else(|_| {
            let perms = std::fs::metadata(&tmp_out)?.permissions();
            oar_ir::file::write_atomically(out, &std::fs::read(&tmp_out)?)?;
            std::fs::set_permissions(out, perms)
        })
        .map_err(|e| CpuError::Io(format!("{}: {e}", out.display())))?;
    Ok(())
}
