//! DataLoader: batch shapes and counts, drop_last, shuffling (permutation, seeded, per-epoch),
//! identical batches for any worker count, collate functions and error paths.

use oar::io::{DataLoader, Dataset, Subset, TensorDataset};
use oar::{DType, Error, Result, Tensor};
use std::collections::HashSet;
use std::sync::Mutex;
use std::thread::ThreadId;

/// `x` row `i` is `[3i, 3i + 1, 3i + 2]` (f32), `y[i] = i` (i64).
fn xy(n: usize) -> TensorDataset {
    let x: Vec<f32> = (0..n * 3).map(|v| v as f32).collect();
    let y: Vec<i64> = (0..n as i64).collect();
    TensorDataset::new(vec![
        Tensor::from_vec(x, &[n, 3]).unwrap(),
        Tensor::from_vec(y, &[n]).unwrap(),
    ])
    .unwrap()
}

/// The label column of every batch of one epoch.
fn epoch_labels<D: Dataset<Item = Vec<Tensor>> + 'static>(loader: &DataLoader<D, Vec<Tensor>>) -> Vec<Vec<i64>> {
    loader.iter().map(|b| b.unwrap()[1].to_vec::<i64>().unwrap()).collect()
}

#[test]
fn batches_keep_the_last_partial_batch() {
    let loader = DataLoader::new(xy(10)).batch_size(4);
    assert_eq!(loader.len(), 3);
    let batches: Vec<Vec<Tensor>> = loader.iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 3);
    let shapes: Vec<Vec<usize>> = batches.iter().map(|b| b[0].shape()).collect();
    assert_eq!(shapes, vec![vec![4, 3], vec![4, 3], vec![2, 3]]);
    assert_eq!(batches[2][1].shape(), vec![2]);
    assert_eq!(batches[1][1].to_vec::<i64>().unwrap(), vec![4, 5, 6, 7]);
    // Row 9 of x is [27, 28, 29]; it is the second row of the last batch.
    assert_eq!(
        batches[2][0].to_vec::<f32>().unwrap(),
        vec![24.0, 25.0, 26.0, 27.0, 28.0, 29.0]
    );
}

#[test]
fn drop_last_drops_only_a_partial_batch() {
    let loader = DataLoader::new(xy(10)).batch_size(4).drop_last(true);
    assert_eq!(loader.len(), 2);
    assert_eq!(epoch_labels(&loader), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    let exact = DataLoader::new(xy(8)).batch_size(4).drop_last(true);
    assert_eq!(exact.iter().count(), 2);
    let too_few = DataLoader::new(xy(3)).batch_size(4).drop_last(true);
    assert_eq!(too_few.iter().count(), 0);
    assert!(too_few.is_empty());
}

#[test]
fn tuple_samples_collate_into_a_tuple_of_batches() {
    let pairs = oar::io::datasets::Digits::new(oar::io::datasets::Split::Test).unwrap();
    let loader = DataLoader::new(pairs).batch_size(32);
    let (images, labels) = loader.iter().next().unwrap().unwrap();
    assert_eq!(images.shape(), vec![32, 1, 8, 8]);
    assert_eq!(images.dtype(), DType::F32);
    assert_eq!(labels.shape(), vec![32]);
    assert_eq!(labels.dtype(), DType::I64);
    assert_eq!(
        loader.iter().last().unwrap().unwrap().0.shape(),
        vec![360 - 11 * 32, 1, 8, 8]
    );
}

#[test]
fn shuffle_is_a_seeded_permutation_that_changes_every_epoch() {
    let loader = DataLoader::new(xy(50)).batch_size(8).shuffle(true).seed(42);
    let e1: Vec<i64> = epoch_labels(&loader).concat();
    let e2: Vec<i64> = epoch_labels(&loader).concat();
    for e in [&e1, &e2] {
        let mut sorted = e.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..50).collect::<Vec<i64>>(),
            "an epoch visits every sample once"
        );
    }
    assert_ne!(e1, (0..50).collect::<Vec<i64>>(), "shuffled order is not the identity");
    assert_ne!(e1, e2, "each epoch has a new order");

    let again = DataLoader::new(xy(50)).batch_size(8).shuffle(true).seed(42);
    assert_eq!(epoch_labels(&again).concat(), e1, "same seed, same first epoch");
    assert_eq!(epoch_labels(&again).concat(), e2, "same seed, same second epoch");
    let other = DataLoader::new(xy(50)).batch_size(8).shuffle(true).seed(43);
    assert_ne!(epoch_labels(&other).concat(), e1);
}

