//! `oar::ps::SparseEmbedding` (feature `ps`) against a local `Embedding` trained the same way:
//! a parameter-server shard in this process (gRPC on localhost), a model whose embedding lives
//! on it and whose head trains locally.

use oar::Tensor;
use oar::nn::functional::{Reduction, cross_entropy};
use oar::nn::{Embedding, Layer, Linear};
use oar::optimizer::{Optimizer, SGD};
use oar::ps::{PsClient, RunningServer, ServerConfig, ServerOptimizer, SparseEmbedding, TableConfig};
use std::sync::Arc;
use std::time::Duration;

const VOCAB: usize = 20;
const DIM: usize = 4;

fn server(shards: u32) -> Vec<RunningServer> {
    (0..shards)
        .map(|s| {
            let config = ServerConfig {
                shard: s,
                num_shards: shards,
                tables: vec![TableConfig::sparse("emb", DIM, oar_ps_sgd(0.5))],
                snapshot_dir: None,
                snapshot_every: 0,
            };
            RunningServer::start(config, ([127, 0, 0, 1], 0).into()).unwrap()
        })
        .collect()
}

fn oar_ps_sgd(lr: f32) -> ServerOptimizer {
    ServerOptimizer::Sgd { lr }
}

fn head() -> Linear {
    oar::seed(7);
    Linear::new(DIM, 3).unwrap()
}

/// Mean of the rows of each sequence, then the head: `[B, S]` ids to `[B, 3]` logits.
fn logits(emb: &dyn Layer, head: &Linear, ids: &Tensor) -> Tensor {
    head.forward(&emb.forward(ids).unwrap().mean(&[1], false).unwrap())
        .unwrap()
}

#[test]
fn a_server_side_embedding_trains_as_a_local_one() {
    let servers = server(2);
    let endpoints: Vec<String> = servers.iter().map(|s| format!("http://{}", s.addr())).collect();
    let client = Arc::new(PsClient::connect(&endpoints, Duration::from_secs(10)).unwrap());
    let sparse = SparseEmbedding::new(client.clone(), "emb", DIM).unwrap();
    // The local table starts from the server's rows (pulling them creates them).
    let all: Vec<u64> = (0..VOCAB as u64).collect();
    let (_, start) = client.pull_sparse("emb", &all, true).unwrap();
    let local = Embedding::new(VOCAB, DIM).unwrap();
    local
        .weight()
        .set_data(oar::ir::TensorData::from_vec(vec![VOCAB, DIM], start).unwrap())
        .unwrap();
    let (head_l, head_s) = (head(), head());
    let named = |prefix: &str, l: &dyn Layer| -> Vec<(String, Tensor)> {
        l.named_parameters()
            .into_iter()
            .map(|(k, t)| (format!("{prefix}.{k}"), t))
            .collect()
    };
    let mut opt_l = SGD::new([named("emb", &local), named("head", &head_l)].concat(), 0.5);
    let mut opt_s = SGD::new(head_s.named_parameters(), 0.5);
    for step in 0..4 {
        let ids: Vec<i64> = (0..30).map(|i| ((i * 7 + step * 3) % VOCAB) as i64).collect();
        let ids = Tensor::from_vec(ids, &[6, 5]).unwrap();
        let y = Tensor::from_vec((0..6).map(|i| ((i + step) % 3) as i64).collect(), &[6]).unwrap();
        let want = cross_entropy(&logits(&local, &head_l, &ids), &y, Reduction::Mean).unwrap();
        want.backward().unwrap();
        opt_l.step().unwrap();
        opt_l.clear_grad();
        let got = cross_entropy(&logits(&sparse, &head_s, &ids), &y, Reduction::Mean).unwrap();
        got.backward().unwrap();
        sparse.push_gradients().unwrap();
        opt_s.step().unwrap();
        opt_s.clear_grad();
        let (a, b) = (got.item().unwrap(), want.item().unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs(), "step {step}: loss {a} vs {b}");
    }
    let (_, rows) = client.pull_sparse("emb", &all, false).unwrap();
    let want = local.weight().to_vec::<f32>().unwrap();
    for (a, b) in rows.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    // Evaluation: unknown ids read as zeros and are not created; nothing is left to push.
    let mut eval = sparse;
    eval.set_training(false);
    let out = oar::with_no_grad(|| {
        eval.forward(&Tensor::from_vec(vec![1000i64, 3], &[2]).unwrap())
            .unwrap()
    });
    assert_eq!(&out.to_vec::<f32>().unwrap()[..DIM], &[0.0; DIM]);
    eval.push_gradients().unwrap();
    let rows: u64 = client.info().unwrap().iter().map(|i| i.tables[0].rows).sum();
    assert_eq!(rows, VOCAB as u64);
    let e = eval
        .forward(&Tensor::from_vec(vec![0.5f32], &[1]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("integers"), "{e}");
}
