//! `embedded_runtime!()`: the cpu runtime's static library (`liboar_cpu_runtime-*.a`), gzip
//! compressed, as a `Option<&'static [u8]>` inside the program that invokes it.
//!
//! AOT executables and shared libraries are linked against that archive
//! (`oar_backend_cpu::aot`). Cargo builds it beside the runtime's rlib (the runtime has a
//! `staticlib` crate type) but nowhere an installed program could find it later, so the `oar`
//! tool carries it. A proc macro runs inside the rustc process that compiles its caller, and
//! that rustc was told where each direct dependency's library is (`--extern
//! oar_cpu_runtime=…/liboar_cpu_runtime-HASH.rlib`): the archive of *exactly* that build is
//! the same path with `.a`. The macro compresses it once beside the original
//! (`liboar_cpu_runtime-HASH.a.gz`, rewritten when the archive is newer) and expands to
//! `Some(include_bytes!(…))`, so rustc records the file as an input of the crate.
//!
//! It expands to `None` where there is no archive: `cargo check`/`clippy` (which build only
//! metadata), IDE macro expansion, or a caller that does not depend on `oar-cpu-runtime`
//! directly.

use flate2::Compression;
use flate2::write::GzEncoder;
use proc_macro::TokenStream;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The runtime's library crate name as rustc sees it in `--extern`.
const CRATE: &str = "oar_cpu_runtime";

/// `Option<&'static [u8]>`: the gzip-compressed runtime static library, when this build has one.
#[proc_macro]
pub fn embedded_runtime(input: TokenStream) -> TokenStream {
    if !input.is_empty() {
        return r#"compile_error!("embedded_runtime!() takes no arguments")"#.parse().unwrap();
    }
    let expansion = match archive().and_then(|a| compressed(&a).ok()) {
        Some(gz) => format!(
            "::core::option::Option::Some(::core::include_bytes!({:?}) as &'static [u8])",
            gz.display().to_string()
        ),
        None => "::core::option::Option::<&'static [u8]>::None".to_string(),
    };
    expansion.parse().unwrap()
}

/// rustc's arguments, with `@file` argument files expanded (cargo uses one when the command
/// line gets long).
fn rustc_args() -> Vec<String> {
    let mut out = Vec::new();
    for a in std::env::args().skip(1) {
        match a.strip_prefix('@') {
            Some(file) => {
                if let Ok(text) = std::fs::read_to_string(file) {
                    out.extend(text.lines().map(str::to_string));
                }
            }
            None => out.push(a),
        }
    }
    out
}

/// The static library beside the `--extern oar_cpu_runtime=PATH` this rustc was given.
fn archive() -> Option<PathBuf> {
    let args = rustc_args();
    let prefix = format!("{CRATE}=");
    let lib = args.iter().enumerate().find_map(|(i, a)| {
        let value = match a.strip_prefix("--extern=") {
            Some(v) => v,
            None if a == "--extern" => args.get(i + 1)?,
            None => return None,
        };
        value.strip_prefix(&prefix).map(PathBuf::from)
    })?;
    let a = lib.with_extension("a");
    a.is_file().then_some(a)
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// `ARCHIVE.gz` beside `archive`, written (atomically) unless it is already newer.
fn compressed(archive: &Path) -> std::io::Result<PathBuf> {
    let mut gz = archive.as_os_str().to_owned();
    gz.push(".gz");
    let gz = PathBuf::from(gz);
    if let (Some(src), Some(dst)) = (modified(archive), modified(&gz))
        && dst >= src
    {
        return Ok(gz);
    }
    let bytes = std::fs::read(archive)?;
    let mut enc = GzEncoder::new(Vec::with_capacity(bytes.len() / 3), Compression::default());
    enc.write_all(&bytes)?;
    let packed = enc.finish()?;
    let mut tmp = gz.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, &packed)?;
    std::fs::rename(&tmp, &gz)?;
    Ok(gz)
}
