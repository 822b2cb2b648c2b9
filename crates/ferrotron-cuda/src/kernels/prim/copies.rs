//! The [`CudaTensor`] methods that may have to copy through a map kernel: making a view
//! row-major, casting, reshaping a view whose strides allow no view of the new shape, and
//! downloading any view. They are inherent methods like the engine's views, so callers see one
//! tensor type, but they live here, beside the copy kernel they launch, so that the engine
//! (`engine/tensor.rs`) launches no generated kernel of its own.

use super::elementwise;
use crate::engine::dtype::DType;
use crate::engine::layout::{Layout, contiguous_strides, numel};
use crate::engine::tensor::{CudaTensor, check_rank};
use crate::error::{CudaError, OpContext, Result};

impl CudaTensor {
    /// Downloads the elements in row-major order as little-endian bytes. Synchronises.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.contiguous()?.download_row_major()
    }

    /// Same elements with a new shape: a view when the strides allow it, a copy otherwise.
    pub fn reshape(&self, shape: &[usize]) -> Result<Self> {
        check_rank("reshape", shape)?;
        if numel(shape) != self.numel() {
            return Err(CudaError::invalid(
                OpContext::new("reshape").shape(self.shape()).shape(shape),
                format!("{} elements cannot take shape {shape:?}", self.numel()),
            ));
        }
        match self.layout().reshape_view(shape) {
            Some(layout) => Ok(self.with_layout(layout)),
            None => {
                let c = self.contiguous()?;
                Ok(c.with_layout(Layout {
                    shape: shape.to_vec(),
                    strides: contiguous_strides(shape),
                    offset: c.offset(),
                }))
            }
        }
    }

    /// A row-major copy (or `self` when already row-major).
    pub fn contiguous(&self) -> Result<Self> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        elementwise::copy(self)
    }

    /// Converts elements to another dtype (returns `self` when it already has it).
    pub fn cast(&self, dtype: DType) -> Result<Self> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        elementwise::cast(self, dtype)
    }
}
