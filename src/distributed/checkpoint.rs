//! Sharded checkpoints: every rank writes its own part of a model (tensor-parallel slices,
//! pipeline stages, replicas), and loading assembles the whole tensors and cuts them again for
//! the loading model's layout — a checkpoint saved at one topology loads at another (saved at
//! mp 2, loaded at mp 1 or mp 4; saved with 2 stages, loaded into 1).
//!
//! Layout of a checkpoint directory `DIR`: the checkpoint is `DIR/current/`, holding
//! - `rank-NNNNN.safetensors` per world rank: the rank's `state_dict`, and for every tensor
//!   split over a tensor-parallel group an `@split/NAME` entry `[axis, part, parts]`;
//! - `sharded.txt`: `ranks N`, written by rank 0 once every rank's file is in place.
//!
//! A save writes `DIR/next/` and then rank 0 swaps it in (`current` → `old`, `next` →
//! `current`, `old` removed). A save that dies on the way leaves the previous checkpoint
//! whole: in `current`, or in `old` between the two renames, where loading finds it.
//!
//! Which tensors are split, and how, is recorded when a tensor-parallel layer makes its slice
//! ([`split_of`]).

use super::ProcessGroup;
use crate::error::{Error, Result};
use crate::nn::Layer;
use crate::tensor::Tensor;
use oar_ir::TensorData;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// How a tensor is split over a tensor-parallel group: part `part` of `parts` equal slices
/// along `axis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// The axis cut.
    pub axis: usize,
    /// This slice's index.
    pub part: usize,
    /// The number of slices.
    pub parts: usize,
}

const SPLIT_PREFIX: &str = "@split/";
const MANIFEST: &str = "sharded.txt";

fn splits() -> &'static Mutex<HashMap<u64, Split>> {
    static S: std::sync::OnceLock<Mutex<HashMap<u64, Split>>> = std::sync::OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Record that `t` is a slice (tensor-parallel layers call it for their parameters).
pub(crate) fn mark(t: &Tensor, split: Split) {
    splits().lock().unwrap_or_else(|e| e.into_inner()).insert(t.id(), split);
}

/// How `t` is split, if it is a tensor-parallel layer's slice.
pub fn split_of(t: &Tensor) -> Option<Split> {
    splits().lock().unwrap_or_else(|e| e.into_inner()).get(&t.id()).copied()
}

fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank:05}.safetensors"))
}

fn io_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Save `layer` (this rank's part of a model) into the checkpoint directory `dir`; every rank
/// of `world` calls it, and it returns when every rank's part is written.
pub fn save_sharded(layer: &dyn Layer, dir: impl AsRef<Path>, world: &ProcessGroup) -> Result<()> {
    let dir = dir.as_ref();
    let next = dir.join("next");
    if world.rank() == 0 {
        // What an earlier save that died left behind.
        if next.exists() {
            std::fs::remove_dir_all(&next).map_err(|e| io_err(&next, e))?;
        }
        std::fs::create_dir_all(&next).map_err(|e| io_err(&next, e))?;
    }
    world.barrier()?;
    let mut state: BTreeMap<String, TensorData> = BTreeMap::new();
    for (name, t) in layer.state_dict() {
        if let Some(s) = split_of(&t) {
            let v = vec![s.axis as i64, s.part as i64, s.parts as i64];
            let meta = TensorData::from_vec(vec![3], v).map_err(|e| Error::invalid("save_sharded", e.to_string()))?;
            state.insert(format!("{SPLIT_PREFIX}{name}"), meta);
        }
        state.insert(name, t.try_data()?);
    }
    crate::serialization::save(&state, rank_file(&next, world.rank()))?;
    world.barrier()?;
    if world.rank() == 0 {
        let manifest = next.join(MANIFEST);
        let text = format!("ranks {}\n", world.size());
        oar_ir::file::write_atomically(&manifest, text.as_bytes()).map_err(|e| io_err(&manifest, e))?;
        let (current, old) = (dir.join("current"), dir.join("old"));
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| io_err(&old, e))?;
        }
        if current.exists() {
            std::fs::rename(&current, &old).map_err(|e| io_err(&current, e))?;
        }
        std::fs::rename(&next, &current).map_err(|e| io_err(&next, e))?;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| io_err(&old, e))?;
        }
    }
    world.barrier()
}

/// One tensor as the checkpoint's files hold it: its pieces by part (one whole piece when it
/// was not split).
#[derive(Default)]
struct Pieces {
    axis: Option<usize>,
    parts: usize,
    by_part: BTreeMap<usize, TensorData>,
}

