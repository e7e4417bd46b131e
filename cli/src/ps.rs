//! `oar ps`: the parameter server (oar-ps).
//!
//! - `oar ps server --shard I --of N --port P [--snapshot-dir D] --table SPEC...`: one shard.
//!   It serves until interrupted (Ctrl-C or SIGTERM), then writes its final snapshot; started
//!   again on the same snapshot directory it resumes.
//! - `oar ps launch --servers S --trainers T --table SPEC... -- COMMAND...`: a job on this
//!   machine — S shards on free local ports, then T copies of COMMAND told their place by
//!   environment variables (`oar::ps::PsTrainer::from_env`); when every trainer has finished
//!   the shards are stopped (final snapshots). A trainer that fails stops the job.
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

fn launch(args: LaunchArgs) -> CliResult<()> {
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::time::{Duration, Instant};
    if args.servers == 0 || args.trainers == 0 {
        return Err("oar ps launch: --servers and --trainers must be at least 1".into());
    }
    for t in &args.tables {
        TableConfig::from_spec(t).map_err(|e| e.to_string())?;
    }
    args.mode.parse::<oar_ps::Mode>().map_err(|e| format!("--mode: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the oar executable: {e}"))?;
    // Free ports: bind, note, release (a shard that then cannot bind fails the launch).
    let ports: Vec<u16> = (0..args.servers)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| format!("no free port: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut shards = Vec::new();
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
        shards.push(cmd.spawn().map_err(|e| format!("cannot start shard {i}: {e}"))?);
    }
    let stop_all = |shards: &mut Vec<std::process::Child>, signal| {
        for s in shards.iter_mut() {
            stop(s, signal, false);
        }
    };
    // Wait until every shard accepts connections.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, port) in ports.iter().enumerate() {
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok() {
                break;
            }
            if let Ok(Some(status)) = shards[i].try_wait() {
                stop_all(&mut shards, libc::SIGTERM);
                return Err(format!("shard {i} exited before serving: {status}"));
            }
            if Instant::now() > deadline {
                stop_all(&mut shards, libc::SIGKILL);
                return Err(format!("shard {i} did not listen on port {port} within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let endpoints: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    // Trainers lead their own process groups (stopped whole); Ctrl-C or SIGTERM to this
    // command stops the job.
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, interrupted as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, interrupted as *const () as libc::sighandler_t);
    }
    let mut trainers = Vec::new();
    for t in 0..args.trainers {
        let spawned = Command::new(&args.command[0])
            .process_group(0)
            .args(&args.command[1..])
            .env("OAR_PS_ENDPOINTS", endpoints.join(","))
            .env("OAR_PS_TRAINER_ID", t.to_string())
            .env("OAR_PS_TRAINERS", args.trainers.to_string())
            .env("OAR_PS_MODE", &args.mode)
            .spawn();
        match spawned {
            Ok(c) => trainers.push(c),
            Err(e) => {
                for c in trainers.iter_mut() {
                    stop(c, libc::SIGKILL, true);
                }
                stop_all(&mut shards, libc::SIGTERM);
                return Err(format!("cannot start trainer {t} (`{}`): {e}", args.command[0]));
            }
        }
    }
    // Wait for the trainers; the first failure stops the rest.
    let mut failed = None;
    let mut running: Vec<(usize, std::process::Child)> = trainers.into_iter().enumerate().collect();
    while !running.is_empty() && failed.is_none() {
        if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            failed = Some("interrupted".to_string());
            break;
        }
        let mut still = Vec::new();
        for (t, mut c) in running {
            match c.try_wait() {
                Ok(Some(status)) if !status.success() => failed = Some(format!("trainer {t} failed: {status}")),
                Ok(Some(_)) => {}
                Ok(None) => still.push((t, c)),
                Err(e) => failed = Some(format!("trainer {t}: {e}")),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, c) in running.iter_mut() {
        stop(c, libc::SIGKILL, true);
    }
    // SIGTERM: the shards write their final snapshots.
    stop_all(&mut shards, libc::SIGTERM);
    match failed {
        Some(f) => Err(format!("oar ps launch: {f}; the job was stopped")),
        None => {
            eprintln!(
                "oar ps launch: {} trainers finished; {} shards stopped",
                args.trainers, args.servers
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
