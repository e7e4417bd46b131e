//! Heterogeneous trainers: CPU trainers read the data and look up the sparse features on the
//! servers; a heter trainer runs the dense part of the model on its own device or backend,
//! taking the CPU trainers' activations and returning their gradients over gRPC
//! (`oar_ps::heter`).
//!
//! - [`serve_heter`] runs a [`DensePart`] for CPU trainers. Its parameters live in a dense
//!   table on the servers (trained by the table's optimizer): before serving it binds them
//!   (the first `INIT` wins) and every `merge` training requests — the number of CPU trainers
//!   it serves per step in sync mode, 1 otherwise — it pushes their averaged gradients and
//!   pulls the new values, so all requests of one step see the same parameters and the next
//!   step sees their update.
//! - [`HeterLink::step`] sends a CPU trainer's activations and, in training, runs backward
//!   through them with the gradients that come back, so its sparse rows get theirs.
//!
//! With one heter trainer (or an SGD dense table) a sync job is one process split in two.

use super::{PsClient, bind, flatten, ps_err, scatter};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use oar_ir::TensorData;
use oar_ps::proto::{HeterReply, NamedTensor};
use oar_ps::{HeterClient, HeterWorker, PushMode, RunningHeter};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The dense part of a model as a heter trainer runs it (on a thread of its own, so it need
/// not be `Send`).
pub trait DensePart {
    /// The scalar loss and the outputs to send back, from the inputs as the CPU trainer sent
    /// them, on this trainer's device (in training, those whose gradients the CPU trainer
    /// wants require grad).
    fn forward(&mut self, inputs: &[Tensor], train: bool) -> Result<(Tensor, Vec<Tensor>)>;
    /// The parameters, kept in the dense table.
    fn parameters(&self) -> Vec<Tensor>;
}

/// The thread that owns the dense part and runs its steps.
struct Dense<P> {
    part: P,
    ps: Arc<PsClient>,
    table: String,
    device: Device,
    merge: usize,
    /// Training requests since the last update.
    pending: usize,
}

type Reply = std::sync::mpsc::SyncSender<std::result::Result<HeterReply, String>>;

/// The gRPC side: hands each request to the dense thread and waits for its answer.
struct Worker {
    jobs: Mutex<std::sync::mpsc::SyncSender<(Vec<NamedTensor>, bool, Reply)>>,
}

fn named(name: &str, t: &Tensor) -> Result<NamedTensor> {
    let host = t.detach().to(&Device::CPU)?;
    Ok(NamedTensor {
        name: name.to_string(),
        shape: host.shape().iter().map(|&d| d as u64).collect(),
        values: host
            .cast(oar_ir::DType::F32)?
            .try_data()?
            .to_vec::<f32>()
            .map_err(ps_err)?,
        needs_grad: false,
    })
}

fn tensor(t: NamedTensor) -> Result<Tensor> {
    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
    Ok(Tensor::from_data(
        TensorData::from_vec(shape, t.values).map_err(ps_err)?,
    ))
}

impl<P: DensePart> Dense<P> {
    fn run(&mut self, inputs: Vec<NamedTensor>, train: bool) -> Result<HeterReply> {
        let wants: Vec<bool> = inputs.iter().map(|t| t.needs_grad && train).collect();
        let xs = inputs
            .into_iter()
            .zip(&wants)
            .map(|(t, &w)| {
                let x = tensor(t)?.to(&self.device)?.detach();
                if w { x.requires_grad_(true) } else { Ok(x) }
            })
            .collect::<Result<Vec<_>>>()?;
        let part = &mut self.part;
        let (loss, outputs) = if train {
            part.forward(&xs, true)?
        } else {
            crate::with_no_grad(|| part.forward(&xs, false))?
        };
        let mut grads = Vec::new();
        if train {
            loss.backward()?;
            for (x, _) in xs.iter().zip(&wants).filter(|(_, w)| **w) {
                let g = x
                    .grad()
                    .ok_or_else(|| Error::invalid("heter trainer", "an input that asked for its gradient got none"))?;
                grads.push(named("grad", &g)?);
            }
            self.pending += 1;
            if self.pending == self.merge {
                self.pending = 0;
                let params = part.parameters();
                let mut g = flatten(&params, true)?;
                g.iter_mut().for_each(|g| *g /= self.merge as f32);
                self.ps
                    .push_dense_as(PushMode::Apply, &self.table, &g)
                    .map_err(ps_err)?;
                scatter(&params, &self.ps.pull_dense(&self.table).map_err(ps_err)?)?;
                params.iter().for_each(Tensor::clear_grad);
            }
        }
        Ok(HeterReply {
            loss: loss.detach().to(&Device::CPU)?.item()? as f32,
            grads,
            outputs: outputs.iter().map(|o| named("output", o)).collect::<Result<_>>()?,
        })
    }
}

impl HeterWorker for Worker {
    fn step(&self, inputs: Vec<NamedTensor>, train: bool) -> std::result::Result<HeterReply, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send((inputs, train, tx));
        sent.map_err(|_| "the dense part's thread has stopped".to_string())?;
        rx.recv()
            .map_err(|_| "the dense part's thread has stopped".to_string())?
    }
}

