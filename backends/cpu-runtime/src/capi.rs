//! AOT models: the blob an AOT object embeds ([`encode_aot_blob`]), loading it with its
//! kernel table and weights ([`AotModel`]), and the C API of AOT shared libraries
//! (`oar_model_run`, `oar_model_destroy`, ...; declared in [`C_API_HEADER`]).
//!
//! An AOT object holds three things the compiler generated: the blob (a signature, the
//! [`CpuProgram`] and its embedded weights), a table of kernel function pointers, and a small
//! entry function that hands both to this runtime: `main` (executables, see [`crate::exe`])
//! or `oar_model_create` (shared libraries), which calls [`oar_rt_model_create`].
//!
//! No Rust panic crosses the C boundary: every exported function catches panics and reports
//! them as errors.

use crate::Model;
use crate::program::{CpuProgram, KernelFn, decode_blob, encode_blob, static_shape};
use oar_ir::{BackendError, DType, TensorData, TensorType, Weights};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// What an AOT binary knows about its model beyond the [`CpuProgram`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AotMeta {
    /// The graph's name.
    pub name: String,
    /// Graph inputs in graph order, with every dim bound. An input the program does not read
    /// (dead after optimization) is still listed: callers may pass it, it is checked and
    /// ignored.
    pub inputs: Vec<(String, TensorType)>,
    /// Whether the parameters live in a separate safetensors file (`--weights external`)
    /// rather than in the blob.
    pub external_weights: bool,
}

const AOT_MAGIC: &[u8; 8] = b"OARAOT01";

/// The blob of an AOT binary: `OARAOT01`, the [`AotMeta`] JSON length (u64 LE), the JSON,
/// then the program blob of [`encode_blob`] (program and embedded weights).
pub fn encode_aot_blob(meta: &AotMeta, program: &CpuProgram, weights: &Weights) -> Result<Vec<u8>, String> {
    let json = serde_json::to_vec(meta).map_err(|e| format!("encoding the model signature: {e}"))?;
    let prog = encode_blob(program, weights)?;
    let mut out = Vec::with_capacity(16 + json.len() + prog.len());
    out.extend_from_slice(AOT_MAGIC);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&prog);
    Ok(out)
}

/// Read a blob written by [`encode_aot_blob`].
pub fn decode_aot_blob(blob: &[u8]) -> Result<(AotMeta, CpuProgram, Weights), String> {
    if blob.len() < 16 || &blob[..8] != AOT_MAGIC {
        return Err("not an oar AOT model blob (bad magic)".into());
    }
    let n = u64::from_le_bytes(blob[8..16].try_into().expect("8 bytes")) as usize;
    let json = blob
        .get(16..16usize.saturating_add(n))
        .ok_or_else(|| format!("AOT blob truncated: {} bytes, header says {n} of JSON", blob.len()))?;
    let meta: AotMeta = serde_json::from_slice(json).map_err(|e| format!("decoding the model signature: {e}"))?;
    let (program, weights) = decode_blob(&blob[16 + n..])?;
    Ok((meta, program, weights))
}

/// Read a safetensors weights file for an AOT model; errors name the file.
pub fn read_weights_file(path: &Path) -> Result<Weights, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("weights file `{}`: {e}", path.display()))?;
    oar_ir::file::decode_weights(&bytes)
        .map_err(|e| format!("weights file `{}` is not a valid safetensors file: {e}", path.display()))
}

/// A loaded AOT model: the runtime [`Model`] and its signature.
pub struct AotModel {
    /// The runtime model.
    pub model: Model,
    /// The signature (inputs in graph order).
    pub meta: AotMeta,
    /// Outputs `(name, type)` in graph order.
    pub outputs: Vec<(String, TensorType)>,
}