/// Read every rank's file of the checkpoint in `dir` and assemble each tensor whole.
fn read_whole(root: &Path) -> Result<BTreeMap<String, TensorData>> {
    // `old` holds the checkpoint only while a save swaps `next` in.
    let current = root.join("current");
    let dir = if current.join(MANIFEST).exists() || !root.join("old").join(MANIFEST).exists() {
        current
    } else {
        root.join("old")
    };
    let dir = dir.as_path();
    let manifest = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&manifest).map_err(|e| {
        io_err(
            &manifest,
            format!("{e} (not a sharded checkpoint, or its save did not finish)"),
        )
    })?;
    let ranks = text
        .trim()
        .strip_prefix("ranks ")
        .and_then(|n| n.trim().parse::<usize>().ok())
        .filter(|&n| n > 0 && n <= 1 << 20)
        .ok_or_else(|| io_err(&manifest, format!("expected `ranks N`, found {:?}", text.trim())))?;
    let mut all: BTreeMap<String, Pieces> = BTreeMap::new();
    for r in 0..ranks {
        let path = rank_file(dir, r);
        let state = crate::serialization::load(&path)?;
        for (name, value) in &state {
            if name.starts_with(SPLIT_PREFIX) {
                continue;
            }
            let entry = all.entry(name.clone()).or_default();
            match state.get(&format!("{SPLIT_PREFIX}{name}")) {
                Some(meta) => {
                    let m = meta.to_vec::<i64>().map_err(|e| io_err(&path, e))?;
                    let [axis, part, parts] = m[..] else {
                        return Err(io_err(&path, format!("bad split entry for `{name}`: {m:?}")));
                    };
                    let (axis, part, parts) = (axis as usize, part as usize, parts as usize);
                    if part >= parts
                        || entry.axis.is_some_and(|a| a != axis)
                        || (entry.parts != 0 && entry.parts != parts)
                    {
                        return Err(io_err(
                            &path,
                            format!("`{name}` is split inconsistently across the ranks' files"),
                        ));
                    }
                    entry.axis = Some(axis);
                    entry.parts = parts;
                    // Replicas (data-parallel, other stages' copies) hold the same part.
                    entry.by_part.entry(part).or_insert_with(|| value.clone());
                }
                None => {
                    entry.by_part.entry(0).or_insert_with(|| value.clone());
                }
            }
        }
    }
    let mut whole = BTreeMap::new();
    for (name, p) in all {
        let value = match p.axis {
            None => p.by_part.into_values().next(),
            Some(axis) => {
                if p.by_part.len() != p.parts {
                    return Err(io_err(
                        dir,
                        format!(
                            "`{name}`: parts {:?} of {} were saved",
                            p.by_part.keys().collect::<Vec<_>>(),
                            p.parts
                        ),
                    ));
                }
                let parts: Vec<Tensor> = p.by_part.into_values().map(Tensor::from_data).collect();
                let refs: Vec<&Tensor> = parts.iter().collect();
                Some(crate::tensor::concat(&refs, axis as i64)?.try_data()?)
            }
        };
        if let Some(v) = value {
            whole.insert(name, v);
        }
    }
    Ok(whole)
}

/// Load the checkpoint in `dir` into `layer` (this rank's part of a model, in any topology):
/// each tensor is assembled whole from the saving ranks' parts, then cut as `layer`'s own
/// tensor is split (or kept whole). Every entry must exist with matching sizes, else nothing
/// changes and the error names the entries.
pub fn load_sharded(layer: &dyn Layer, dir: impl AsRef<Path>) -> Result<()> {
    let dir = dir.as_ref();
    let whole = read_whole(dir)?;
    let mut state = BTreeMap::new();
    let mut problems = Vec::new();
    for (name, t) in layer.state_dict() {
        let Some(full) = whole.get(&name) else {
            problems.push(format!("missing `{name}`"));
            continue;
        };
        let value = match split_of(&t) {
            None => full.clone(),
            Some(s) => {
                let n = full.shape().get(s.axis).copied().unwrap_or(0);
                if s.axis >= full.shape().len() || !n.is_multiple_of(s.parts) {
                    problems.push(format!(
                        "`{name}` {:?} does not split into {} parts along axis {}",
                        full.shape(),
                        s.parts,
                        s.axis
                    ));
                    continue;
                }
                let k = (n / s.parts) as i64;
                let part = Tensor::from_data(full.clone()).slice(
                    s.axis as i64,
                    s.part as i64 * k,
                    (s.part as i64 + 1) * k,
                    1,
                )?;
                part.try_data()?
            }
        };
        state.insert(name, value);
    }
    if !problems.is_empty() {
        return Err(io_err(dir, problems.join("; ")));
    }
    layer.set_state_dict(&state).map_err(|e| io_err(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::Linear;

    fn weights(l: &Linear) -> Vec<f32> {
        l.weight().to_vec::<f32>().unwrap()
    }

    #[test]
    fn a_save_that_died_leaves_the_previous_checkpoint_loadable() {
        let world = crate::distributed::init().unwrap();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        let first = Linear::new(3, 2).unwrap();
        save_sharded(&first, dir, &world).unwrap();
        // A later save died after writing part of `next`: loading ignores it.
        std::fs::create_dir_all(dir.join("next")).unwrap();
        std::fs::write(dir.join("next/rank-00000.safetensors"), b"torn").unwrap();
        let other = Linear::new(3, 2).unwrap();
        load_sharded(&other, dir).unwrap();
        assert_eq!(weights(&other), weights(&first));
        // It died between the two renames: the checkpoint is in `old`.
        std::fs::rename(dir.join("current"), dir.join("old")).unwrap();
        let again = Linear::new(3, 2).unwrap();
        load_sharded(&again, dir).unwrap();
        assert_eq!(weights(&again), weights(&first));
        // The next save cleans up and replaces it.
        let second = Linear::new(3, 2).unwrap();
        save_sharded(&second, dir, &world).unwrap();
        assert!(!dir.join("next").exists() && !dir.join("old").exists());
        load_sharded(&again, dir).unwrap();
        assert_eq!(weights(&again), weights(&second));
        // Not a checkpoint: the error names the manifest.
        let e = load_sharded(&again, root.path().join("nothing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("sharded.txt") && e.contains("did not finish"), "{e}");
    }
}
