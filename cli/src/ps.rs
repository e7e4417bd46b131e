//! `oar ps`: the parameter server (oar-ps).
//!
//! - `oar ps server --shard I --of N --port P [--snapshot-dir D] --table SPEC...`: one shard.
//!   It serves until interrupted (Ctrl-C or SIGTERM), then writes its final snapshot; started
//!   again on the same snapshot directory it resumes.
//! - `oar ps launch --servers S --trainers T [--heter-trainers H] --table SPEC... -- COMMAND...`:
//!   a job on this machine — S shards on free local ports, H heter trainers, then T trainers
//!   (copies of COMMAND told their place by environment variables: `oar::ps::PsTrainer::from_env`,
//!   `oar::ps::HeterLink::from_env`); when every trainer has finished the shards are stopped
//!   (final snapshots) and the heter trainers killed. Any process that fails stops the job.
//! - `oar ps gen-data --out DIR --rows N`: synthetic Criteo-like click data
//!   (`oar::rec::data`): `DIR/train` and a held-out `DIR/test` of the same teacher.

use crate::CliResult;
use oar_ps::{ServerConfig, Shard, TableConfig};

/// `oar ps` subcommands.
#[derive(clap::Subcommand)]
pub(crate) enum PsCommand {
    /// Serve one shard.
    Server(ServerArgs),
    /// Run a job on this machine: shards, then trainers.
    Launch(LaunchArgs),
    /// Write synthetic Criteo-like click data (train and test).
    GenData(GenDataArgs),
}

/// Options of `oar ps launch`.
#[derive(clap::Args)]
pub(crate) struct LaunchArgs {
    /// The number of shards.
    #[arg(long, default_value_t = 2)]
    servers: u32,
    /// The number of trainers.
    #[arg(long, default_value_t = 2)]
    trainers: u32,
    /// How trainers keep in step: sync, async or geo:K:LR.
    #[arg(long, default_value = "sync")]
    mode: String,
    /// The shards' snapshot directory.
    #[arg(long)]
    snapshot_dir: Option<std::path::PathBuf>,
    /// Snapshot every this many seconds (0: at shutdown only).
    #[arg(long, default_value_t = 0)]
    snapshot_secs: u64,
    /// A table (as for `oar ps server`); repeat for more.
    #[arg(long = "table", required = true, value_name = "SPEC")]
    tables: Vec<String>,
    /// Heterogeneous trainers: processes of the same command started first with
    /// `OAR_PS_ROLE=heter` (and `OAR_PS_HETER_ID`, `OAR_PS_HETER_PORT` to serve on); trainer
    /// `i` is told the endpoints (`OAR_PS_HETER_ENDPOINTS`) and uses heter trainer `i mod H`.
    #[arg(long, default_value_t = 0)]
    heter_trainers: u32,
    /// The trainer command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Options of `oar ps gen-data`.
#[derive(clap::Args)]
pub(crate) struct GenDataArgs {
    /// The output directory (`train/` and `test/` inside).
    #[arg(long)]
    out: std::path::PathBuf,
    /// Training rows.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Held-out rows (the same teacher).
    #[arg(long, default_value_t = 50_000)]
    test_rows: u64,
    /// Training files (a multiple of the trainer count shares them evenly).
    #[arg(long, default_value_t = 4)]
    files: usize,
    /// The seed of the teacher and the rows.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Options of `oar ps server`.
#[derive(clap::Args)]
pub(crate) struct ServerArgs {
    /// This shard's index (0-based).
    #[arg(long)]
    shard: u32,
    /// The number of shards in the job.
    #[arg(long = "of")]
    num_shards: u32,
    /// The port to listen on (all interfaces).
    #[arg(long)]
    port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: std::net::IpAddr,
    /// Where snapshots go (resumed from at start).
    #[arg(long)]
    snapshot_dir: Option<std::path::PathBuf>,
    /// Snapshot after every this many pushes (0: on request and at shutdown only).
    #[arg(long, default_value_t = 0)]
    snapshot_every: u64,
    /// Also snapshot every this many seconds (0: not by time).
    #[arg(long, default_value_t = 0)]
    snapshot_secs: u64,
    /// A table: `NAME,sparse,dim=D[,opt=adagrad,lr=0.05,init=uniform,scale=0.01,entry=2,expire=N]`
    /// or `NAME,dense,len=L[,...]`; repeat for more (the same list on every shard).
    #[arg(long = "table", required = true, value_name = "SPEC")]
    tables: Vec<String>,
}

pub(crate) fn ps(cmd: PsCommand) -> CliResult<()> {
    match cmd {
        PsCommand::Server(args) => server(args),
        PsCommand::Launch(args) => launch(args),
        PsCommand::GenData(args) => gen_data(args),
    }
}

fn gen_data(args: GenDataArgs) -> CliResult<()> {
    use oar::rec::data::{CriteoLikeConfig, generate, generate_rows};
    let config = CriteoLikeConfig {
        seed: args.seed,
        ..CriteoLikeConfig::default()
    };
    let start = std::time::Instant::now();
    let train = generate(&config, args.out.join("train"), args.rows, args.files).map_err(|e| e.to_string())?;
    let test = generate_rows(&config, args.out.join("test"), args.rows..args.rows + args.test_rows, 1)
        .map_err(|e| e.to_string())?;
    println!(
        "wrote {} training rows ({} files) and {} test rows to {} in {:.1} s: click rate {:.3}, \
         the teacher's AUC (the best reachable) {:.4} on the test rows, over {} possible ids",
        train.rows,
        train.files.len(),
        test.rows,
        args.out.display(),
        start.elapsed().as_secs_f64(),
        train.click_rate(),
        test.teacher_auc,
        config.total_vocab(),
    );
    Ok(())
}

/// Send `signal` to a child and reap it. Trainers lead their own process groups, and the
/// whole group gets it, so a shell's children go too.
fn stop(child: &mut std::process::Child, signal: i32, group: bool) {
    let pid = child.id() as i32;
    // SAFETY: kill(2) on our own child, or on the process group it leads.
    unsafe { libc::kill(if group { -pid } else { pid }, signal) };
    let _ = child.wait();
}

/// Set by SIGINT / SIGTERM while `oar ps launch` waits: stop the job.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn interrupted(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Free local ports: bound, noted, released (a process that then cannot bind fails the launch).
fn free_ports(n: u32) -> CliResult<Vec<u16>> {
    (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("no free port: {e}"))
        })
        .collect()
}

