//! `oar launch -n 4 PROGRAM [ARGS...]`: start a distributed job with `mpirun` (Open MPI's or
//! MPICH's, from PATH): `-n` ranks on this machine, `--oversubscribe` when there are more ranks
//! than cores (Open MPI refuses otherwise), and, when run as root, the two variables Open MPI
//! needs to allow it. Each rank runs PROGRAM, which joins the job with
//! `oar::distributed::init()`. The exit status is mpirun's.

use crate::CliResult;
use std::process::Command;

/// Options of `oar launch`.
#[derive(clap::Args)]
pub(crate) struct LaunchArgs {
    /// Number of processes (ranks).
    #[arg(short = 'n', long = "nproc", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4096))]
    nproc: u32,
    /// Extra arguments for mpirun, as one string (`--mpirun-args "--bind-to none"`).
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    mpirun_args: Option<String>,
    /// Print the mpirun command instead of running it.
    #[arg(long)]
    dry_run: bool,
    /// The program to run on every rank, and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    program: Vec<String>,
}

/// The mpirun command line for `args` on a machine with `cores` cores, as root or not.
fn command_line(args: &LaunchArgs, cores: usize, root: bool) -> Vec<String> {
    let mut cmd = vec!["mpirun".to_string(), "-n".into(), args.nproc.to_string()];
    if args.nproc as usize > cores {
        cmd.push("--oversubscribe".into());
    }
    if root {
        cmd.push("--allow-run-as-root".into());
    }
    if let Some(extra) = &args.mpirun_args {
        cmd.extend(extra.split_whitespace().map(str::to_string));
    }
    cmd.extend(args.program.iter().cloned());
    cmd
}

/// Run (or print) the job.
pub(crate) fn launch(args: LaunchArgs) -> CliResult<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let cmd = command_line(&args, cores, root);
    if args.dry_run {
        println!("{}", cmd.join(" "));
        return Ok(());
    }
    let mut c = Command::new(&cmd[0]);
    c.args(&cmd[1..]);
    if root {
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    let status = c.status().map_err(|e| {
        format!("cannot start mpirun ({e}): install an MPI launcher (Debian: apt-get install openmpi-bin)")
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the job failed: mpirun exited with {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LaunchArgs,
    }

    #[test]
    fn builds_the_mpirun_command() {
        let a = Cli::parse_from(["oar", "-n", "4", "./train", "--epochs", "3"]).args;
        assert_eq!(
            command_line(&a, 2, true),
            [
                "mpirun",
                "-n",
                "4",
                "--oversubscribe",
                "--allow-run-as-root",
                "./train",
                "--epochs",
                "3"
            ]
        );
        assert_eq!(
            command_line(&a, 8, false),
            ["mpirun", "-n", "4", "./train", "--epochs", "3"]
        );
        let b = Cli::parse_from(["oar", "--mpirun-args", "--bind-to none", "prog"]).args;
        assert_eq!(
            command_line(&b, 8, false),
            ["mpirun", "-n", "2", "--bind-to", "none", "prog"]
        );
        assert!(Cli::try_parse_from(["oar", "-n", "0", "prog"]).is_err());
        assert!(Cli::try_parse_from(["oar", "-n", "2"]).is_err());
    }
}
