//! `oar::save` / `oar::load`: round trips for every dtype, layers, atomic writes, and errors for
//! missing, truncated and garbage files.

use oar::ir::TensorData;
use oar::nn::Layer;
use oar::{DType, Tensor};
use std::collections::BTreeMap;

fn every_dtype() -> BTreeMap<String, TensorData> {
    let mut m = BTreeMap::new();
    for d in DType::ALL {
        let vals: &[f64] = if d == DType::Bool {
            &[0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
        } else {
            &[0.0, 1.0, 2.0, -1.0, 7.0, 3.0]
        };
        let vals: Vec<f64> = vals.iter().map(|v| if d == DType::U8 { v.abs() } else { *v }).collect();
        m.insert(
            format!("t_{d}"),
            TensorData::from_f64_slice(d, vec![2, 3], &vals).unwrap(),
        );
    }
    m.insert("scalar".into(), TensorData::scalar(2.5f32));
    m.insert("empty".into(), TensorData::from_vec::<f64>(vec![0, 3], vec![]).unwrap());
    m.insert("with.dots/and slashes".into(), TensorData::scalar(-3i64));
    m
}

#[test]
fn every_dtype_round_trips_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    let state = every_dtype();
    oar::save(&state, &path).unwrap();
    let back = oar::load(&path).unwrap();
    assert_eq!(back, state);
    assert_eq!(back["t_bf16"].dtype(), DType::BF16);
    assert_eq!(back["t_f16"].to_f64_vec(), vec![0.0, 1.0, 2.0, -1.0, 7.0, 3.0]);
    // The file is plain safetensors: the header names dtypes the ecosystem's way.
    let bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    assert!(header.contains("\"BF16\"") && header.contains("\"BOOL\""), "{header}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temp files left: {names:?}");
}

#[test]
fn tensors_save_directly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let mut m = BTreeMap::new();
    m.insert(
        "w".to_string(),
        Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap(),
    );
    oar::save(&m, &path).unwrap();
    let back = oar::load(&path).unwrap();
    assert_eq!(back["w"].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(back["w"].shape(), &[2, 2]);
}

struct Affine {
    weight: Tensor,
    bias: Tensor,
    count: Tensor,
}

impl Affine {
    fn new(w: &[f32]) -> Affine {
        Affine {
            weight: Tensor::parameter(TensorData::from_vec(vec![w.len()], w.to_vec()).unwrap()).unwrap(),
            bias: Tensor::parameter(TensorData::scalar(0.5f32)).unwrap(),
            count: Tensor::scalar(0i64),
        }
    }
}

impl Layer for Affine {
    fn forward(&self, x: &Tensor) -> oar::Result<Tensor> {
        &(x * &self.weight)? + &self.bias
    }
    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }
    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        vec![("count".into(), self.count.clone())]
    }
}

struct Outer {
    inner: Affine,
}

impl Layer for Outer {
    fn forward(&self, x: &Tensor) -> oar::Result<Tensor> {
        self.inner.forward(x)
    }
    fn sublayers(&self) -> Vec<(String, &dyn Layer)> {
        vec![("inner".into(), &self.inner)]
    }
}

#[test]
fn layers_save_and_load_their_state_dict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let a = Outer {
        inner: Affine::new(&[1.0, 2.0, 3.0]),
    };
    a.inner.count.set_data(TensorData::scalar(7i64)).unwrap();
    oar::save_layer(&a, &path).unwrap();
    let keys: Vec<String> = oar::load(&path).unwrap().into_keys().collect();
    assert_eq!(keys, vec!["inner.bias", "inner.count", "inner.weight"]);

    let b = Outer {
        inner: Affine::new(&[0.0, 0.0, 0.0]),
    };
    oar::load_layer(&b, &path).unwrap();
    assert_eq!(b.inner.weight.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(b.inner.count.to_vec::<i64>().unwrap(), vec![7]);
    assert!(b.inner.weight.requires_grad(), "loading keeps parameters trainable");

    // A layer of another shape: an error naming the file and the entry; nothing changes.
    let c = Outer {
        inner: Affine::new(&[9.0, 9.0]),
    };
    let e = oar::load_layer(&c, &path).unwrap_err().to_string();
    assert!(e.contains("model.safetensors") && e.contains("inner.weight"), "{e}");
    assert_eq!(c.inner.weight.to_vec::<f32>().unwrap(), vec![9.0, 9.0]);
}

