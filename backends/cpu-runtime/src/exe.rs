//! The `main` of AOT executables: read .npy inputs, run, write .npy outputs, `--bench N`.
//!
//! The generated object's `main(argc, argv)` calls [`oar_rt_exe_main`] with the model's blob
//! and kernel table; everything else (arguments, files, timing, errors) happens here.

use crate::capi::AotModel;
use crate::program::KernelFn;
use clap::Parser;
use oar_ir::TensorData;
use std::collections::BTreeMap;
use std::ffi::{CStr, OsString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The command line of an AOT executable.
#[derive(Parser, Debug)]
#[command(
    about = "Run an oar model compiled ahead of time: .npy inputs in, .npy outputs out",
    after_help = "Use --info to list the model's inputs and outputs."
)]
struct Args {
    /// Input .npy files in graph input order (see --info).
    #[arg(value_name = "FILE.npy")]
    files: Vec<PathBuf>,
    /// An input by name (repeat for each input).
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Write each output to DIR/NAME.npy (created if missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// After one warm-up run, time N runs (1..=1000000) and print latency statistics.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    bench: Option<u64>,
    /// Threads to use (1..=1024; default: all cores).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
    /// Weights file (safetensors). Default for models compiled with `--weights external`:
    /// this executable's path with `.weights` appended.
    #[arg(long, value_name = "PATH")]
    weights: Option<PathBuf>,
    /// Print the model's inputs and outputs, then exit.
    #[arg(long)]
    info: bool,
    /// Largest tensor or arena to allocate (`512M`, `4G`; default: 3/4 of the available
    /// memory, or OAR_MAX_MEMORY).
    #[arg(long, value_name = "SIZE", value_parser = |s: &str| oar_ir::memory::parse_size(s))]
    max_memory: Option<u64>,
}

/// Entry point of an AOT executable (called by the generated `main`). Returns the exit code:
/// 0 success, 1 error (one `error:` line on stderr), 2 bad command line.
///
/// # Safety
/// `argv` holds `argc` NUL-terminated strings; `blob` points to `blob_len` bytes and `table`
/// to `n_funcs` kernel functions, generated together.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_rt_exe_main(
    argc: c_int,
    argv: *const *const c_char,
    blob: *const u8,
    blob_len: usize,
    table: *const KernelFn,
    n_funcs: usize,
) -> c_int {
    // `exe ... | head`: a closed pipe ends the process quietly (as for any Unix tool).
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A bug must still end in one clear line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("error: internal error (please report): {info}");
    }));
    let r = catch_unwind(AssertUnwindSafe(|| {
        let args: Vec<OsString> = (0..argc.max(0) as usize)
            .map(|i| {
                let s = unsafe { CStr::from_ptr(*argv.add(i)) };
                crate::capi::path_from_c(s).into_os_string()
            })
            .collect();
        let blob = unsafe { std::slice::from_raw_parts(blob, blob_len) };
        let table = if n_funcs == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(table, n_funcs) }
        };
        main_with(args, blob, table)
    }));
    // On a panic the hook printed the message.
    r.unwrap_or(1)
}

fn main_with(args: Vec<OsString>, blob: &[u8], table: &[KernelFn]) -> c_int {
    let args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match run(args, blob, table) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn run(args: Args, blob: &[u8], table: &[KernelFn]) -> Result<(), String> {
    if let Some(m) = args.max_memory {
        oar_ir::memory::set_limit(m);
    }
    if let Some(n) = args.threads {
        // Fails when the threads cannot be started (a memory or process limit): an error, not
        // a panic later in the first parallel loop.
        rayon::ThreadPoolBuilder::new()
            .num_threads(n as usize)
            .build_global()
            .map_err(|e| format!("--threads {n}: cannot start the threads: {e}"))?;
    }
    let (meta, _, _) = crate::capi::decode_aot_blob(blob)?;
    let weights = match (&args.weights, meta.external_weights) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable's path: {e}"))?;
            let mut p = exe.into_os_string();
            p.push(".weights");
            Some(PathBuf::from(p))
        }
        (None, false) => None,
    };
    let mut model = AotModel::load(blob, table, weights.as_deref())?;
    if let Some(n) = args.threads {
        model.model.set_threads(n as usize);
    }
    if args.info {
        println!("model `{}`", model.meta.name);
        for (i, (n, t)) in model.meta.inputs.iter().enumerate() {
            println!("input {i}: {n}: {t}");
        }
        for (i, (n, t)) in model.outputs.iter().enumerate() {
            println!("output {i}: {n}: {t}");
        }
        return Ok(());
    }
    let feeds = read_inputs(&args, &model)?;
    let outs = model.run(feeds.clone()).map_err(|e| e.to_string())?;
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("output directory `{}`: {e}", dir.display()))?;
    }
    for (name, t) in &outs {
        print!("{name}: {}", oar_ir::npy::preview(t));
        if let Some(dir) = &args.output_dir {
            let path = dir.join(format!("{}.npy", oar_ir::npy::output_file_stem(name)));
            oar_ir::npy::write_npy(&path, t).map_err(|e| format!("output `{name}`: {e}"))?;
            print!(" -> {}", path.display());
        }
        println!();
    }
    if let Some(n) = args.bench {
        bench(&model, feeds, n as usize)?;
    }
    Ok(())
}

