//! The experts' weights of a grouped matmul as its kernels take them: one stacked tensor or each
//! expert's own (`blas/grouped.rs` and `kernels/fused/grouped_gemm.rs` both read them, so they
//! live below both layers).

use crate::engine::dtype::DType;
use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};

/// The experts' `[k, n]` weights: slices of one `[groups, k, n]` tensor, or each expert's own
/// tensor (its parameter: autodiff's `grouped_matmul_parts_node` never stacks them, which cost a
/// read and write of every expert's weights and a copy launch per expert, forward and backward).
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    Stacked(&'a CudaTensor),
    Parts(&'a [CudaTensor]),
}

impl Weights<'_> {
    pub(crate) fn dtype(&self) -> Option<DType> {
        match self {
            Weights::Stacked(weight) => Some(weight.dtype()),
            Weights::Parts(parts) => parts.first().map(CudaTensor::dtype),
        }
    }

    /// `(groups, k, n)`, where every part is one `[k, n]` of one dtype.
    pub(crate) fn dims(&self) -> Option<(usize, usize, usize)> {
        match self {
            Weights::Stacked(weight) => match weight.shape() {
                [groups, k, n] => Some((*groups, *k, *n)),
                _ => None,
            },
            Weights::Parts(parts) => {
                let first = parts.first()?;
                let [k, n] = *first.shape() else { return None };
                parts
                    .iter()
                    .all(|part| part.shape() == [k, n] && part.dtype() == first.dtype())
                    .then_some((parts.len(), k, n))
            }
        }
    }

    /// Each expert's `[k, n]` matrix, contiguous (views of the stack made contiguous).
    pub(crate) fn matrices(&self) -> Result<Vec<CudaTensor>> {
        match self {
            Weights::Stacked(weight) => {
                let weight = weight.contiguous()?;
                (0..weight.shape()[0])
                    .map(|group| expert_matrix(&weight, group))
                    .collect()
            }
            Weights::Parts(parts) => parts.iter().map(CudaTensor::contiguous).collect(),
        }
    }
}

/// Expert `group`'s `[k, n]` matrix of a contiguous `[groups, k, n]` tensor (a view).
pub(crate) fn expert_matrix(t: &CudaTensor, group: usize) -> Result<CudaTensor> {
    let [_, k, n] = *t.shape() else {
        return Err(CudaError::invalid(
            t.op("expert_matrix"),
            "a [groups, k, n] tensor",
        ));
    };
    t.slice(&[
        SliceArg::range(group, group + 1),
        SliceArg::full(k),
        SliceArg::full(n),
    ])?
    .reshape(&[k, n])
}
