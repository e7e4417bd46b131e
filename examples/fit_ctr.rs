//! Wide&Deep on synthetic click-through data with `oar::Model` and the streaming AUC metric.
//! Each example has 4 dense features and 6 categorical fields whose ids follow a Zipf-like law;
//! its click comes from a planted logistic teacher (a weight per dense feature, a random
//! effect per id), so the best reachable AUC is known: the teacher's own AUC on the test set,
//! printed beside the model's. Without arguments the example fails unless the model comes
//! within 0.03 of it.
//!
//! `cargo run --release --example fit_ctr [--epochs N]`

use oar::io::{DataLoader, Dataset};
use oar::ir::ops::BinaryOp;
use oar::metric::{Auc, Metric};
use oar::nn::Layer;
use oar::optimizer::Adam;
use oar::rec::models::{CtrConfig, WideDeep};
use oar::{Model, Result, Tensor};

const FIELDS: [usize; 6] = [50, 100, 20, 10, 200, 30];
const DENSE: usize = 4;

/// Examples packed as WideDeep's `forward` takes them (`[D + F]`: dense features, then ids)
/// and 0/1 labels.
struct Clicks {
    x: Vec<f32>,
    y: Vec<f32>,
    teacher: Vec<f32>,
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn uniform(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }
}

/// The teacher: dense weights, one effect per id of each field, a bias.
struct Teacher {
    dense: [f64; DENSE],
    effects: Vec<Vec<f64>>,
}

impl Teacher {
    fn new(rng: &mut Lcg) -> Teacher {
        Teacher {
            dense: [0.8, -0.5, 0.3, 0.0],
            effects: FIELDS
                .iter()
                .map(|&n| (0..n).map(|_| 0.7 * rng.normal()).collect())
                .collect(),
        }
    }

    fn sample(&self, n: usize, rng: &mut Lcg) -> Clicks {
        let (mut x, mut y, mut teacher) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let mut logit = -0.5;
            for w in self.dense {
                let v = rng.normal();
                logit += w * v;
                x.push(v as f32);
            }
            for (f, &size) in FIELDS.iter().enumerate() {
                // Zipf-like: small ids are frequent.
                let id = ((size as f64).powf(rng.uniform()) - 1.0) as usize;
                logit += self.effects[f][id];
                x.push(id as f32);
            }
            let p = 1.0 / (1.0 + (-logit).exp());
            teacher.push(p as f32);
            y.push(f32::from(rng.uniform() < p));
        }
        Clicks { x, y, teacher }
    }
}

impl Dataset for Clicks {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.y.len()
    }
    fn get(&self, i: usize) -> Result<(Tensor, Tensor)> {
        let w = DENSE + FIELDS.len();
        let row = self
            .x
            .get(i * w..(i + 1) * w)
            .ok_or_else(|| oar::Error::invalid("Clicks", format!("index {i}")))?;
        Ok((
            Tensor::from_vec(row.to_vec(), &[w])?,
            Tensor::from_vec(vec![self.y[i]], &[1])?,
        ))
    }
}

/// Binary cross-entropy of probabilities `p` against 0/1 labels `t` (clamped away from 0 and 1).
fn bce(p: &Tensor, t: &Tensor) -> Result<Tensor> {
    let p = p
        .binary_scalar(BinaryOp::Max, 1e-7)?
        .binary_scalar(BinaryOp::Min, 1.0 - 1e-7)?;
    let one_minus = |v: &Tensor| v.scale(-1.0, 1.0);
    let pos = t.multiply(&p.log()?)?;
    let neg = one_minus(t)?.multiply(&one_minus(&p)?.log()?)?;
    (&pos + &neg)?.mean(&[], false)?.scale(-1.0, 0.0)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let epochs = args
        .iter()
        .position(|a| a == "--epochs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut rng = Lcg(7);
    let teacher = Teacher::new(&mut rng);
    let (train, test) = (teacher.sample(20_000, &mut rng), teacher.sample(5_000, &mut rng));
    let mut best = Auc::new();
    best.update(
        &Tensor::from_vec(test.teacher.clone(), &[test.len(), 1])?,
        &Tensor::from_vec(test.y.clone(), &[test.len(), 1])?,
    )?;
    let reachable = best.accumulate()[0];

    oar::seed(0);
    let net = WideDeep::new(&CtrConfig {
        field_dims: FIELDS.to_vec(),
        dense_dim: DENSE,
        embed_dim: 8,
        hidden_sizes: vec![64, 32],
        dropout: 0.0,
    })?;
    let opt = Adam::new(net.named_parameters(), 3e-3);
    let mut model = Model::new(net);
    model.prepare(opt, bce, vec![Box::new(Auc::new())]);
    let train = DataLoader::new(train).batch_size(256).shuffle(true).seed(0);
    let test = DataLoader::new(test).batch_size(1000);
    let history = model.fit(&train, Some(&test), epochs)?;
    let auc = history.last().map_or(0.0, |h| h.eval["auc"]);
    println!("test AUC {auc:.4}; the teacher's (the best reachable) {reachable:.4}");
    if epochs >= 4 && auc < reachable - 0.03 {
        return Err(oar::Error::invalid(
            "fit_ctr",
            format!("AUC {auc:.4} is more than 0.03 below the reachable {reachable:.4}"),
        ));
    }
    Ok(())
}
