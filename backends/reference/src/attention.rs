//! Scaled dot-product attention, computed directly:
//! `softmax(q kᵀ · scale + mask) v`, where a bool mask keeps `true` positions (others get
//! -inf), a float mask is added, and `causal` masks key index `j > i` for query index `i`
//! (top-left aligned, like PyTorch). A row with every key masked yields NaN (PyTorch).

use crate::contraction::matmul_f64;
use crate::elementwise::{broadcast_dims, view_as};
use crate::norm::softmax_f64;
use crate::value::{Data, Res, Site, Value};

/// `sdpa(q, k, v, mask?)`.
pub(crate) fn sdpa(site: &Site, ins: &[&Value], causal: bool, scale: Option<f64>) -> Res<Value> {
    let (q, k, v) = match ins {
        [q, k, v] | [q, k, v, _] => (q.as_f(site, "q")?, k.as_f(site, "k")?, v.as_f(site, "v")?),
        _ => return Err(site.err(format!("expects 3 or 4 operands, got {}", ins.len()))),
    };
    let rk = k.ndim();
    if q.ndim() < 2 || rk < 2 {
        return Err(site.err(format!(
            "q and k need rank ≥ 2, got {:?} and {:?}",
            q.shape(),
            k.shape()
        )));
    }
    let e = q.shape()[q.ndim() - 1];
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    // Refuse oversized scores before allocating them.
    let (rq, l, sk) = (q.ndim(), q.shape()[q.ndim() - 2], k.shape()[rk - 2]);
    let mut scores_shape = broadcast_dims(site, &q.shape()[..rq - 2], &k.shape()[..rk - 2])?;
    scores_shape.extend([l, sk]);
    site.check_size(ins[0].dtype, &scores_shape, "attention scores")?;
    let mut kt = k.view();
    kt.swap_axes(rk - 1, rk - 2);
    let mut scores = matmul_f64(site, q, &kt.to_owned())?;
    scores.mapv_inplace(|s| s * scale);
    let r = scores.ndim();
    if causal {
        for (ix, s) in scores.indexed_iter_mut() {
            if ix[r - 1] > ix[r - 2] {
                *s = f64::NEG_INFINITY;
            }
        }
    }
    if let Some(m) = ins.get(3) {
        let shape = scores.shape().to_vec();
        match &m.data {
            Data::B(mask) => {
                let mv = view_as(site, mask, &shape)?;
                scores.zip_mut_with(&mv, |s, &keep| {
                    if !keep {
                        *s = f64::NEG_INFINITY;
                    }
                });
            }
            Data::F(mask) => {
                let mv = view_as(site, mask, &shape)?;
                scores.zip_mut_with(&mv, |s, &add| *s += add);
            }
            Data::I(_) => return Err(site.err(format!("mask must be bool or float, got {}", m.dtype))),
        }
    }
    let probs = softmax_f64(&scores, r - 1, false);
    Ok(Value::float(ins[0].dtype, matmul_f64(site, &probs, v)?))
}
