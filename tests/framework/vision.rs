//! The model zoo: ResNet-18 has torchvision's parameter count, Paddle's layer names, and its
//! traced graph computes what the eager model does.

use oar::jit::{InputSpec, to_static_layer};
use oar::nn::Layer;
use oar::vision::models::resnet18;
use oar::{DType, no_grad};

#[test]
fn resnet18_shape_names_and_static_equivalence() {
    oar::seed(3);
    let mut net = resnet18(10).unwrap();
    // torchvision's resnet18 has 11,689,512 parameters with 1000 classes; with 10 classes the
    // classifier shrinks by 512·990 + 990.
    let count: usize = net.parameters().iter().map(|p| p.numel()).sum();
    assert_eq!(count, 11_689_512 - 512 * 990 - 990);
    let names: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
    for expected in [
        "conv1.weight",
        "bn1.weight",
        "layer1.0.conv1.weight",
        "layer2.0.downsample.0.weight",
        "fc.bias",
    ] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing");
    }
    assert!(net.named_buffers().iter().any(|(n, _)| n == "layer4.1.bn2._mean"));
    net.eval();
    let _g = no_grad();
    let x = oar::randn(&[2, 3, 32, 32], DType::F32).unwrap();
    let eager = net.forward(&x).unwrap();
    assert_eq!(eager.shape(), vec![2, 10]);
    let f = to_static_layer(
        &net,
        &InputSpec::new(&[None, Some(3), Some(32), Some(32)], DType::F32, "image"),
    )
    .unwrap();
    let stat = f.call(&[&x]).unwrap().remove(0);
    let (a, b) = (eager.to_vec::<f32>().unwrap(), stat.to_vec::<f32>().unwrap());
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() <= 1e-4 * (1.0 + q.abs()), "{p} vs {q}");
    }
}
