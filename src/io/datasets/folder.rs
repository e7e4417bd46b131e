//! `ImageFolder`: images sorted into one directory per class (`root/cat/001.png`,
//! `root/dog/xyz.jpg`), as torchvision's `ImageFolder` and Paddle's `DatasetFolder`.

use super::files::io_error;
use crate::error::Result;
use crate::io::dataset::{Dataset, out_of_range};
use crate::tensor::Tensor;
use crate::vision::image::read_image;
use crate::vision::transforms::{ToTensor, Transform};
use std::path::{Path, PathBuf};

/// File extensions read as images (case-insensitive).
const EXTENSIONS: [&str; 3] = ["png", "jpg", "jpeg"];

/// Images under `root/<class>/`: classes are the subdirectory names in sorted order (label =
/// position), samples the PNG and JPEG files in each, sorted by path (nested directories
/// included). A sample is the decoded image as f32 `[C, H, W]` in `[0, 1]` ([`ToTensor`]),
/// then the optional transform, and the i64 label. Files are read when a sample is fetched, so
/// an unreadable image is an error naming it at that point.
pub struct ImageFolder {
    classes: Vec<String>,
    samples: Vec<(PathBuf, usize)>,
    transform: Option<Box<dyn Transform>>,
}

impl ImageFolder {
    /// Index `root`; an unreadable root, one without class directories or one without images
    /// is an error naming it.
    pub fn new(root: impl AsRef<Path>) -> Result<ImageFolder> {
        let root = root.as_ref();
        let mut classes: Vec<String> = read_dir(root)?
            .into_iter()
            .filter(|p| p.is_dir())
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        classes.sort();
        if classes.is_empty() {
            return Err(io_error(
                root,
                "no class directories: put each class's images in root/<class name>/",
            ));
        }
        let mut samples = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut files = Vec::new();
            collect_images(&root.join(class), &mut files, 0)?;
            files.sort();
            samples.extend(files.into_iter().map(|f| (f, label)));
        }
        if samples.is_empty() {
            return Err(io_error(
                root,
                format!("no {} images under any class directory", EXTENSIONS.join("/")),
            ));
        }
        Ok(ImageFolder {
            classes,
            samples,
            transform: None,
        })
    }

    /// Apply `t` to every image after [`ToTensor`].
    pub fn transform(mut self, t: impl Transform + 'static) -> ImageFolder {
        self.transform = Some(Box::new(t));
        self
    }

    /// The class names, indexed by label.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Every sample's path and label, in order.
    pub fn samples(&self) -> &[(PathBuf, usize)] {
        &self.samples
    }
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::read_dir(dir)
        .map_err(|e| io_error(dir, format!("cannot list: {e}")))?
        .map(|e| {
            e.map(|e| e.path())
                .map_err(|e| io_error(dir, format!("cannot list: {e}")))
        })
        .collect()
}

/// Image files under `dir`, recursively (at most 32 levels deep: a symlink loop ends there).
fn collect_images(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) -> Result<()> {
    if depth > 32 {
        return Err(io_error(dir, "directories nest more than 32 deep (a symlink loop?)"));
    }
    for p in read_dir(dir)? {
        if p.is_dir() {
            collect_images(&p, out, depth + 1)?;
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
        {
            out.push(p);
        }
    }
    Ok(())
}

impl Dataset for ImageFolder {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.samples.len()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        let (path, label) = self
            .samples
            .get(index)
            .ok_or_else(|| out_of_range("ImageFolder", index, self.samples.len()))?;
        let mut image = ToTensor.apply(&read_image(path)?)?;
        if let Some(t) = &self.transform {
            image = t.apply(&image).map_err(|e| io_error(path, e.to_string()))?;
        }
        Ok((image, Tensor::scalar(*label as i64)))
    }
}

/// An `(image, label)` dataset whose images go through a transform when fetched (Paddle's
/// `transform=` argument of its datasets): `Transformed::new(Cifar10::from_dir(..)?, Compose(..))`.
/// A transform error names the sample.
pub struct Transformed<D> {
    inner: D,
    transform: Box<dyn Transform>,
}

impl<D: Dataset<Item = (Tensor, Tensor)>> Transformed<D> {
    /// `dataset` with `transform` applied to each image.
    pub fn new(dataset: D, transform: impl Transform + 'static) -> Transformed<D> {
        Transformed {
            inner: dataset,
            transform: Box::new(transform),
        }
    }
}

impl<D: Dataset<Item = (Tensor, Tensor)>> Dataset for Transformed<D> {
    type Item = (Tensor, Tensor);
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn get(&self, index: usize) -> Result<(Tensor, Tensor)> {
        let (image, label) = self.inner.get(index)?;
        let image = self
            .transform
            .apply(&image)
            .map_err(|e| crate::error::Error::invalid("Transformed", format!("sample {index}: {e}")))?;
        Ok((image, label))
    }
}
