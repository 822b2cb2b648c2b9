//! Integer matmul, which cuBLASLt does not offer for i64: a broadcast product
//! `[.., m, k, 1] * [.., 1, k, n]` summed over `k`. Exact in i64 and only used for small
//! integer tensors (burn's int matmul is rare), so the `m·k·n` intermediate is acceptable.

use burn::tensor::ops::IntTensor;

use super::Cuda;
use super::convert::ok;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, Result};
use crate::kernels::prim::elementwise::{self as ew, BinaryOp};
use crate::kernels::prim::reduce::{self, ReduceOp};

pub(super) fn int_matmul(lhs: IntTensor<Cuda>, rhs: IntTensor<Cuda>) -> IntTensor<Cuda> {
    ok(try_int_matmul(&lhs, &rhs))
}

fn try_int_matmul(lhs: &CudaTensor, rhs: &CudaTensor) -> Result<CudaTensor> {
    let rank = lhs.rank();
    if rank < 2 || rhs.rank() != rank || lhs.shape()[rank - 1] != rhs.shape()[rank - 2] {
        return Err(CudaError::invalid(
            crate::error::OpContext::new("int_matmul")
                .shape(lhs.shape())
                .shape(rhs.shape()),
            "expected [.., m, k] x [.., k, n] of equal rank",
        ));
    }
    let a = lhs.unsqueeze(rank)?; // [.., m, k, 1]
    let b = rhs.unsqueeze(rank - 2)?; // [.., 1, k, n]
    let products = ew::binary(&a, &b, BinaryOp::Mul)?; // [.., m, k, n]
    let summed = reduce::reduce_dim(&products, rank - 1, ReduceOp::Sum)?; // [.., m, 1, n]
    let mut shape = summed.shape().to_vec();
    shape.remove(rank - 1);
    summed.reshape(&shape)
}