#[test]
fn shuffle_without_a_seed_follows_the_global_generator() {
    let loader = DataLoader::new(xy(40)).batch_size(40).shuffle(true);
    oar::seed(7);
    let a = epoch_labels(&loader);
    oar::seed(7);
    let b = epoch_labels(&loader);
    assert_eq!(a, b);
    oar::seed(8);
    assert_ne!(epoch_labels(&loader), a);
}

#[test]
fn worker_counts_give_identical_batches() {
    let run = |k: usize| -> Vec<(Vec<f32>, Vec<i64>)> {
        let loader = DataLoader::new(xy(103))
            .batch_size(7)
            .shuffle(true)
            .seed(5)
            .num_workers(k);
        loader
            .iter()
            .map(|b| {
                let b = b.unwrap();
                (b[0].to_vec::<f32>().unwrap(), b[1].to_vec::<i64>().unwrap())
            })
            .collect()
    };
    let reference = run(0);
    assert_eq!(reference.len(), 15);
    assert_eq!(run(1), reference);
    assert_eq!(run(3), reference);
    assert_eq!(run(20), reference, "more workers than batches");
}

/// A sample is its index and a random draw (as a random transform would make).
struct Noisy;

impl Dataset for Noisy {
    type Item = Tensor;
    fn len(&self) -> usize {
        40
    }
    fn get(&self, index: usize) -> Result<Tensor> {
        let draw = oar::rand(&[2], DType::F32)?.to_vec::<f32>()?;
        Tensor::from_vec(vec![index as f32, draw[0], draw[1]], &[3])
    }
}

