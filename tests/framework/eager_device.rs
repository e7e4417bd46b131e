//! Eager tensors on devices: placement, dispatch through a device runtime, the op cache,
//! autograd and training on a device, and the errors for mixed or missing devices.
//!
//! The device path is exercised with `oar::device::HostRuntime` (device memory is host memory,
//! kernels come from the Cranelift `cpu` backend), so it runs everywhere; the `gpu` kind
//! (the PTX runtime) is checked for its typed error without a GPU, and against the CPU on one
//! (`OAR_REQUIRE_GPU=1` makes a missing GPU a failure).

use oar::device::{HostRuntime, register_runtime};
use oar::ir::BackendError;
use oar::nn::functional::cross_entropy;
use oar::nn::{Layer, Linear, ReLU, Reduction, Sequential};
use oar::optimizer::{Adam, AdamW, Momentum, Optimizer, SGD};
use oar::{DType, Device, Error, Tensor};
use std::sync::Arc;

/// Register a host-backed device kind `kind` with `devices` devices (each test its own kind, so
/// tests running in parallel do not share counters).
fn host_runtime(kind: &str, devices: usize) -> Arc<HostRuntime> {
    let cpu = oar::backend::get("cpu").unwrap();
    let rt = Arc::new(HostRuntime::new(kind, devices, cpu));
    register_runtime(rt.clone());
    rt
}

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!(a.tensor_type(), b.tensor_type(), "{what}: types");
    let (a, b) = (a.data().to_f64_vec(), b.data().to_f64_vec());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: device {x} vs cpu {y}"
        );
    }
}

