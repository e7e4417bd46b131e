//! Reading images (`paddle.vision.image_load`): PNG and JPEG files (the `image` crate) to
//! `[H, W, C]` u8 tensors — gray images with one channel, images with alpha with four (RGBA),
//! the rest three (RGB; 16-bit samples are scaled to 8) — ready for
//! [`crate::vision::transforms::ToTensor`]. Sizes are checked before pixels are allocated
//! (oar's memory limit, at most 2^16 pixels a side): a malformed, truncated or oversized file
//! is an error naming it.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use ::image::{DynamicImage, ImageReader, Limits};
use oar_ir::TensorData;
use std::io::Cursor;
use std::path::Path;

/// Largest width or height read.
const MAX_SIDE: u32 = 1 << 16;

fn io_err(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Io {
        path: what.to_string(),
        detail: detail.to_string(),
    }
}

/// Read the PNG or JPEG file at `path`.
pub fn read_image(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let what = path.display().to_string();
    let len = std::fs::metadata(path).map_err(|e| io_err(&what, e))?.len();
    if len > oar_ir::memory::limit() {
        return Err(io_err(
            &what,
            format!(
                "{len} bytes is over the memory limit ({})",
                oar_ir::memory::limit_source()
            ),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| io_err(&what, e))?;
    decode_image(&bytes, &what)
}

/// Decode a PNG or JPEG image from `bytes`; `what` names the source in errors.
pub fn decode_image(bytes: &[u8], what: &str) -> Result<Tensor> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| io_err(what, e))?;
    if reader.format().is_none() {
        return Err(io_err(what, "not a PNG or JPEG image"));
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(oar_ir::memory::limit());
    let mut reader = reader;
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| io_err(what, format!("cannot decode: {e}")))?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    let (c, pixels) = match img {
        DynamicImage::ImageLuma8(g) => (1, g.into_raw()),
        DynamicImage::ImageLuma16(_) => (1, img.to_luma8().into_raw()),
        i if i.color().has_alpha() => (4, i.to_rgba8().into_raw()),
        i => (3, i.to_rgb8().into_raw()),
    };
    Ok(Tensor::from_data(TensorData::from_vec(vec![h, w, c], pixels)?))
}
