//! `oar conformance`: run the backend conformance suite against the reference backend.

use crate::CliResult;
use oar_conformance::{Section, Suite, SuiteFilter};

/// Options of `oar conformance`.
#[derive(clap::Args)]
pub(crate) struct ConformanceArgs {
    /// Backend to test (see `oar backends`); `--target` is an alias.
    #[arg(long, short = 'b', visible_alias = "target", default_value = oar::backend::DEFAULT_BACKEND)]
    backend: String,
    /// Only this section: ops, patterns or models.
    #[arg(long)]
    section: Option<Section>,
    /// Only cases whose `section/name` contains this text.
    #[arg(long)]
    filter: Option<String>,
    /// Add the full-size models (224×224 images, a base-size Transformer; slow).
    #[arg(long)]
    full: bool,
    /// Print only the cases that did not pass (and the totals).
    #[arg(long)]
    failures_only: bool,
    /// List the selected cases without running them.
    #[arg(long)]
    list: bool,
}

/// Run the suite; an error (non-zero exit) when a case fails or errors.
pub(crate) fn conformance(args: ConformanceArgs) -> CliResult<()> {
    let filter = SuiteFilter {
        section: args.section,
        substring: args.filter,
        full: args.full,
    };
    let suite = Suite::builtin(args.full);
    let selected: Vec<_> = suite.cases().iter().filter(|c| filter.matches(c)).collect();
    if selected.is_empty() {
        return Err("no conformance case matches the section and filter given".into());
    }
    if args.list {
        for c in selected {
            println!("{}", c.full_name());
        }
        return Ok(());
    }
    let backend = oar::backend::get(&args.backend).map_err(|e| e.to_string())?;
    let report = suite.run(&*backend, &filter);
    print!("{}", report.table(args.failures_only));
    if report.is_success() {
        Ok(())
    } else {
        let c = report.counts(None);
        Err(format!(
            "{} of {} conformance cases failed and {} errored on backend `{}`",
            c.fail,
            c.total(),
            c.error,
            report.backend
        ))
    }
}