#[test]
fn tensors_move_between_host_and_device() {
    host_runtime("sim", 2);
    let x = t(&[1.0, -2.0, 3.5, 4.0, 5.0, 6.0], &[2, 3]);
    let d = x.to(&Device::new("sim", 1)).unwrap();
    assert_eq!(d.device(), Device::new("sim", 1));
    assert_eq!(x.device(), Device::CPU, "to() copies, the source stays");
    assert_eq!(d.shape(), vec![2, 3]);
    assert_eq!(d.dtype(), DType::F32);
    assert_eq!(d.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    let back = d.cpu().unwrap();
    assert_eq!(back.device(), Device::CPU);
    assert_eq!(back.to_vec::<f32>().unwrap(), vec![1.0, -2.0, 3.5, 4.0, 5.0, 6.0]);
    assert!(format!("{d}").contains("place=sim:1"), "{d}");
    // Between two devices of a kind, and a trainable leaf stays trainable.
    let w = x.clone().requires_grad_(true).unwrap();
    let w1 = w
        .to(&Device::new("sim", 0))
        .unwrap()
        .to(&Device::new("sim", 1))
        .unwrap();
    assert!(w1.requires_grad() && w1.is_leaf());
    // set_data on a device tensor replaces its device value.
    d.set_data(t(&[0.0; 6], &[2, 3]).data()).unwrap();
    assert_eq!(d.device(), Device::new("sim", 1));
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    assert!(d.set_data(t(&[0.0; 3], &[3]).data()).is_err());
}

#[test]
fn missing_devices_are_typed_errors() {
    host_runtime("simmissing", 1);
    let x = t(&[1.0, 2.0], &[2]);
    let e = x.to(&Device::new("simmissing", 3)).unwrap_err();
    assert!(
        matches!(&e, Error::Backend(BackendError::Unavailable { .. })) && e.to_string().contains("simmissing:3"),
        "{e}"
    );
    let e = x.to(&Device::new("npu", 0)).unwrap_err().to_string();
    assert!(
        e.contains("no runtime for device npu:0") && e.contains("gpu (ptx)"),
        "{e}"
    );
    let mut model = Sequential::new().add(Linear::new(2, 2).unwrap());
    let before = model.state_dict();
    assert!(model.to(&Device::new("simmissing", 7)).is_err());
    for (name, t) in model.state_dict() {
        assert_eq!(t.device(), Device::CPU, "{name} moved although the move failed");
        assert_eq!(t.id(), before[&name].id());
    }
    model.eval();
}

/// Each op on the device gives the CPU's result and stays on the device.
#[test]
fn eager_ops_on_a_device_match_the_cpu() {
    host_runtime("simops", 1);
    let dev = Device::new("simops", 0);
    oar::seed(7);
    let a = oar::randn(&[4, 5], DType::F32).unwrap();
    let b = oar::randn(&[5, 3], DType::F32).unwrap();
    let row = oar::randn(&[5], DType::F32).unwrap();
    let (da, db, drow) = (a.to(&dev).unwrap(), b.to(&dev).unwrap(), row.to(&dev).unwrap());
    type Case = (&'static str, fn(&Tensor, &Tensor, &Tensor) -> oar::Result<Tensor>);
    let cases: &[Case] = &[
        ("add broadcast", |a, _, r| a + r),
        ("matmul", |a, b, _| a.matmul(b)),
        ("exp*tanh", |a, _, _| &a.exp()? * &a.tanh()?),
        ("sum axis", |a, _, _| a.sum(&[1], false)),
        ("mean all", |a, _, _| a.mean(&[], false)),
        ("softmax (composite)", |a, _, _| oar::nn::functional::softmax(a, -1)),
        ("transpose+reshape", |a, _, _| a.transpose(&[1, 0])?.reshape(&[2, 10])),
        ("where(a>r)", |a, _, r| oar::where_(&a.greater_than(r)?, a, &(a * 0.5)?)),
        ("cast f64", |a, _, _| a.cast(DType::F64)),
        ("concat", |a, _, r| oar::concat(&[a, &r.reshape(&[1, 5])?], 0)),
        ("gather", |a, _, _| a.gather(&Tensor::from_slice(&[2i64, 0, 3]), 0)),
        ("scalar const", |a, _, _| a * 3.0),
    ];
    for (name, f) in cases {
        let want = f(&a, &b, &row).unwrap();
        let got = f(&da, &db, &drow).unwrap_or_else(|e| panic!("{name} on {dev}: {e}"));
        assert_eq!(got.device(), dev, "{name}: result left the device");
        assert_close(name, &got, &want, 1e-5);
    }
}

#[test]
fn each_op_dtype_and_shape_compiles_once() {
    let rt = host_runtime("simcache", 1);
    let dev = Device::new("simcache", 0);
    let on = |v: &[f32], s: &[usize]| t(v, s).to(&dev).unwrap();
    let x = on(&[1.0; 6], &[2, 3]);
    let y = on(&[2.0; 6], &[2, 3]);
    let hits = oar::device::cache_stats().hits;
    for _ in 0..3 {
        assert_eq!((&x + &y).unwrap().to_vec::<f32>().unwrap(), vec![3.0; 6]);
    }
    assert_eq!(rt.compiles(), 1, "three adds of one dtype and shape compile once");
    assert!(oar::device::cache_stats().hits >= hits + 2);
    let z = on(&[1.0; 12], &[4, 3]);
    (&z + &z).unwrap();
    assert_eq!(rt.compiles(), 2, "a new shape compiles again");
    let x64 = x.cast(DType::F64).unwrap();
    assert_eq!(rt.compiles(), 3, "cast");
    (&x64 + &x64).unwrap();
    assert_eq!(rt.compiles(), 4, "a new dtype compiles again");
    (&x * &y).unwrap();
    assert_eq!(rt.compiles(), 5, "a new op compiles again");
    (&x + &y).unwrap();
    assert_eq!(rt.compiles(), 5, "cached");
}

#[test]
fn mixed_placements_name_the_op_and_devices() {
    host_runtime("simmix", 2);
    let (d0, d1) = (Device::new("simmix", 0), Device::new("simmix", 1));
    let x = t(&[1.0, 2.0], &[2]).to(&d0).unwrap();
    let e = (&x + &t(&[1.0, 2.0], &[2]).to(&d1).unwrap()).unwrap_err().to_string();
    assert!(
        e.contains("add") && e.contains("simmix:0") && e.contains("simmix:1"),
        "{e}"
    );
    // A CPU constant joins the device computation; a CPU tensor that takes a gradient doesn't.
    let c = (&x * &t(&[10.0, 100.0], &[2])).unwrap();
    assert_eq!(
        (c.device(), c.to_vec::<f32>().unwrap()),
        (d0.clone(), vec![10.0, 200.0])
    );
    let w = t(&[1.0, 1.0], &[2]).requires_grad_(true).unwrap();
    let e = (&x * &w).unwrap_err().to_string();
    assert!(
        e.contains("mul") && e.contains("gradient") && e.contains("simmix:0"),
        "{e}"
    );
    // An explicit output gradient given on the CPU joins the device, and so do the gradients.
    let v = t(&[1.0, 2.0], &[2]).to(&d0).unwrap().requires_grad_(true).unwrap();
    let out = (&v * &v).unwrap();
    out.backward_with(Some(&t(&[1.0, 0.5], &[2])), false).unwrap();
    let g = v.grad().unwrap();
    assert_eq!((g.device(), g.to_vec::<f32>().unwrap()), (d0.clone(), vec![2.0, 2.0]));
    v.clear_grad();
    v.backward_with(Some(&t(&[3.0, 4.0], &[2])), false).unwrap();
    assert_eq!(v.grad().unwrap().device(), d0, "a leaf's own seed moves to its device");
    // Moving a recorded result would cut its gradient.
    let y = (&w * 2.0).unwrap();
    let e = y.to(&d0).unwrap_err().to_string();
    assert!(e.contains("gradient"), "{e}");
    assert_eq!(y.detach().to(&d0).unwrap().device(), d0);
}

/// Gradients on the device equal the CPU's, and a few optimizer steps of an MLP moved with
/// `Layer::to` follow the CPU run step by step.
#[test]
fn training_on_a_device_follows_the_cpu() {
    host_runtime("simtrain", 1);
    let dev = Device::new("simtrain", 0);
    let build = || {
        oar::seed(3);
        Sequential::new()
            .add(Linear::new(6, 16).unwrap())
            .add(ReLU)
            .add(Linear::new(16, 4).unwrap())
    };
    let (cpu_model, dev_model) = (build(), build());
    dev_model.to(&dev).unwrap();
    for (name, p) in dev_model.named_parameters() {
        assert_eq!(p.device(), dev, "{name}");
        assert!(p.requires_grad(), "{name} stays trainable");
    }
    oar::seed(11);
    let x = oar::randn(&[8, 6], DType::F32).unwrap();
    let labels = Tensor::from_vec((0..8).map(|i| i % 4).collect::<Vec<i64>>(), &[8]).unwrap();
    let (dx, dl) = (x.to(&dev).unwrap(), labels.to(&dev).unwrap());
    let mut cpu_opt = Momentum::new(cpu_model.parameters(), 0.1);
    let mut dev_opt = Momentum::new(dev_model.parameters(), 0.1);
    for step in 0..4 {
        let cpu_loss = cross_entropy(&cpu_model.forward(&x).unwrap(), &labels, Reduction::Mean).unwrap();
        let dev_loss = cross_entropy(&dev_model.forward(&dx).unwrap(), &dl, Reduction::Mean).unwrap();
        assert_eq!(dev_loss.device(), dev);
        assert_close(&format!("loss at step {step}"), &dev_loss, &cpu_loss, 1e-5);
        cpu_loss.backward().unwrap();
        dev_loss.backward().unwrap();
        for ((name, pc), (_, pd)) in cpu_model.named_parameters().iter().zip(dev_model.named_parameters()) {
            let g = pd.grad().expect("device parameter has a gradient");
            assert_eq!(g.device(), dev, "{name}.grad");
            assert_close(&format!("{name}.grad at step {step}"), &g, &pc.grad().unwrap(), 1e-4);
        }
        cpu_opt.step().unwrap();
        dev_opt.step().unwrap();
        cpu_opt.clear_grad();
        dev_opt.clear_grad();
    }
    for ((name, pc), (_, pd)) in cpu_model.named_parameters().iter().zip(dev_model.named_parameters()) {
        assert_eq!(pd.device(), dev, "{name} after steps");
        assert_close(name, &pd, pc, 1e-4);
    }
    // Saving downloads; a device model traces to static and loads back on the CPU.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev.safetensors");
    oar::save(&dev_model.state_dict(), &path).unwrap();
    let loaded = oar::load(&path).unwrap();
    for (name, p) in dev_model.state_dict() {
        assert_eq!(loaded[&name], p.data(), "{name} saved from the device");
    }
    let spec = oar::jit::InputSpec::new(&[None, Some(6)], DType::F32, "x");
    let f = oar::jit::to_static_layer(&dev_model, &spec).unwrap();
    let want = cpu_model.forward(&x).unwrap();
    assert_close("to_static of a device model", &f.call(&[&x]).unwrap()[0], &want, 1e-4);
}

/// The `gpu` kind is served by the PTX runtime: without a GPU, a typed error naming the driver;
/// with one, eager ops there match the CPU.
#[test]
fn gpu_tensors_run_through_the_ptx_runtime_or_report_why_not() {
    let x = t(&[1.0, -2.0, 3.0, 4.0, -5.0, 6.0], &[2, 3]);
    let gpu = Device::gpu(0);
    let on_gpu = match x.to(&gpu) {
        Err(e) => {
            assert!(matches!(&e, Error::Backend(BackendError::Unavailable { .. })), "{e}");
            assert!(e.to_string().contains("CUDA"), "{e}");
            if std::env::var_os("OAR_REQUIRE_GPU").is_some() {
                panic!("OAR_REQUIRE_GPU is set but the GPU is unavailable: {e}");
            }
            eprintln!("\n*** SKIPPED: eager GPU tensors: {e} ***\n");
            return;
        }
        Ok(t) => t,
    };
    assert_eq!(on_gpu.device(), gpu);
    let w = t(&[0.5, 1.0, -1.0, 2.0, 0.0, 1.5], &[3, 2]);
    let f = |x: &Tensor, w: &Tensor| -> oar::Result<Tensor> { (&x.matmul(w)?.tanh()? + 1.0)?.sum(&[0], false) };
    let want = f(&x, &w).unwrap();
    let got = f(&on_gpu, &w.to(&gpu).unwrap()).unwrap();
    assert_eq!(got.device(), gpu);
    assert_close("gpu matmul+tanh+sum", &got, &want, 1e-5);
}

/// Optimizers update parameters on their device with the tensor-op form of their rule: no
/// download during a step, the same values as the host update, and a state dict that reads
/// the device-held state.
#[test]
fn optimizer_steps_stay_on_the_device() {
    let rt = host_runtime("simopt", 1);
    let dev = Device::new("simopt", 0);
    type Make = fn(Vec<Tensor>) -> Box<dyn Optimizer>;
    let makers: &[(&str, Make)] = &[
        ("SGD", |p| Box::new(SGD::new(p, 0.1))),
        ("Momentum+L2", |p| {
            Box::new(Momentum::new(p, 0.1).use_nesterov(true).weight_decay(0.01))
        }),
        ("Adam", |p| Box::new(Adam::new(p, 0.05))),
        ("AdamW", |p| Box::new(AdamW::new(p, 0.05).weight_decay(0.1))),
    ];
    for (name, make) in makers {
        let init = t(&[0.5, -1.0, 2.0, 0.25, -0.75, 1.5], &[2, 3]);
        let w_cpu = init.clone().requires_grad_(true).unwrap();
        let w_dev = init.to(&dev).unwrap().requires_grad_(true).unwrap();
        let (mut o_cpu, mut o_dev) = (make(vec![w_cpu.clone()]), make(vec![w_dev.clone()]));
        let c = t(&[1.0, 2.0, 3.0, -1.0, 0.5, 2.5], &[2, 3]);
        for step in 0..3 {
            for (w, o) in [(&w_cpu, &mut o_cpu), (&w_dev, &mut o_dev)] {
                (&(w * w).unwrap() * &c)
                    .unwrap()
                    .sum(&[], false)
                    .unwrap()
                    .backward()
                    .unwrap();
                let before = rt.downloads();
                o.step().unwrap();
                if w.device() == dev {
                    assert_eq!(rt.downloads(), before, "{name}: step {step} downloaded from the device");
                }
                o.clear_grad();
            }
            assert_eq!(w_dev.device(), dev, "{name}");
            assert_close(&format!("{name} step {step}"), &w_dev, &w_cpu, 1e-5);
        }
        let (s_cpu, s_dev) = (o_cpu.state_dict(), o_dev.state_dict());
        assert_eq!(
            s_cpu.keys().collect::<Vec<_>>(),
            s_dev.keys().collect::<Vec<_>>(),
            "{name}"
        );
        for (k, v) in &s_cpu {
            assert_close(
                &format!("{name} state {k}"),
                &Tensor::from_data(s_dev[k].clone()),
                &Tensor::from_data(v.clone()),
                1e-5,
            );
        }
    }
}
