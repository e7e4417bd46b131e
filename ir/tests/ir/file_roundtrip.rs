//! `.oar` files: save → load gives back the same graph and weights; bad files get clear errors.

use crate::file_common::{assemble, assemble_v1, nested_conds, sample_model, sections, temp_dir};
use oar_ir::file::{FORMAT_VERSION, FileError, MAX_FILE_REGION_DEPTH, Model};
use oar_ir::graph_def::GraphDef;
use oar_ir::{DType, Dim, Graph, TensorData, TensorType, Weights};

fn assert_same(a: &Model, b: &Model) {
    assert_eq!(GraphDef::from_graph(&a.graph), GraphDef::from_graph(&b.graph));
    assert_eq!(a.weights, b.weights);
}

#[test]
fn save_load_round_trip() {
    let m = sample_model();
    m.check_weights().unwrap();
    let dir = temp_dir("roundtrip");
    let path = dir.join("model.oar");
    m.save(&path).unwrap();
    let back = Model::load(&path).unwrap();
    assert_same(&m, &back);
    // Bytes are deterministic, so save → load → save is the identity on bytes.
    assert_eq!(back.to_bytes().unwrap(), std::fs::read(&path).unwrap());
    // Attributes that JSON cannot write as numbers survive exactly.
    let text = format!("{:?}", back.graph);
    assert!(text.contains("inf") && text.contains("1e-5"), "{text}");
    // Overwriting works and leaves no temp files behind.
    m.save(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("model.oar")]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn layout_is_as_documented() {
    let bytes = sample_model().to_bytes().unwrap();
    assert_eq!(&bytes[..8], b"OARMODEL");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), FORMAT_VERSION);
    let (graph, weights) = sections(&bytes);
    assert_eq!(bytes.len(), 8 + 4 + 8 + graph.len() + 8 + weights.len());
    let def: GraphDef = serde_json::from_slice(&graph).unwrap();
    assert_eq!(def.name, "sample");
    let st = safetensors::SafeTensors::deserialize(&weights).unwrap();
    assert_eq!(st.len(), 12);
    assert_eq!(st.tensor("extra.bf16").unwrap().dtype(), safetensors::Dtype::BF16);
    assert_eq!(st.tensor("extra.bool").unwrap().data(), &[0, 1].repeat(9)[..]);
}

#[test]
fn empty_graph_and_no_weights() {
    let m = Model {
        graph: Graph::new("empty"),
        weights: Weights::new(),
    };
    let back = Model::from_bytes(&m.to_bytes().unwrap()).unwrap();
    assert_same(&m, &back);
}

