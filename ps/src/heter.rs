//! The heterogeneous trainers' transport: a heter trainer serves the dense part of a model
//! (`HeterTrainer` in `proto/ps.proto`) to CPU trainers, which send activations and get back
//! the loss and the activations' gradients. What runs the dense part is a [`HeterWorker`]
//! (`oar::ps` implements it with eager tensors on any device); this module moves the values.

use crate::PsError;
use crate::proto::heter_trainer_client::HeterTrainerClient;
use crate::proto::heter_trainer_server::{HeterTrainer, HeterTrainerServer};
use crate::proto::{HeterReply, HeterRequest, NamedTensor};
use crate::server::{MAX_MESSAGE_BYTES, Serving};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// What a heter trainer runs for each request (blocking; called off the serving threads, one
/// request at a time).
pub trait HeterWorker: Send + Sync + 'static {
    /// One step of the dense part on `inputs`; `Err` is a message for the caller.
    fn step(&self, inputs: Vec<NamedTensor>, train: bool) -> Result<HeterReply, String>;
}

/// The checks every request passes before its worker sees it.
fn check(r: &HeterRequest) -> Result<(), Status> {
    if r.inputs.is_empty() {
        return Err(Status::invalid_argument("a heter step needs inputs"));
    }
    for t in &r.inputs {
        let n = t
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n == t.values.len() as u64);
        if n.is_none() {
            return Err(Status::invalid_argument(format!(
                "input `{}`: shape {:?} does not hold its {} values",
                t.name,
                t.shape,
                t.values.len()
            )));
        }
        if t.values.iter().any(|v| !v.is_finite()) {
            return Err(Status::invalid_argument(format!("input `{}` is not finite", t.name)));
        }
    }
    Ok(())
}

struct Service(Arc<std::sync::Mutex<Arc<dyn HeterWorker>>>);

#[tonic::async_trait]
impl HeterTrainer for Service {
    async fn step(&self, req: Request<HeterRequest>) -> Result<Response<HeterReply>, Status> {
        let r = req.into_inner();
        check(&r)?;
        let worker = self.0.clone();
        // One request at a time (the dense part's parameters are shared), off the async threads.
        let reply = tokio::task::spawn_blocking(move || {
            let w = worker.lock().unwrap_or_else(|p| p.into_inner());
            w.step(r.inputs, r.train)
        })
        .await
        .map_err(|e| Status::internal(format!("the heter worker panicked: {e}")))?
        .map_err(Status::invalid_argument)?;
        Ok(Response::new(reply))
    }
}

/// A heter trainer served on a thread of its own; `stop` (or drop) shuts it down.
pub struct RunningHeter(Serving);

impl RunningHeter {
    /// Serve `worker` on `addr` (port 0: any free port).
    pub fn start(worker: Arc<dyn HeterWorker>, addr: SocketAddr) -> Result<RunningHeter, PsError> {
        let svc = HeterTrainerServer::new(Service(Arc::new(std::sync::Mutex::new(worker))))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Serving::start("heter", addr, move |listener, rx| async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await
                .map_err(|e| PsError::Transport(e.to_string()))
        })
        .map(RunningHeter)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Serve until this process gets SIGTERM or SIGINT (a heter trainer under `oar ps
    /// launch`), then stop.
    pub fn wait_for_signal(self) -> Result<(), PsError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| PsError::Transport(e.to_string()))?;
        rt.block_on(async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|e| PsError::Transport(e.to_string()))?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            Ok::<(), PsError>(())
        })?;
        self.stop()
    }

    /// Shut down and wait.
    pub fn stop(mut self) -> Result<(), PsError> {
        self.0.shutdown()
    }
}

/// A CPU trainer's connection to its heter trainer.
pub struct HeterClient {
    rt: tokio::runtime::Runtime,
    client: HeterTrainerClient<Channel>,
    deadline: Duration,
}

impl HeterClient {
    /// Connect (lazily) to the heter trainer at `endpoint`; every step must finish within
    /// `deadline` (a heter trainer still starting is retried until then).
    pub fn connect(endpoint: &str, deadline: Duration) -> Result<HeterClient, PsError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| PsError::Transport(e.to_string()))?;
        let ep = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| PsError::Config(format!("bad endpoint `{endpoint}`: {e}")))?
            .connect_timeout(deadline)
            .timeout(deadline)
            .tcp_nodelay(true);
        let channel = {
            let _g = rt.enter();
            ep.connect_lazy()
        };
        let client = HeterTrainerClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(HeterClient { rt, client, deadline })
    }

    /// One step of the dense part (see [`HeterWorker::step`]).
    pub fn step(&self, inputs: Vec<NamedTensor>, train: bool) -> Result<HeterReply, PsError> {
        let start = std::time::Instant::now();
        let mut wait = Duration::from_millis(20);
        let req = HeterRequest { inputs, train };
        self.rt.block_on(async {
            loop {
                let left = self.deadline.saturating_sub(start.elapsed());
                let attempt = tokio::time::timeout(left, self.client.clone().step(req.clone())).await;
                let status = match attempt {
                    Ok(Ok(r)) => return Ok(r.into_inner()),
                    Ok(Err(st)) => st,
                    Err(_) => Status::deadline_exceeded(format!("no answer within {:?}", self.deadline)),
                };
                // A heter trainer not up yet (or restarting) is retried.
                let retry = status.code() == tonic::Code::Unavailable;
                if !retry || start.elapsed() + wait >= self.deadline {
                    return Err(PsError::Heter(format!("{:?}: {}", status.code(), status.message())));
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        })
    }
}