/// A seeded loader pins the random draws made while a sample loads: the same augmented batches
/// for 0, 1 and 3 workers, other draws in the next epoch and for another seed, the same epoch
/// again after `skip_to_epoch` (a resumed run), and the global generator is left alone.
#[test]
fn seeded_loaders_pin_per_sample_randomness_across_workers_and_epochs() {
    let epochs = |k: usize, seed: u64, skip: usize| -> Vec<Vec<f32>> {
        let loader = DataLoader::new(Noisy)
            .batch_size(6)
            .shuffle(true)
            .seed(seed)
            .num_workers(k);
        loader.skip_to_epoch(skip);
        (0..2)
            .map(|_| {
                loader
                    .iter()
                    .flat_map(|b| b.unwrap().to_vec::<f32>().unwrap())
                    .collect()
            })
            .collect()
    };
    oar::seed(1);
    let before = oar::rand(&[4], DType::F32).unwrap().to_vec::<f32>().unwrap();
    oar::seed(1);
    let reference = epochs(0, 7, 0);
    let after = oar::rand(&[4], DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(before, after, "the global generator was drawn from");
    assert_eq!(epochs(1, 7, 0), reference);
    assert_eq!(epochs(3, 7, 0), reference);
    assert_ne!(reference[0], reference[1], "a new epoch draws anew");
    // Epoch 1's samples come with the same draws as in the run that never stopped.
    assert_eq!(epochs(2, 7, 1)[0], reference[1]);
    assert_ne!(epochs(0, 8, 0)[0], reference[0]);
    // Within an epoch, samples draw differently.
    let draws: HashSet<u32> = reference[0].chunks(3).map(|s| s[1].to_bits()).collect();
    assert_eq!(draws.len(), 40);
}

/// Records the threads that fetched samples.
struct Spy {
    threads: Mutex<HashSet<ThreadId>>,
}

impl Dataset for Spy {
    type Item = Tensor;
    fn len(&self) -> usize {
        64
    }
    fn get(&self, index: usize) -> Result<Tensor> {
        self.threads.lock().unwrap().insert(std::thread::current().id());
        Ok(Tensor::scalar(index as i64))
    }
}

#[test]
fn workers_load_on_other_threads_and_in_order() {
    let loader = DataLoader::new(Spy {
        threads: Mutex::new(HashSet::new()),
    })
    .batch_size(4)
    .num_workers(3);
    let all: Vec<i64> = loader
        .iter()
        .flat_map(|b| b.unwrap().to_vec::<i64>().unwrap())
        .collect();
    assert_eq!(all, (0..64).collect::<Vec<i64>>());
    let threads = loader.dataset().threads.lock().unwrap();
    assert!(
        !threads.contains(&std::thread::current().id()),
        "the consumer thread loaded nothing"
    );
    assert_eq!(threads.len(), 3);
}

/// Fails on one index, panics on another.
struct Faulty;

impl Dataset for Faulty {
    type Item = Tensor;
    fn len(&self) -> usize {
        12
    }
    fn get(&self, index: usize) -> Result<Tensor> {
        match index {
            5 => Err(Error::invalid("Faulty", "sample 5 is broken")),
            9 => panic!("sample 9 panics"),
            _ => Ok(Tensor::scalar(index as f32)),
        }
    }
}

#[test]
fn a_failing_sample_fails_its_batch_only() {
    for k in [0, 2] {
        let loader = DataLoader::new(Faulty).batch_size(4).num_workers(k);
        let mut it = loader.iter();
        assert!(it.next().unwrap().is_ok());
        let err = it.next().unwrap().unwrap_err().to_string();
        assert!(err.contains("sample 5 is broken"), "{err}");
        if k > 0 {
            // Batch 2 holds sample 9: its worker panics, which ends the epoch with an error, not a hang.
            let err = it.next().unwrap().unwrap_err().to_string();
            assert!(err.contains("worker 0") && err.contains("batch 2"), "{err}");
            assert!(it.next().is_none());
        }
    }
}

#[test]
fn dropping_an_epoch_early_stops_the_workers() {
    let loader = DataLoader::new(xy(1000))
        .batch_size(2)
        .num_workers(3)
        .prefetch_factor(1);
    let first = loader.iter().next().unwrap().unwrap();
    assert_eq!(first[1].to_vec::<i64>().unwrap(), vec![0, 1]);
    // Reaching here means dropping the iterator joined workers blocked on full channels.
    assert_eq!(loader.iter().count(), 500);
}

#[test]
fn custom_collate_fn() {
    let loader = DataLoader::new(xy(10))
        .batch_size(3)
        .collate_fn(|samples: Vec<Vec<Tensor>>| Ok(samples.iter().map(|s| s[1].item().unwrap() as i64).sum::<i64>()));
    let sums: Vec<i64> = loader.iter().map(|b| b.unwrap()).collect();
    assert_eq!(sums, vec![3, 12, 21, 9]);
    let direct = DataLoader::with_collate(xy(4), |s: Vec<Vec<Tensor>>| Ok(s.len())).batch_size(3);
    assert_eq!(direct.iter().map(|b| b.unwrap()).collect::<Vec<_>>(), vec![3, 1]);
}

#[test]
fn bad_configuration_and_samples_are_errors() {
    let zero = DataLoader::new(xy(4)).batch_size(0);
    let mut it = zero.iter();
    assert!(it.next().unwrap().unwrap_err().to_string().contains("batch_size"));
    assert!(it.next().is_none());

    let x = Tensor::from_vec(vec![0f32; 6], &[3, 2]).unwrap();
    let y = Tensor::from_vec(vec![0i64; 4], &[4]).unwrap();
    let err = TensorDataset::new(vec![x, y]).err().unwrap().to_string();
    assert!(err.contains("tensor 1") && err.contains("[4]"), "{err}");
    assert!(xy(3).get(3).is_err());

    let ragged = DataLoader::with_collate(xy(2), |s: Vec<Vec<Tensor>>| {
        let mut tensors: Vec<Tensor> = s.into_iter().map(|mut v| v.remove(0)).collect();
        tensors[1] = Tensor::from_vec(vec![1f32, 2.0], &[2]).unwrap();
        <Tensor as oar::io::Collate>::collate(tensors)
    })
    .batch_size(2);
    let err = ragged.iter().next().unwrap().unwrap_err().to_string();
    assert!(err.contains("sample 1"), "{err}");
}

#[test]
fn subset_selects_and_checks_indices() {
    let sub = Subset::new(xy(10), vec![7, 2, 9]).unwrap();
    let loader = DataLoader::new(sub).batch_size(3);
    assert_eq!(epoch_labels(&loader), vec![vec![7, 2, 9]]);
    assert!(Subset::new(xy(10), vec![10]).is_err());
}

#[test]
fn random_split_partitions_reproducibly() {
    let parts = oar::io::random_split(xy(20), &[12, 5, 3], Some(9)).unwrap();
    assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![12, 5, 3]);
    let mut all: Vec<usize> = parts.iter().flat_map(|p| p.indices().to_vec()).collect();
    let first = all.clone();
    all.sort();
    assert_eq!(all, (0..20).collect::<Vec<_>>());
    assert_ne!(first, (0..20).collect::<Vec<_>>());
    // Sample 0 of part 1 is row indices()[0] of the whole dataset.
    let row = parts[1].indices()[0] as i64;
    assert_eq!(parts[1].get(0).unwrap()[1].item().unwrap() as i64, row);
    let again = oar::io::random_split(xy(20), &[12, 5, 3], Some(9)).unwrap();
    assert_eq!(again[2].indices(), parts[2].indices());
    let err = oar::io::random_split(xy(20), &[12, 5], Some(9))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("[12, 5]") && err.contains("20"), "{err}");
}
