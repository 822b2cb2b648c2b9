//! RoPE after an fp8 QKV projection, inside the projection's node.
//!
//! The projection's output gradient reaches the node rotated: without the rotation in the node,
//! RoPE's backward writes the unrotated `[tokens, qkv]` gradient in 16 bits and the node's cast
//! reads it back. With it, the cast computes the inverse rotation as it reads
//! (`Fp8Source::RopeGrad`), and the 16-bit copy is never stored. The forward still rotates the
//! GEMM's output with the RoPE kernel (cuBLASLt has no such epilogue).

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use crate::FusedOps;

/// The rotation an fp8 projection applies to its output `[.., groups · slots · head_dim]`:
/// rotary tables `cos`, `sin` `[seq, head_dim]` for the rows' positions (rows are `[batch,
/// seq]`), and the packed layout (`op/rope.rs`: every slot but the last, the value, rotated).
#[derive(Debug, Clone)]
pub struct Fp8Rope<B: Backend> {
    pub cos: FloatTensor<B>,
    pub sin: FloatTensor<B>,
    pub groups: usize,
    pub slots: usize,
    pub head_dim: usize,
}

impl<B: Backend> Fp8Rope<B> {
    /// The projection's rows `[.., cols]` as the packed `[batch, seq, groups, slots, head_dim]`.
    pub fn packed(&self, x: FloatTensor<B>) -> FloatTensor<B> {
        let seq = self.cos.shape().dims::<2>()[0];
        let rows = x.shape().num_elements() / (self.groups * self.slots * self.head_dim).max(1);
        B::float_reshape(
            x,
            Shape::new([
                rows / seq.max(1),
                seq,
                self.groups,
                self.slots,
                self.head_dim,
            ]),
        )
    }
}

/// The projection's output rotated (the forward of `FusedOps::fused_rope_qkv`'s kernel).
pub(crate) fn rotate_output<B: FusedOps>(
    output: FloatTensor<B>,
    rope: &Fp8Rope<B>,
) -> FloatTensor<B> {
    let shape = output.shape();
    let packed = rope.packed(output);
    B::float_reshape(
        B::rope_qkv_kernel_forward(packed, rope.cos.clone(), rope.sin.clone()),
        shape,
    )
}
