//! `oar ps server --shard I --of N --port P [--snapshot-dir D] --table SPEC...`: one shard of
//! a parameter server (oar-ps). It serves until interrupted (Ctrl-C or SIGTERM), then writes
//! its final snapshot; started again on the same snapshot directory it resumes.

use crate::CliResult;
use oar_ps::{ServerConfig, Shard, TableConfig};

/// `oar ps` subcommands.
#[derive(clap::Subcommand)]
pub(crate) enum PsCommand {
    /// Serve one shard.
    Server(ServerArgs),
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
        eprintln!(
            "oar ps: shard {} of {} listening on {}",
            args.shard,
            args.num_shards,
            listener.local_addr().map_err(|e| e.to_string())?
        );
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