impl AotModel {
    /// Load a model from its blob and kernel table. Weights: the blob's embedded ones, then
    /// (overriding them) those of `weights_file` if given. A model compiled with external
    /// weights needs `weights_file`.
    pub fn load(blob: &[u8], table: &[KernelFn], weights_file: Option<&Path>) -> Result<AotModel, String> {
        let (meta, program, mut weights) = decode_aot_blob(blob)?;
        let file_label = match weights_file {
            Some(p) => {
                // The file replaces the parameters: exactly the model's names, shapes and dtypes
                // (an empty, partial or foreign file is an error, not a silent merge).
                let label = format!("weights file `{}`", p.display());
                let given = read_weights_file(p)?;
                let want = program.params();
                let unknown: Vec<&String> = given.keys().filter(|k| !want.contains_key(*k)).collect();
                if !unknown.is_empty() {
                    return Err(format!("{label}: tensors the model does not have: {unknown:?}"));
                }
                let missing: Vec<String> = want
                    .iter()
                    .filter(|(k, _)| !given.contains_key(*k))
                    .map(|(k, b)| format!("{k}: {}", b.ty))
                    .collect();
                if !missing.is_empty() {
                    return Err(format!("{label}: missing parameters {missing:?}"));
                }
                for (k, t) in &given {
                    if t.tensor_type() != want[k].ty {
                        return Err(format!(
                            "{label}: parameter `{k}`: expected {1}, got {0}",
                            t.tensor_type(),
                            want[k].ty
                        ));
                    }
                }
                weights.extend(given);
                Some(format!("{label}: "))
            }
            None if meta.external_weights => {
                return Err(format!(
                    "model `{}` was compiled with external weights: give the weights file",
                    meta.name
                ));
            }
            None => None,
        };
        let model = Model::new(program, table.to_vec(), &weights)
            .map_err(|e| format!("{}{e}", file_label.unwrap_or_default()))?;
        let outputs = model.outputs();
        Ok(AotModel { model, meta, outputs })
    }

    /// Check inputs by name against the signature (unknown, missing, dtype, shape), then run.
    pub fn run(&self, mut inputs: BTreeMap<String, TensorData>) -> Result<Vec<(String, TensorData)>, BackendError> {
        let known = || {
            self.meta
                .inputs
                .iter()
                .map(|(n, t)| format!("{n}: {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for name in inputs.keys() {
            if !self.meta.inputs.iter().any(|(n, _)| n == name) {
                return Err(BackendError::UnknownInput {
                    name: name.clone(),
                    known: known(),
                });
            }
        }
        for (name, ty) in &self.meta.inputs {
            let t = inputs.get(name).ok_or_else(|| BackendError::MissingInput {
                name: name.clone(),
                expected: ty.to_string(),
            })?;
            if &t.tensor_type() != ty {
                return Err(BackendError::InputMismatch {
                    name: name.clone(),
                    expected: ty.to_string(),
                    got: t.tensor_type().to_string(),
                });
            }
        }
        let used = self.model.inputs();
        inputs.retain(|n, _| used.iter().any(|(u, _)| u == n));
        self.model.run(&inputs)
    }
}

/// The file a code address lies in (from `/proc/self/maps`): where a shared library was
/// loaded from, to find its `.weights` file.
pub fn image_path_of(addr: usize) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let range = parts.next()?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?);
        if (lo..hi).contains(&addr) {
            let path = parts.nth(4)?;
            return path.starts_with('/').then(|| PathBuf::from(path));
        }
    }
    None
}

/// The panic message of a caught panic.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

// ---- the C API ---------------------------------------------------------------------------

/// The C declarations of the API below (the generic part of a generated model header).
pub const C_API_HEADER: &str = r#"#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (oar_tensor.dtype). */
typedef enum oar_dtype {
    OAR_DTYPE_F32 = 0,  /* float */
    OAR_DTYPE_F64 = 1,  /* double */
    OAR_DTYPE_F16 = 2,  /* IEEE binary16 bits (uint16_t) */
    OAR_DTYPE_BF16 = 3, /* bfloat16 bits (uint16_t) */
    OAR_DTYPE_I8 = 4,   /* int8_t */
    OAR_DTYPE_U8 = 5,   /* uint8_t */
    OAR_DTYPE_I32 = 6,  /* int32_t */
    OAR_DTYPE_I64 = 7,  /* int64_t */
    OAR_DTYPE_BOOL = 8  /* one byte, 0 or 1 */
} oar_dtype;