/// Inputs from `--input NAME=FILE` and positional files (graph input order).
fn read_inputs(args: &Args, model: &AotModel) -> Result<BTreeMap<String, TensorData>, String> {
    let specs = &model.meta.inputs;
    let mut named: Vec<(String, &Path)> = Vec::new();
    for spec in &args.inputs {
        let (name, path) = spec
            .split_once('=')
            .filter(|(n, _)| !n.is_empty())
            .ok_or_else(|| format!("--input `{spec}`: expected NAME=FILE.npy"))?;
        named.push((name.to_string(), Path::new(path)));
    }
    if args.files.len() > specs.len() {
        return Err(format!(
            "{} input files given, the model takes {} ({})",
            args.files.len(),
            specs.len(),
            specs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    for (f, (name, _)) in args.files.iter().zip(specs) {
        named.push((name.clone(), f.as_path()));
    }
    let mut feeds = BTreeMap::new();
    for (name, path) in named {
        let t = oar_ir::npy::read_npy(path).map_err(|e| format!("input `{name}`: {e}"))?;
        if feeds.insert(name.clone(), t).is_some() {
            return Err(format!("input `{name}` is given twice"));
        }
    }
    if let Some((name, ty)) = specs.iter().find(|(n, _)| !feeds.contains_key(n)) {
        return Err(format!(
            "missing input `{name}` (expected {ty}): give it as --input {name}=FILE.npy or positionally"
        ));
    }
    Ok(feeds)
}

/// Time `n` runs after one warm-up; print min/median/mean/p90 in milliseconds.
fn bench(model: &AotModel, feeds: BTreeMap<String, TensorData>, n: usize) -> Result<(), String> {
    if n == 0 {
        return Err("--bench takes a number of runs ≥ 1".into());
    }
    model.run(feeds.clone()).map_err(|e| e.to_string())?;
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let f = feeds.clone();
        let t = Instant::now();
        model.run(f).map_err(|e| e.to_string())?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let s = LatencyStats::of(&mut ms);
    println!(
        "bench: {n} runs after 1 warm-up, latency ms: min {:.4} median {:.4} mean {:.4} p90 {:.4}",
        s.min, s.median, s.mean, s.p90
    );
    Ok(())
}

/// Summary of a latency sample.
#[derive(Debug, PartialEq)]
struct LatencyStats {
    min: f64,
    median: f64,
    mean: f64,
    p90: f64,
}

impl LatencyStats {
    /// Statistics of a non-empty sample (sorted in place). The median of an even count is the
    /// mean of the middle two; p90 is the smallest value with at least 90% of the sample at or
    /// below it.
    fn of(v: &mut [f64]) -> LatencyStats {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let p90 = v[(n * 9).div_ceil(10).max(1) - 1];
        LatencyStats {
            min: v[0],
            median,
            mean: v.iter().sum::<f64>() / n as f64,
            p90,
        }
    }
}

/// Output names become file names: keep them to a safe character set.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_stats() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 7.0, 8.0, 9.0];
        let s = LatencyStats::of(&mut v);
        assert_eq!(
            s,
            LatencyStats {
                min: 1.0,
                median: 5.5,
                mean: 5.5,
                p90: 9.0
            }
        );
        let s = LatencyStats::of(&mut [2.0]);
        assert_eq!((s.min, s.median, s.mean, s.p90), (2.0, 2.0, 2.0, 2.0));
        let s = LatencyStats::of(&mut [3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.p90), (2.0, 3.0));
    }

    #[test]
    fn args_parse() {
        let a = Args::try_parse_from(["m", "a.npy", "-i", "x=b.npy", "--bench", "3", "--threads", "2"]).unwrap();
        assert_eq!(a.files, vec![PathBuf::from("a.npy")]);
        assert_eq!(a.inputs, vec!["x=b.npy".to_string()]);
        assert_eq!((a.bench, a.threads), (Some(3), Some(2)));
        assert!(Args::try_parse_from(["m", "--threads", "0"]).is_err());
    }
}