#[test]
fn newer_version_is_refused_with_a_clear_message() {
    let bytes = sample_model().to_bytes().unwrap();
    let (graph, weights) = sections(&bytes);
    let dir = temp_dir("version");
    let path = dir.join("future.oar");
    std::fs::write(&path, assemble(FORMAT_VERSION + 1, &graph, &weights)).unwrap();
    let e = Model::load(&path).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::UnsupportedVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("future.oar") && msg.contains("written by a newer oar"),
        "{msg}"
    );
    let e = Model::from_bytes(&assemble(0, &graph, &weights)).unwrap_err();
    assert!(e.to_string().contains("not a version oar ever wrote"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn weight_errors_name_the_param() {
    let m = sample_model();
    let mut missing = m.clone();
    missing.weights.remove("else.scale");
    let e = missing.to_bytes().unwrap_err();
    assert!(
        matches!(&e, FileError::MissingWeight { name, .. } if name == "else.scale"),
        "{e}"
    );
    assert!(e.to_string().contains("`else.scale` (f32[3]) has no weight"), "{e}");
    // The same in a file: a good graph section spliced with a weights section lacking one.
    let (graph, _) = sections(&m.to_bytes().unwrap());
    let (_, weights) = sections(
        &Model {
            graph: Graph::new("g"),
            weights: Weights::new(),
        }
        .to_bytes()
        .unwrap(),
    );
    let e = Model::from_bytes(&assemble_v1(&graph, &weights)).unwrap_err();
    assert!(matches!(&e, FileError::MissingWeight { .. }), "{e}");

    let mut wrong = m.clone();
    wrong
        .weights
        .insert("fc.bias".into(), TensorData::from_vec(vec![4], vec![0f32; 4]).unwrap());
    let e = wrong.to_bytes().unwrap_err().to_string();
    assert!(e.contains("`fc.bias` is f32[4] but its param declares f32[3]"), "{e}");
    let mut wrong = m.clone();
    wrong
        .weights
        .insert("fc.bias".into(), TensorData::from_vec(vec![3], vec![0f64; 3]).unwrap());
    assert!(matches!(wrong.check_weights(), Err(FileError::WeightMismatch { .. })));

    let mut extra = m.clone();
    extra.weights.insert("stray".into(), TensorData::scalar(1.0f32));
    let e = extra.check_weights().unwrap_err();
    assert!(
        matches!(&e, FileError::UnexpectedWeight { name, .. } if name == "stray"),
        "{e}"
    );

    let mut g = Graph::new("sym");
    g.add_param("p", TensorType::new(DType::F32, vec![Dim::sym("N")]))
        .unwrap();
    let e = Model {
        graph: g,
        weights: Weights::new(),
    }
    .check_weights()
    .unwrap_err();
    assert!(matches!(e, FileError::SymbolicParam { .. }), "{e}");
}

#[test]
fn framing_errors() {
    let bytes = sample_model().to_bytes().unwrap();
    let e = Model::from_bytes(b"GGUF\x03\x00\x00\x00").unwrap_err();
    assert!(matches!(e, FileError::BadMagic { .. }), "{e}");
    let e = Model::from_bytes(&bytes[..5]).unwrap_err();
    assert!(matches!(e, FileError::Truncated { section: "magic", .. }), "{e}");
    let e = Model::from_bytes(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(
        matches!(
            e,
            FileError::Truncated {
                section: "weights section",
                ..
            }
        ),
        "{e}"
    );
    let mut long = bytes.clone();
    long.extend_from_slice(b"xyz");
    let e = Model::from_bytes(&long).unwrap_err();
    assert!(matches!(e, FileError::TrailingBytes { count: 3, .. }), "{e}");
    let (graph, weights) = sections(&bytes);
    let mut bad_json = graph.clone();
    bad_json.insert(1, b'\n');
    bad_json.insert(2, b'?');
    let e = Model::from_bytes(&assemble_v1(&bad_json, &weights)).unwrap_err();
    assert!(matches!(e, FileError::GraphJson { line: 2, column: 1, .. }), "{e}");
    let e = Model::load(std::path::Path::new("/nonexistent/dir/m.oar")).unwrap_err();
    assert!(matches!(e, FileError::Io { .. }) && e.to_string().contains("/nonexistent/dir/m.oar"));
}

#[test]
fn region_depth_limit_of_the_file() {
    let ok = Model {
        graph: nested_conds(MAX_FILE_REGION_DEPTH),
        weights: Weights::new(),
    };
    let back = Model::from_bytes(&ok.to_bytes().unwrap()).unwrap();
    assert_same(&ok, &back);
    let deep = Model {
        graph: nested_conds(MAX_FILE_REGION_DEPTH + 1),
        weights: Weights::new(),
    };
    let e = deep.to_bytes().unwrap_err().to_string();
    assert!(e.contains("regions nest deeper than a model file holds"), "{e}");
}

#[test]
fn save_failure_leaves_the_old_file() {
    let dir = temp_dir("atomic");
    let path = dir.join("m.oar");
    let good = sample_model();
    good.save(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mut bad = good.clone();
    bad.weights.clear();
    assert!(bad.save(&path).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}
