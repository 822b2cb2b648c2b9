//! Writing safetensors files whose tensors are computed only when the writer reaches them:
//! `safetensors::serialize_to_file` asks each view for its bytes once, in file order, so a view
//! that assembles its tensor on demand keeps one tensor in memory at a time. A failure while
//! producing a tensor is kept aside (a view cannot return an error), the partial file removed
//! and the failure returned.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, View};

use crate::HfError;

/// The element type written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    F32,
    /// Rounded to nearest even from the f32 master weights.
    Bf16,
}

impl OutDtype {
    pub fn bytes(self) -> u64 {
        match self {
            OutDtype::F32 => 4,
            OutDtype::Bf16 => 2,
        }
    }

    /// transformers' name for it (`torch_dtype` in `config.json`).
    pub fn torch_name(self) -> &'static str {
        match self {
            OutDtype::F32 => "float32",
            OutDtype::Bf16 => "bfloat16",
        }
    }
}

/// A tensor to write: its shape, and how to produce its values.
pub(crate) struct LazyTensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub produce: Box<dyn Fn() -> Result<Vec<f32>, HfError> + 'a>,
}

struct Deferred<'a, 'b> {
    tensor: &'b LazyTensor<'a>,
    dtype: OutDtype,
    failure: &'b RefCell<Option<HfError>>,
}

impl View for Deferred<'_, '_> {
    fn dtype(&self) -> Dtype {
        match self.dtype {
            OutDtype::F32 => Dtype::F32,
            OutDtype::Bf16 => Dtype::BF16,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if self.failure.borrow().is_some() {
            return Cow::Owned(Vec::new());
        }
        let values = match (self.tensor.produce)() {
            Ok(values) if values.len() == self.tensor.shape.iter().product::<usize>() => values,
            Ok(values) => {
                *self.failure.borrow_mut() = Some(HfError::tensors(
                    Path::new(&self.tensor.name),
                    format!("{} values for shape {:?}", values.len(), self.tensor.shape),
                ));
                return Cow::Owned(Vec::new());
            }
            Err(error) => {
                *self.failure.borrow_mut() = Some(error);
                return Cow::Owned(Vec::new());
            }
        };
        Cow::Owned(match self.dtype {
            OutDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            OutDtype::Bf16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        })
    }

    fn data_len(&self) -> usize {
        self.tensor.shape.iter().product::<usize>() * self.dtype.bytes() as usize
    }
}

/// Write `tensors` to `path` with `metadata` in the header.
pub(crate) fn write(
    path: &Path,
    tensors: &[LazyTensor<'_>],
    dtype: OutDtype,
    metadata: HashMap<String, String>,
) -> Result<(), HfError> {
    let failure = RefCell::new(None);
    let views = tensors.iter().map(|tensor| {
        (
            tensor.name.as_str(),
            Deferred {
                tensor,
                dtype,
                failure: &failure,
            },
        )
    });
    let written = safetensors::serialize_to_file(views, Some(metadata), path);
    if let Some(error) = failure.into_inner() {
        let _ = std::fs::remove_file(path);
        return Err(error);
    }
    written.map_err(|e| HfError::tensors(path, format!("cannot write tensors: {e}")))
}