/* A dense, C-order (row-major) tensor.
 * - As an input: name (or NULL: the i-th input in graph order), dtype, rank, shape, data and
 *   byte_size are all read; they must match the model's input exactly.
 * - As an output: the CALLER allocates data (byte_size bytes: see oar_model_output_info);
 *   oar_model_run fills name, dtype, rank and shape (pointers owned by the model, valid until
 *   oar_model_destroy), writes the data and sets byte_size to the bytes written. */
typedef struct oar_tensor {
    const char* name;
    int32_t dtype;        /* an oar_dtype */
    int32_t rank;
    const int64_t* shape; /* rank sizes */
    void* data;
    size_t byte_size;
} oar_tensor;

/* A loaded model (opaque). oar_model_run may be called from several threads at once. */
typedef struct oar_model oar_model;

/* Load the model. weights_path: the safetensors weights file for a model compiled with
 * `--weights external` (NULL: look for "<this library's path>.weights"); for a model with
 * embedded weights NULL, or a file whose tensors replace the embedded ones.
 * Returns NULL on error and, if error is not NULL, sets *error to a message to release with
 * oar_string_free. */
oar_model* oar_model_create(const char* weights_path, char** error);

/* Release a model (NULL is fine). */
void oar_model_destroy(oar_model* model);

/* Number of inputs / outputs. */
size_t oar_model_num_inputs(const oar_model* model);
size_t oar_model_num_outputs(const oar_model* model);

/* Describe input / output i: fills name, dtype, rank, shape (owned by the model) and
 * byte_size; sets data to NULL. Returns 0, or -1 if i is out of range. */
int oar_model_input_info(const oar_model* model, size_t i, oar_tensor* info);
int oar_model_output_info(const oar_model* model, size_t i, oar_tensor* info);

/* Limit the threads one run uses (1: the calling thread only; 0: all cores). */
void oar_model_set_threads(oar_model* model, size_t threads);

/* Run the model. inputs: n_inputs tensors (every input once, any order when named).
 * outputs: n_outputs == oar_model_num_outputs(model) caller-allocated tensors in output order
 * (see oar_tensor). Returns 0 on success; on error returns -1 and, if error is not NULL, sets
 * *error to a message (naming the input or output at fault) to release with
 * oar_string_free. */
int oar_model_run(const oar_model* model, const oar_tensor* inputs, size_t n_inputs,
                  oar_tensor* outputs, size_t n_outputs, char** error);

/* Release an error message (NULL is fine). */
void oar_string_free(char* s);

/* "f32", "i64", ... for an oar_dtype ("?" if unknown; static storage). */
const char* oar_dtype_name(int32_t dtype);

#ifdef __cplusplus
}
#endif
"#;

/// A tensor crossing the C API (`oar_tensor` in [`C_API_HEADER`]).
#[repr(C)]
#[derive(Debug)]
pub struct OarTensor {
    /// Name (NUL-terminated) or NULL.
    pub name: *const c_char,
    /// An `oar_dtype` (index into [`DType::ALL`]).
    pub dtype: i32,
    /// Number of dims.
    pub rank: i32,
    /// `rank` sizes.
    pub shape: *const i64,
    /// The elements, C order.
    pub data: *mut c_void,
    /// Bytes at `data`.
    pub byte_size: usize,
}

/// The `oar_dtype` code of a dtype.
pub fn dtype_code(d: DType) -> i32 {
    DType::ALL.iter().position(|&x| x == d).expect("every dtype is in ALL") as i32
}

/// The dtype of an `oar_dtype` code.
pub fn dtype_of_code(c: i32) -> Option<DType> {
    usize::try_from(c).ok().and_then(|i| DType::ALL.get(i).copied())
}

/// One input or output as the C API describes it (C strings and shapes owned here).
struct Port {
    name: CString,
    ty: TensorType,
    shape: Vec<i64>,
}

