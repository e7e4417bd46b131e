//! MNIST (and Fashion-MNIST) in the IDX format: `magic = [0, 0, 0x08 (u8), ndim]`, then `ndim`
//! big-endian u32 dimensions, then the bytes. Images are `0x00000803`, labels `0x00000801`.

use super::files::{io_error, open, plain_or_gz, require_files};
use super::{Split, image_sample};
use crate::error::Result;
use crate::io::dataset::{Dataset, out_of_range};
use crate::tensor::Tensor;
use std::path::Path;

/// Read an IDX file of unsigned bytes (plain or gzip): its dimensions and its data.
///
/// The dimensions' product is checked for overflow and against the file's size before the data
/// is read, so a hostile header is an error, never a huge allocation.
pub fn read_idx_u8(path: impl AsRef<Path>) -> Result<(Vec<usize>, Vec<u8>)> {
    let path = path.as_ref();
    let mut file = open(path)?;
    let mut magic = [0u8; 4];
    file.read_header(path, &mut magic, "IDX magic number")?;
    if magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 {
        return Err(io_error(
            path,
            format!(
                "bad IDX magic number 0x{:08x}: expected 0x000008NN (unsigned bytes, NN dimensions)",
                u32::from_be_bytes(magic)
            ),
        ));
    }
    let ndim = magic[3] as usize;
    let mut raw = vec![0u8; 4 * ndim];
    file.read_header(path, &mut raw, "IDX dimensions")?;
    let dims: Vec<usize> = raw
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let count = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| io_error(path, format!("IDX dimensions {dims:?} overflow")))?;
    let data = file.read_payload(path, count, &format!("IDX data for dimensions {dims:?}"))?;
    Ok((dims, data))
}

/// Read an IDX file and require a given number of dimensions (3 for images, 1 for labels).
fn read_idx_rank(path: &Path, ndim: usize, what: &str) -> Result<(Vec<usize>, Vec<u8>)> {
    let (dims, data) = read_idx_u8(path)?;
    if dims.len() != ndim {
        return Err(io_error(
            path,
            format!(
                "IDX magic 0x{:08x} holds {} dimensions; MNIST {what} need magic 0x{:08x}",
                0x800 + dims.len(),
                dims.len(),
                0x800 + ndim
            ),
        ));
    }
    Ok((dims, data))
}

/// MNIST-format images and labels: samples are f32 `[1, rows, cols]` in `[0, 1]` (pixel / 255)
/// and i64 scalar labels.
pub struct Mnist {
    images: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl Mnist {
    /// Read an images file (magic `0x00000803`) and a labels file (`0x00000801`); `.gz` is accepted.
    pub fn from_idx(images_path: impl AsRef<Path>, labels_path: impl AsRef<Path>) -> Result<Mnist> {
        let (images_path, labels_path) = (images_path.as_ref(), labels_path.as_ref());
        let (dims, images) = read_idx_rank(images_path, 3, "images")?;
        let (ldims, labels) = read_idx_rank(labels_path, 1, "labels")?;
        if ldims[0] != dims[0] {
            return Err(io_error(
                labels_path,
                format!(
                    "{} labels, but {} holds {} images",
                    ldims[0],
                    images_path.display(),
                    dims[0]
                ),
            ));
        }
        Ok(Mnist {
            images,
            labels,
            rows: dims[1],
            cols: dims[2],
        })
    }

    /// Load a split from a directory with the standard names (`train-images-idx3-ubyte[.gz]`, ...);
    /// missing files are an error saying which to put there.
    pub fn from_dir(dir: impl AsRef<Path>, split: Split) -> Result<Mnist> {
        Mnist::from_named_dir(dir.as_ref(), split, "MNIST", "http://yann.lecun.com/exdb/mnist/")
    }

    /// [`Mnist::from_dir`] for an IDX data set called `dataset`, published at `source`.
    pub(super) fn from_named_dir(dir: &Path, split: Split, dataset: &str, source: &str) -> Result<Mnist> {
        let prefix = match split {
            Split::Train => "train",
            Split::Test => "t10k",
        };
        let names = [
            format!("{prefix}-images-idx3-ubyte"),
            format!("{prefix}-labels-idx1-ubyte"),
        ];
        require_files(dataset, dir, &names, source)?;
        Mnist::from_idx(plain_or_gz(dir, &names[0]), plain_or_gz(dir, &names[1]))
    }

    /// Image height and width.
    pub fn image_size(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The raw labels.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }
}

impl Dataset for Mnist {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        let label = *self
            .labels
            .get(index)
            .ok_or_else(|| out_of_range("Mnist", index, self.labels.len()))?;
        let size = self.rows * self.cols;
        image_sample(
            &self.images[index * size..(index + 1) * size],
            &[1, self.rows, self.cols],
            255.0,
            label as i64,
        )
    }
}

/// Fashion-MNIST (Zalando): the MNIST format and file names, 28×28 gray images of clothing in
/// ten classes ([`FashionMnist::CLASSES`]).
pub struct FashionMnist(Mnist);

impl FashionMnist {
    /// Load a split from a directory with the standard names (`train-images-idx3-ubyte[.gz]`,
    /// `t10k-labels-idx1-ubyte[.gz]`, ...); missing files are an error saying which to put there.
    pub fn from_dir(dir: impl AsRef<Path>, split: Split) -> Result<FashionMnist> {
        Mnist::from_named_dir(
            dir.as_ref(),
            split,
            "Fashion-MNIST",
            "https://github.com/zalandoresearch/fashion-mnist",
        )
        .map(FashionMnist)
    }

    /// The class names, indexed by label.
    pub const CLASSES: [&'static str; 10] = [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ];

    /// The raw labels.
    pub fn labels(&self) -> &[u8] {
        self.0.labels()
    }
}

impl Dataset for FashionMnist {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        self.0.get(index)
    }
}
