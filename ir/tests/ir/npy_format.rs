//! npy reading and writing against bytes laid out exactly as numpy 2.x writes them.

use oar_ir::npy::{NpyErrorKind, read_npy, read_npy_bytes, to_npy_bytes, write_npy};
use oar_ir::{DType, TensorData};

/// An npy v1.0 file: magic, version, u16 header length, dict padded with spaces to a 64-byte
/// boundary and ending in a newline (numpy's `_wrap_header`), then the data.
fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    npy_v(1, dict, data)
}

fn npy_v(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let len_bytes = if major == 1 { 2 } else { 4 };
    let used = 6 + 2 + len_bytes + dict.len() + 1;
    let header_len = dict.len() + (64 - used % 64) + 1;
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, 0]);
    out.extend_from_slice(&(header_len as u32).to_le_bytes()[..len_bytes]);
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + header_len - dict.len() - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(data);
    out
}

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `np.save(f, np.arange(6, dtype='<f4').reshape(2, 3))`, byte for byte (numpy 2.4).
const NUMPY_F32_2X3: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }                                                          \n\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40";

#[test]
fn reads_and_writes_numpy_bytes_exactly() {
    assert_eq!(NUMPY_F32_2X3.len(), 152);
    let t = read_npy_bytes(NUMPY_F32_2X3).unwrap();
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(to_npy_bytes(&t).unwrap(), NUMPY_F32_2X3);
    // The helper agrees with numpy's layout, so the cases below are numpy-shaped too.
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    assert_eq!(npy(dict, &le_f32(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])), NUMPY_F32_2X3);
}

#[test]
fn scalar_and_vector_shapes() {
    // np.save(f, np.array(3.5)) -> 136 bytes; np.save(f, np.array([1, 2, 3])) -> 152 bytes.
    let b = npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
        &3.5f64.to_le_bytes(),
    );
    assert_eq!(b.len(), 136);
    let t = read_npy_bytes(&b).unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::F64, &[][..]));
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![3.5]);
    assert_eq!(to_npy_bytes(&t).unwrap(), b);

    let data: Vec<u8> = [1i64, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect();
    let b = npy("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", &data);
    assert_eq!(b.len(), 152);
    let t = read_npy_bytes(&b).unwrap();
    assert_eq!(t.shape(), &[3]);
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
    assert_eq!(to_npy_bytes(&t).unwrap(), b);

    // Zero-size arrays have no data bytes.
    let b = npy("{'descr': '<f2', 'fortran_order': False, 'shape': (0,), }", &[]);
    assert_eq!(b.len(), 128);
    let t = read_npy_bytes(&b).unwrap();
    assert_eq!((t.dtype(), t.shape(), t.len()), (DType::F16, &[0][..], 0));
}

#[test]
fn every_supported_dtype_round_trips() {
    for d in DType::ALL {
        let t = TensorData::from_f64_slice(d, vec![2, 2], &[1.0, 0.0, 3.0, 1.0]).unwrap();
        if d == DType::BF16 {
            let e = to_npy_bytes(&t).unwrap_err();
            assert!(matches!(e.kind, NpyErrorKind::NoNumpyDType(DType::BF16)));
            assert!(e.to_string().contains("cast to f32"), "{e}");
            continue;
        }
        let back = read_npy_bytes(&to_npy_bytes(&t).unwrap()).unwrap();
        assert_eq!(back, t, "{d}");
    }
}