impl Port {
    fn new(name: &str, ty: &TensorType) -> Port {
        Port {
            // Names with NUL bytes cannot reach C; replace them (graph names never have any).
            name: CString::new(name.replace('\0', "?")).expect("no NUL"),
            ty: ty.clone(),
            shape: static_shape(ty).iter().map(|&d| d as i64).collect(),
        }
    }

    fn bytes(&self) -> usize {
        static_shape(&self.ty).iter().product::<usize>() * self.ty.dtype.size_bytes()
    }

    fn describe(&self, t: &mut OarTensor) {
        t.name = self.name.as_ptr();
        t.dtype = dtype_code(self.ty.dtype);
        t.rank = self.shape.len() as i32;
        t.shape = self.shape.as_ptr();
        t.data = std::ptr::null_mut();
        t.byte_size = self.bytes();
    }
}

/// `oar_model` of the C API.
pub struct OarModel {
    aot: AotModel,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
}

/// Store `msg` in `*error` (if `error` is not NULL).
unsafe fn set_error(error: *mut *mut c_char, msg: &str) {
    if !error.is_null() {
        let c = CString::new(msg.replace('\0', "?")).expect("no NUL");
        unsafe { *error = c.into_raw() };
    }
}

/// Run `f`, turning a panic into an error message.
fn guard<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(format!("internal error (please report): {}", panic_message(&*p))),
    }
}

/// Panics inside the library are reported through error strings, not printed.
fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::panic::set_hook(Box::new(|_| {})));
}

/// Load an AOT model for the C API: called by the generated `oar_model_create` with the
/// library's blob and kernel table.
///
/// # Safety
/// `blob` points to `blob_len` bytes and `table` to `n_funcs` kernel functions (generated
/// with the blob); `weights_path` is NULL or a NUL-terminated string; `error` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_rt_model_create(
    blob: *const u8,
    blob_len: usize,
    table: *const KernelFn,
    n_funcs: usize,
    weights_path: *const c_char,
    error: *mut *mut c_char,
) -> *mut OarModel {
    quiet_panics();
    let r = guard(|| {
        let blob = unsafe { std::slice::from_raw_parts(blob, blob_len) };
        let table = if n_funcs == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(table, n_funcs) }
        };
        let path = if weights_path.is_null() {
            None
        } else {
            Some(path_from_c(unsafe { CStr::from_ptr(weights_path) }))
        };
        let (meta, _, _) = decode_aot_blob(blob)?;
        let path = match path {
            Some(p) => Some(p),
            None if meta.external_weights => {
                let lib = image_path_of(oar_rt_model_create as *const () as usize).ok_or_else(|| {
                    format!(
                        "model `{}` was compiled with external weights and the library's own path is unknown: \
                         pass the weights file to oar_model_create",
                        meta.name
                    )
                })?;
                let mut p = lib.into_os_string();
                p.push(".weights");
                Some(PathBuf::from(p))
            }
            None => None,
        };
        let aot = AotModel::load(blob, table, path.as_deref())?;
        let inputs = aot.meta.inputs.iter().map(|(n, t)| Port::new(n, t)).collect();
        let outputs = aot.outputs.iter().map(|(n, t)| Port::new(n, t)).collect();
        Ok(Box::into_raw(Box::new(OarModel { aot, inputs, outputs })))
    });
    match r {
        Ok(m) => {
            if !error.is_null() {
                unsafe { *error = std::ptr::null_mut() };
            }
            m
        }
        Err(e) => {
            unsafe { set_error(error, &e) };
            std::ptr::null_mut()
        }
    }
}

/// A C string as a path (Unix paths are bytes).
pub(crate) fn path_from_c(s: &CStr) -> PathBuf {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        PathBuf::from(std::ffi::OsStr::from_bytes(s.to_bytes()))
    }
    #[cfg(not(unix))]
    {
        PathBuf::from(s.to_string_lossy().into_owned())
    }
}

/// Release a model.
///
/// # Safety
/// `model` is NULL or came from `oar_model_create` and was not destroyed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_destroy(model: *mut OarModel) {
    if !model.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(model) })));
    }
}

/// Number of inputs.
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_num_inputs(model: *const OarModel) -> usize {
    unsafe { model.as_ref() }.map_or(0, |m| m.inputs.len())
}

