//! The one-call entry point an out-of-tree backend's binary uses to run the kit.

use super::{Section, Suite, SuiteFilter};
use oar_ir::Backend;
use std::process::ExitCode;
use std::sync::Arc;

/// Register `backend`, run the conformance kit on it against the reference backend and print
/// the table; `args` are the options of `oar conformance` (`--section ops|patterns|models`,
/// `--filter TEXT`, `--full`, `--failures-only`, `--list`). Exit code 0 when every selected case
/// passed (unsupported cases are listed, not failures), 1 when one failed or errored, 2 for a
/// bad option.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     let backend = oar::backend::get("reference").unwrap(); // your `Arc::new(MyBackend)`
///     let args: Vec<String> = std::env::args().skip(1).collect();
///     oar_conformance::kit_main(backend, &args)
/// }
/// ```
pub fn kit_main(backend: Arc<dyn Backend>, args: &[String]) -> ExitCode {
    match parse(args) {
        Ok((filter, failures_only, list)) => {
            oar::backend::register(backend.clone());
            let suite = Suite::builtin(filter.full);
            if list {
                suite
                    .cases()
                    .iter()
                    .filter(|c| filter.matches(c))
                    .for_each(|c| println!("{}", c.full_name()));
                return ExitCode::SUCCESS;
            }
            let report = suite.run(&*backend, &filter);
            print!("{}", report.table(failures_only));
            if report.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!(
                "error: {e}\noptions: [--section ops|patterns|models] [--filter TEXT] [--full] [--failures-only] [--list]"
            );
            ExitCode::from(2)
        }
    }
}

fn parse(args: &[String]) -> Result<(SuiteFilter, bool, bool), String> {
    let (mut filter, mut failures_only, mut list) = (SuiteFilter::all(), false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("`{a}` needs a value"));
        match a.as_str() {
            "--section" => filter.section = Some(value()?.parse::<Section>()?),
            "--filter" => filter.substring = Some(value()?),
            "--full" => filter.full = true,
            "--failures-only" => failures_only = true,
            "--list" => list = true,
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    Ok((filter, failures_only, list))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options_and_rejects_unknown_ones() {
        let args: Vec<String> = ["--section", "ops", "--filter", "add", "--failures-only"]
            .map(String::from)
            .into();
        let (f, failures_only, list) = parse(&args).unwrap();
        assert_eq!(
            (f.section, f.substring.as_deref(), failures_only, list),
            (Some(Section::Ops), Some("add"), true, false)
        );
        assert!(parse(&["--bogus".to_string()]).unwrap_err().contains("--bogus"));
        assert!(parse(&["--section".to_string()]).unwrap_err().contains("needs a value"));
        assert!(parse(&["--section".to_string(), "nope".to_string()]).is_err());
    }
}