#[test]
fn other_header_spellings_and_versions() {
    // Double quotes, no trailing comma, other key order, extra spaces: all Python dict syntax.
    let b = npy(
        "{\"shape\": ( 2 ,3 ), \"descr\": \"|u1\", \"fortran_order\": False}",
        &[1, 2, 3, 4, 5, 6],
    );
    let t = read_npy_bytes(&b).unwrap();
    assert_eq!((t.dtype(), t.shape()), (DType::U8, &[2, 3][..]));
    assert_eq!(t.bytes(), &[1, 2, 3, 4, 5, 6]);
    for major in [2, 3] {
        let b = npy_v(
            major,
            "{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }",
            &[0xff, 7],
        );
        assert_eq!(read_npy_bytes(&b).unwrap().to_vec::<i8>().unwrap(), vec![-1, 7]);
    }
    let b = npy("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", &[1, 0]);
    assert_eq!(read_npy_bytes(&b).unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
}

fn kind_of(bytes: &[u8]) -> NpyErrorKind {
    read_npy_bytes(bytes).unwrap_err().kind
}

#[test]
fn clear_errors_for_unsupported_files() {
    let dict = |descr: &str, fortran: &str, shape: &str| {
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
    };
    let b = npy(&dict(">f4", "False", "(1,)"), &[0; 4]);
    let e = read_npy_bytes(&b).unwrap_err().to_string();
    assert!(e.contains("'>f4' is big-endian"), "{e}");
    let b = npy(&dict("<f4", "True", "(2, 2)"), &[0; 16]);
    assert!(matches!(kind_of(&b), NpyErrorKind::FortranOrder));
    let b = npy(&dict("<u2", "False", "(1,)"), &[0; 2]);
    assert!(matches!(kind_of(&b), NpyErrorKind::UnsupportedDType(d) if d == "<u2"));
    let b = npy(&dict("<f4", "False", "(2, 3)"), &[0; 20]);
    let e = read_npy_bytes(&b).unwrap_err().to_string();
    assert!(e.contains("needs 24 data bytes, the file has 20"), "{e}");
    let b = npy(&dict("<f4", "False", "(1000000000000000, 1000000000000000)"), &[]);
    assert!(matches!(kind_of(&b), NpyErrorKind::TooLarge(_)));
    let b = npy(&dict("|b1", "False", "(2,)"), &[1, 2]);
    assert!(matches!(kind_of(&b), NpyErrorKind::BadBool));
    let mut b = npy(&dict("<f4", "False", "(1,)"), &[0; 4]);
    b[6] = 4;
    assert!(matches!(
        kind_of(&b),
        NpyErrorKind::UnsupportedVersion { major: 4, minor: 0 }
    ));
    assert!(matches!(kind_of(b"PK\x03\x04"), NpyErrorKind::BadMagic));
    assert!(matches!(kind_of(b""), NpyErrorKind::BadMagic));
    assert!(matches!(kind_of(b"\x93NUM"), NpyErrorKind::Truncated(_)));
}

#[test]
fn hostile_headers_are_errors() {
    let bad = [
        "",
        "{",
        "{}",
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
        "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
        "{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} trailing",
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
        "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",
    ];
    for h in bad {
        let e = read_npy_bytes(&npy(h, &[0; 4])).unwrap_err();
        assert!(
            matches!(e.kind, NpyErrorKind::Header(_) | NpyErrorKind::UnsupportedDType(_)),
            "{h}: {e}"
        );
    }
    // A header length past the end of the file.
    let mut b = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", &[0; 4]);
    b[8] = 0xff;
    b[9] = 0xff;
    assert!(matches!(kind_of(&b), NpyErrorKind::Truncated("header")));
    // Non-ASCII header bytes.
    let mut b = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", &[0; 4]);
    b[12] = 0xe9;
    assert!(matches!(kind_of(&b), NpyErrorKind::Header(_)));
}

#[test]
fn files_round_trip_and_errors_name_the_path() {
    let dir = std::env::temp_dir().join(format!("oar-npy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("w.npy");
    let t = TensorData::from_vec(vec![3], vec![1i32, -2, 3]).unwrap();
    write_npy(&p, &t).unwrap();
    assert_eq!(read_npy(&p).unwrap(), t);
    let missing = dir.join("missing.npy");
    let e = read_npy(&missing).unwrap_err().to_string();
    assert!(e.contains("missing.npy"), "{e}");
    std::fs::write(&p, b"not npy").unwrap();
    let e = read_npy(&p).unwrap_err().to_string();
    assert!(e.contains("w.npy") && e.contains("bad magic"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let b = npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
        &le_f32(&[1.0, 2.0]),
    );
    for n in 0..b.len() {
        assert!(read_npy_bytes(&b[..n]).is_err(), "prefix of {n} bytes");
    }
    assert!(read_npy_bytes(&b).is_ok());
}