/// Number of outputs.
///
/// # Safety
/// `model` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_num_outputs(model: *const OarModel) -> usize {
    unsafe { model.as_ref() }.map_or(0, |m| m.outputs.len())
}

unsafe fn port_info(ports: Option<&[Port]>, i: usize, info: *mut OarTensor) -> c_int {
    match (ports.and_then(|p| p.get(i)), unsafe { info.as_mut() }) {
        (Some(p), Some(t)) => {
            p.describe(t);
            0
        }
        _ => -1,
    }
}

/// Describe input `i`.
///
/// # Safety
/// `model` is NULL or a live model; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_input_info(model: *const OarModel, i: usize, info: *mut OarTensor) -> c_int {
    unsafe { port_info(model.as_ref().map(|m| &m.inputs[..]), i, info) }
}

/// Describe output `i`.
///
/// # Safety
/// `model` is NULL or a live model; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_output_info(model: *const OarModel, i: usize, info: *mut OarTensor) -> c_int {
    unsafe { port_info(model.as_ref().map(|m| &m.outputs[..]), i, info) }
}

/// Limit the threads one run uses (0: all cores).
///
/// # Safety
/// `model` is NULL or a live model not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_set_threads(model: *mut OarModel, threads: usize) {
    if let Some(m) = unsafe { model.as_mut() } {
        let n = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        m.aot.model.set_threads(n);
    }
}

/// Run the model (see `oar_model_run` in [`C_API_HEADER`]).
///
/// # Safety
/// `model` is a live model; `inputs`/`outputs` point to `n_inputs`/`n_outputs` tensors whose
/// pointers are valid as documented; `error` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_model_run(
    model: *const OarModel,
    inputs: *const OarTensor,
    n_inputs: usize,
    outputs: *mut OarTensor,
    n_outputs: usize,
    error: *mut *mut c_char,
) -> c_int {
    let r = guard(|| unsafe { run_c(model, inputs, n_inputs, outputs, n_outputs) });
    match r {
        Ok(()) => {
            if !error.is_null() {
                unsafe { *error = std::ptr::null_mut() };
            }
            0
        }
        Err(e) => {
            unsafe { set_error(error, &e) };
            -1
        }
    }
}