/// Serve the dense part `make` builds (on a thread of its own, which then runs every step) on
/// `addr` as a heter trainer: its parameters (on `device`) bound to dense table `table` of
/// the servers `ps` talks to, updated every `merge` training requests (see the
/// [module docs](self)).
pub fn serve_heter<P: DensePart + 'static>(
    make: impl FnOnce() -> Result<P> + Send + 'static,
    ps: Arc<PsClient>,
    table: &str,
    device: Device,
    merge: usize,
    addr: SocketAddr,
) -> Result<RunningHeter> {
    if merge == 0 {
        return Err(Error::invalid("serve_heter", "merge must be at least 1"));
    }
    let (jobs, queue) = std::sync::mpsc::sync_channel::<(Vec<NamedTensor>, bool, Reply)>(1);
    let (ready, started) = std::sync::mpsc::sync_channel::<Result<()>>(1);
    let table = table.to_string();
    std::thread::Builder::new()
        .name("oar-heter-dense".into())
        .spawn(move || {
            let bound = make().and_then(|part| {
                bind("serve_heter", &ps, &table, &part.parameters(), None)?;
                Ok(Dense {
                    part,
                    ps,
                    table,
                    device,
                    merge,
                    pending: 0,
                })
            });
            let mut dense = match bound {
                Ok(d) => {
                    let _ = ready.send(Ok(()));
                    d
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            // Until the server (the only sender) is gone.
            for (inputs, train, reply) in queue {
                let _ = reply.send(dense.run(inputs, train).map_err(|e| e.to_string()));
            }
        })
        .map_err(ps_err)?;
    started
        .recv()
        .map_err(|_| Error::invalid("serve_heter", "the dense part's thread stopped"))??;
    let worker = Worker { jobs: Mutex::new(jobs) };
    RunningHeter::start(Arc::new(worker), addr).map_err(ps_err)
}

/// What a heter step gave back.
pub struct HeterStep {
    /// The loss.
    pub loss: f32,
    /// The dense part's outputs (on the host).
    pub outputs: Vec<Tensor>,
}

/// A CPU trainer's link to its heter trainer.
pub struct HeterLink {
    client: HeterClient,
    /// Steps, and payload bytes sent and received (4 per value).
    traffic: Mutex<oar_ps::TrafficCount>,
}

impl HeterLink {
    /// Connect to the heter trainer at `endpoint` (`http://host:port`).
    pub fn connect(endpoint: &str, deadline: Duration) -> Result<HeterLink> {
        Ok(HeterLink {
            client: HeterClient::connect(endpoint, deadline).map_err(ps_err)?,
            traffic: Mutex::new(oar_ps::TrafficCount::default()),
        })
    }

    /// This CPU trainer's heter trainer in a job `oar ps launch --heter-trainers H` started
    /// (trainer `i` uses heter trainer `i mod H`); `None` when the job has none.
    pub fn from_env(deadline: Duration) -> Result<Option<HeterLink>> {
        let Ok(list) = std::env::var("OAR_PS_HETER_ENDPOINTS") else {
            return Ok(None);
        };
        let endpoints: Vec<&str> = list.split(',').filter(|e| !e.is_empty()).collect();
        if endpoints.is_empty() {
            return Ok(None);
        }
        let me = super::Strategy::from_env()?.trainer as usize;
        HeterLink::connect(endpoints[me % endpoints.len()], deadline).map(Some)
    }

    /// Steps sent and their payload bytes (4 per value, both ways).
    pub fn traffic(&self) -> oar_ps::TrafficCount {
        *self.traffic.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send `inputs` (name, value, whether its gradient should come back) for one step of
    /// the dense part. In training, backward then runs from the inputs that asked, with the
    /// gradients that came back, so the tensors they were computed from (a
    /// `SparseEmbedding`'s rows) get theirs.
    pub fn step(&self, inputs: &[(&str, &Tensor, bool)], train: bool) -> Result<HeterStep> {
        let msgs = inputs
            .iter()
            .map(|(name, t, grad)| {
                let mut m = named(name, t)?;
                m.needs_grad = *grad && train;
                Ok(m)
            })
            .collect::<Result<Vec<_>>>()?;
        let sent: usize = msgs.iter().map(|m| 4 * m.values.len()).sum();
        let reply = self.client.step(msgs, train).map_err(ps_err)?;
        {
            let mut t = self.traffic.lock().unwrap_or_else(|p| p.into_inner());
            let back: usize = reply
                .grads
                .iter()
                .chain(&reply.outputs)
                .map(|m| 4 * m.values.len())
                .sum();
            t.calls += 1;
            t.sent += sent as u64;
            t.received += back as u64;
        }
        if train {
            let asked: Vec<&Tensor> = inputs.iter().filter(|(_, _, g)| *g).map(|(_, t, _)| *t).collect();
            if reply.grads.len() != asked.len() {
                return Err(Error::invalid(
                    "heter trainer",
                    format!("{} gradients came back for {} inputs", reply.grads.len(), asked.len()),
                ));
            }
            // One backward for all of them: the sum of ⟨input, its gradient⟩.
            let mut surrogate: Option<Tensor> = None;
            for (x, g) in asked.into_iter().zip(reply.grads) {
                let g = tensor(g)?;
                if g.shape() != x.shape() {
                    return Err(Error::invalid(
                        "heter trainer",
                        format!("a gradient of shape {:?} for an input of {:?}", g.shape(), x.shape()),
                    ));
                }
                let term = x.multiply(&g)?.sum(&[], false)?;
                surrogate = Some(match surrogate {
                    Some(s) => (&s + &term)?,
                    None => term,
                });
            }
            if let Some(s) = surrogate {
                s.backward()?;
            }
        }
        Ok(HeterStep {
            loss: reply.loss,
            outputs: reply.outputs.into_iter().map(tensor).collect::<Result<_>>()?,
        })
    }
}