/// The processes of a job: (what, child, whether it leads its own process group).
struct Job(Vec<(String, std::process::Child, bool)>);

impl Job {
    /// Stop every process: SIGKILL to trainers' groups, `shard_signal` to shards.
    fn stop(&mut self, shard_signal: i32) {
        for (_, c, group) in self.0.iter_mut() {
            stop(c, if *group { libc::SIGKILL } else { shard_signal }, *group);
        }
    }

    /// Wait until `port` accepts connections, while process `i` runs (60 s at most).
    fn wait_listening(&mut self, i: usize, port: u16) -> CliResult<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.0[i].1.try_wait() {
                let what = self.0[i].0.clone();
                self.stop(libc::SIGTERM);
                return Err(format!("{what} exited before serving: {status}"));
            }
            if std::time::Instant::now() > deadline {
                let what = self.0[i].0.clone();
                self.stop(libc::SIGKILL);
                return Err(format!("{what} did not listen on port {port} within 60 s"));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

fn launch(args: LaunchArgs) -> CliResult<()> {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    if args.servers == 0 || args.trainers == 0 {
        return Err("oar ps launch: --servers and --trainers must be at least 1".into());
    }
    for t in &args.tables {
        TableConfig::from_spec(t).map_err(|e| e.to_string())?;
    }
    let mode = args.mode.parse::<oar_ps::Mode>().map_err(|e| format!("--mode: {e}"))?;
    let h = args.heter_trainers;
    if h > args.trainers || (h > 0 && mode == oar_ps::Mode::Sync && !args.trainers.is_multiple_of(h)) {
        return Err(format!(
            "--heter-trainers {h}: each heter trainer serves trainers i with i mod {h} equal to its index, \
             so there must be at most as many as trainers ({}){}",
            args.trainers,
            if mode == oar_ps::Mode::Sync {
                ", and in sync mode a divisor of their count"
            } else {
                ""
            }
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the oar executable: {e}"))?;
    // Trainers lead their own process groups (stopped whole); Ctrl-C or SIGTERM to this
    // command stops the job.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, interrupted as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, interrupted as *const () as libc::sighandler_t);
    }
    let mut job = Job(Vec::new());
    let ports = free_ports(args.servers)?;
    for (i, port) in ports.iter().enumerate() {
        let mut cmd = Command::new(&exe);
        cmd.args(["ps", "server", "--host", "127.0.0.1"])
            .args(["--shard", &i.to_string(), "--of", &args.servers.to_string()])
            .args(["--port", &port.to_string()])
            .args(["--snapshot-secs", &args.snapshot_secs.to_string()]);
        if let Some(d) = &args.snapshot_dir {
            cmd.arg("--snapshot-dir").arg(d);
        }
        for t in &args.tables {
            cmd.args(["--table", t]);
        }
        match cmd.spawn() {
            Ok(c) => job.0.push((format!("shard {i}"), c, false)),
            Err(e) => {
                job.stop(libc::SIGTERM);
                return Err(format!("cannot start shard {i}: {e}"));
            }
        }
    }
    for (i, port) in ports.iter().enumerate() {
        job.wait_listening(i, *port)?;
    }
    let endpoints: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let trainer = |env: &[(&str, String)]| {
        let mut cmd = Command::new(&args.command[0]);
        cmd.process_group(0)
            .args(&args.command[1..])
            .env("OAR_PS_ENDPOINTS", endpoints.join(","))
            .env("OAR_PS_TRAINERS", args.trainers.to_string())
            .env("OAR_PS_MODE", &args.mode);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn()
    };
    // Heter trainers first: the trainers need their endpoints.
    let heter_ports = free_ports(h)?;
    for (k, port) in heter_ports.iter().enumerate() {
        let env = [
            ("OAR_PS_ROLE", "heter".to_string()),
            ("OAR_PS_HETER_ID", k.to_string()),
            ("OAR_PS_HETER_TRAINERS", h.to_string()),
            ("OAR_PS_HETER_PORT", port.to_string()),
        ];
        match trainer(&env) {
            Ok(c) => job.0.push((format!("heter trainer {k}"), c, true)),
            Err(e) => {
                job.stop(libc::SIGTERM);
                return Err(format!("cannot start heter trainer {k} (`{}`): {e}", args.command[0]));
            }
        }
        let at = job.0.len() - 1;
        job.wait_listening(at, *port)?;
    }
    let heter_endpoints: Vec<String> = heter_ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let first_trainer = job.0.len();
    for t in 0..args.trainers {
        let mut env = vec![("OAR_PS_TRAINER_ID", t.to_string())];
        if h > 0 {
            env.push(("OAR_PS_HETER_ENDPOINTS", heter_endpoints.join(",")));
        }
        match trainer(&env) {
            Ok(c) => job.0.push((format!("trainer {t}"), c, true)),
            Err(e) => {
                job.stop(libc::SIGTERM);
                return Err(format!("cannot start trainer {t} (`{}`): {e}", args.command[0]));
            }
        }
    }
    // Wait for the trainers; the first failure (of any process) stops the rest.
    let mut failed = None;
    while failed.is_none() {
        if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            failed = Some("interrupted".to_string());
            break;
        }
        let mut running = 0;
        for (i, (what, c, _)) in job.0.iter_mut().enumerate() {
            match c.try_wait() {
                Ok(Some(status)) if !status.success() || i < first_trainer => {
                    failed.get_or_insert(format!("{what} exited: {status}"));
                }
                Ok(Some(_)) => {}
                Ok(None) => running += usize::from(i >= first_trainer),
                Err(e) => {
                    failed.get_or_insert(format!("{what}: {e}"));
                }
            }
        }
        if running == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SIGTERM: the shards write their final snapshots; trainers' groups are killed.
    job.stop(libc::SIGTERM);
    match failed {
        Some(f) => Err(format!("oar ps launch: {f}; the job was stopped")),
        None => {
            eprintln!(
                "oar ps launch: {} trainers finished; {} shards{} stopped",
                args.trainers,
                args.servers,
                if h > 0 {
                    format!(" and {h} heter trainers")
                } else {
                    String::new()
                }
            );
            Ok(())
        }
    }
}

fn server(args: ServerArgs) -> CliResult<()> {
    let tables = args
        .tables
        .iter()
        .map(|s| TableConfig::from_spec(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let config = ServerConfig {
        shard: args.shard,
        num_shards: args.num_shards,
        tables,
        snapshot_dir: args.snapshot_dir,
        snapshot_every: args.snapshot_every,
        snapshot_secs: args.snapshot_secs,
    };
    let shard = Shard::new(config).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let addr = std::net::SocketAddr::new(args.host, args.port);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        // One write, so that the lines of shards started together do not interleave.
        let line = format!(
            "oar ps: shard {} of {} listening on {}\n",
            args.shard,
            args.num_shards,
            listener.local_addr().map_err(|e| e.to_string())?
        );
        std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes()).ok();
        let stop = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            eprintln!("oar ps: shutting down (final snapshot)");
        };
        oar_ps::server::serve(shard, listener, stop).await.map_err(|e| e.to_string())
    })
}