unsafe fn run_c(
    model: *const OarModel,
    inputs: *const OarTensor,
    n_inputs: usize,
    outputs: *mut OarTensor,
    n_outputs: usize,
) -> Result<(), String> {
    let m = unsafe { model.as_ref() }.ok_or("model is NULL")?;
    if n_outputs != m.outputs.len() {
        return Err(format!(
            "{n_outputs} output tensors given, the model has {} outputs",
            m.outputs.len()
        ));
    }
    if n_inputs > 0 && inputs.is_null() || n_outputs > 0 && outputs.is_null() {
        return Err("inputs or outputs is NULL".into());
    }
    let ins: &[OarTensor] = if n_inputs == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(inputs, n_inputs) }
    };
    let mut feeds = BTreeMap::new();
    for (i, t) in ins.iter().enumerate() {
        let name = if t.name.is_null() {
            m.inputs
                .get(i)
                .ok_or_else(|| format!("input {i} has no name and the model has only {} inputs", m.inputs.len()))?
                .name
                .to_string_lossy()
                .into_owned()
        } else {
            unsafe { CStr::from_ptr(t.name) }.to_string_lossy().into_owned()
        };
        let what = format!("input `{name}`");
        let dtype = dtype_of_code(t.dtype).ok_or_else(|| format!("{what}: unknown dtype code {}", t.dtype))?;
        let rank = usize::try_from(t.rank).map_err(|_| format!("{what}: negative rank {}", t.rank))?;
        if rank > 0 && t.shape.is_null() {
            return Err(format!("{what}: shape is NULL"));
        }
        let dims: &[i64] = if rank == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(t.shape, rank) }
        };
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("{what}: negative size {d} in its shape")))
            .collect::<Result<Vec<usize>, String>>()?;
        let n = oar_ir::tensor_data::checked_byte_len(dtype, &shape).map_err(|e| format!("{what}: {e}"))?;
        let given = TensorType::of(dtype, &shape);
        // Type errors (naming the expected type) before byte counts.
        if let Some(p) = m.inputs.iter().find(|p| p.name.to_bytes() == name.as_bytes())
            && p.ty != given
        {
            return Err(BackendError::InputMismatch {
                name,
                expected: p.ty.to_string(),
                got: given.to_string(),
            }
            .to_string());
        }
        if t.byte_size != n {
            return Err(format!("{what}: byte_size is {}, {given} takes {n} bytes", t.byte_size));
        }
        if n > 0 && t.data.is_null() {
            return Err(format!("{what}: data is NULL"));
        }
        let bytes = if n == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(t.data as *const u8, n) }.to_vec()
        };
        let td = TensorData::from_bytes(dtype, shape, bytes).map_err(|e| format!("{what}: {e}"))?;
        if feeds.insert(name.clone(), td).is_some() {
            return Err(format!("{what} is given twice"));
        }
    }
    let outs = unsafe { std::slice::from_raw_parts_mut(outputs, n_outputs) };
    for (o, p) in outs.iter().zip(&m.outputs) {
        let need = p.bytes();
        if need > 0 && o.data.is_null() {
            return Err(format!("output `{}`: data is NULL", p.name.to_string_lossy()));
        }
        if o.byte_size < need {
            return Err(format!(
                "output `{}`: byte_size is {}, {} takes {need} bytes",
                p.name.to_string_lossy(),
                o.byte_size,
                p.ty
            ));
        }
    }
    let results = m.aot.run(feeds).map_err(|e| e.to_string())?;
    for ((o, p), (_, t)) in outs.iter_mut().zip(&m.outputs).zip(&results) {
        let n = t.bytes().len();
        if n != p.bytes() {
            return Err(format!(
                "output `{}`: the model produced {}",
                p.name.to_string_lossy(),
                t.tensor_type()
            ));
        }
        if n > 0 {
            unsafe { std::ptr::copy_nonoverlapping(t.bytes().as_ptr(), o.data as *mut u8, n) };
        }
        let data = o.data;
        p.describe(o);
        o.data = data;
        o.byte_size = n;
    }
    Ok(())
}

/// Release a string returned through an `error` argument.
///
/// # Safety
/// `s` is NULL or a string from this library, not yet released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn oar_string_free(s: *mut c_char) {
    if !s.is_null() {
        drop(unsafe { CString::from_raw(s) });
    }
}

/// The name of an `oar_dtype` code.
#[unsafe(no_mangle)]
pub extern "C" fn oar_dtype_name(dtype: i32) -> *const c_char {
    const NAMES: [&CStr; 9] = [c"f32", c"f64", c"f16", c"bf16", c"i8", c"u8", c"i32", c"i64", c"bool"];
    debug_assert!(
        DType::ALL
            .iter()
            .zip(NAMES)
            .all(|(d, n)| d.name() == n.to_str().unwrap())
    );
    usize::try_from(dtype)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"?".as_ptr(), |n| n.as_ptr())
}

/// Symbols of the C API, which a shared library must export (the linker keeps them).
pub const C_API_SYMBOLS: &[&str] = &[
    "oar_model_create",
    "oar_model_destroy",
    "oar_model_num_inputs",
    "oar_model_num_outputs",
    "oar_model_input_info",
    "oar_model_output_info",
    "oar_model_set_threads",
    "oar_model_run",
    "oar_string_free",
    "oar_dtype_name",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_match_the_header() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(dtype_code(*d), i as i32);
            assert_eq!(dtype_of_code(i as i32), Some(*d));
            let name = unsafe { CStr::from_ptr(oar_dtype_name(i as i32)) };
            assert_eq!(name.to_str().unwrap(), d.name());
            let upper = format!("OAR_DTYPE_{} = {i}", d.name().to_uppercase());
            assert!(C_API_HEADER.contains(&upper), "{upper}");
        }
        assert_eq!(dtype_of_code(9), None);
        assert_eq!(dtype_of_code(-1), None);
    }
}
