use oar::{Result, Tensor};

#[oar::to_static]
fn f(x: &Tensor) -> Result<Tensor> {
    let mut steps = 0usize;
    if x.sum(&[], false)? {
        steps = 1;
    }
    Ok(x.scale(steps as f64, 0.0)?)
}

fn main() {}