#[test]
fn missing_truncated_and_garbage_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let e = oar::load(&missing).unwrap_err().to_string();
    assert!(e.contains("nope.safetensors"), "{e}");

    let good = dir.path().join("good.safetensors");
    oar::save(&every_dtype(), &good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.safetensors");
    for len in [0, 1, 7, 8, 9, 20, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let e = oar::load(&cut).unwrap_err().to_string();
        assert!(e.contains("cut.safetensors"), "truncated to {len}: {e}");
    }

    // Garbage: a huge header length, random bytes, a header that is not JSON.
    let garbage = dir.path().join("garbage.bin");
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    for g in [huge, b"hello world, not a tensor file".to_vec(), {
        let mut v = 10u64.to_le_bytes().to_vec();
        v.extend_from_slice(b"not json!!");
        v
    }] {
        std::fs::write(&garbage, &g).unwrap();
        let e = oar::load(&garbage).unwrap_err().to_string();
        assert!(e.contains("garbage.bin"), "{e}");
    }

    // Bool bytes other than 0/1 are rejected rather than smuggled in.
    let header = br#"{"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}"#;
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v.extend_from_slice(&[1, 5]);
    std::fs::write(&garbage, &v).unwrap();
    let e = oar::load(&garbage).unwrap_err().to_string();
    assert!(e.contains("bool"), "{e}");

    // Every prefix of a valid file and every single-byte corruption: an error or a value, never
    // a panic.
    for len in 0..bytes.len().min(300) {
        let _ = oar::serialization::from_safetensors_bytes(&bytes[..len], std::path::Path::new("mem"));
    }
    for i in 0..bytes.len().min(300) {
        let mut b = bytes.clone();
        b[i] ^= 0xA5;
        let _ = oar::serialization::from_safetensors_bytes(&b, std::path::Path::new("mem"));
    }
}

#[test]
fn a_failed_save_leaves_the_previous_file_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keep.safetensors");
    oar::save(&every_dtype(), &path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mut bad = BTreeMap::new();
    bad.insert("__metadata__".to_string(), TensorData::scalar(1.0f32));
    let e = oar::save(&bad, &path).unwrap_err().to_string();
    assert!(e.contains("keep.safetensors") && e.contains("__metadata__"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), before);

    let e = oar::save(&every_dtype(), dir.path().join("no_such_dir/x.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no_such_dir"), "{e}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temp files left: {names:?}");
}

/// The saver killed mid-save (SIGKILL, twenty times at random moments): the previous checkpoint
/// always loads whole — `oar::save` and `jit::save` write through a temp file and a rename —
/// and the next save removes the temp files the killed processes left (issue 15, item 4).
#[cfg(unix)]
#[test]
fn a_save_killed_midway_never_loses_the_previous_checkpoint() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let state = |v: f32| {
        BTreeMap::from([(
            "w".to_string(),
            TensorData::from_vec(vec![1 << 20], vec![v; 1 << 20]).unwrap(),
        )])
    };
    let path = dir.path().join("ckpt.safetensors");
    oar::save(&state(1.0), &path).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..20 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "save_load::saver_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("OAR_SAVER_PATH", &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(std::time::Duration::from_millis(20 + seed % 200));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let loaded = oar::load(&path).unwrap_or_else(|e| panic!("round {round}: the checkpoint is lost: {e}"));
        let v = loaded["w"].to_vec::<f32>().unwrap();
        assert!(
            v.len() == 1 << 20 && (v[0] == 1.0 || v[0] == 2.0) && v.iter().all(|&x| x == v[0]),
            "round {round}"
        );
    }
    oar::save(&state(1.0), &path).unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "stale temp files: {left:?}");
}

/// The child of the test above: saves alternating checkpoints until it is killed.
#[test]
#[ignore = "run by a_save_killed_midway_never_loses_the_previous_checkpoint"]
fn saver_child() {
    let Some(path) = std::env::var_os("OAR_SAVER_PATH") else {
        return;
    };
    for i in 0..10_000 {
        let v = if i % 2 == 0 { 2.0f32 } else { 1.0 };
        let s = BTreeMap::from([(
            "w".to_string(),
            TensorData::from_vec(vec![1 << 20], vec![v; 1 << 20]).unwrap(),
        )]);
        oar::save(&s, &path).unwrap();
    }
}
