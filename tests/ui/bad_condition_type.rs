use oar::{Result, Tensor};

#[oar::to_static]
fn f(x: &Tensor, k: i32) -> Result<Tensor> {
    if k {
        return Ok(x.clone());
    }
    Ok(x.clone())
}

fn main() {}
