use oar::{Result, Tensor};

#[oar::to_static]
fn f(x: &Tensor, k: i32) -> Result<Tensor> {
    let mut y = x.clone();
    if k {
        y = y.scale(2.0, 0.0)?;
    }
    Ok(y)
}

fn main() {}
