//! The kernels we write, as CUDA C++ generated per spec and compiled by NVRTC on first use.
//!
//! Each family generates source for one op, dtype combination and layout (rank after
//! dim-merging, which operands are contiguous), so index math is specialised at compile time and
//! every kernel stays tiny; each module pairs its generator with the tensor-level functions the
//! layers above call. `prim` holds the generic families burn's ops map onto (map, reduce, index,
//! scan, sort, random); `fused` the hand-written kernels behind `FusedOps` (norms, AdamW, loss,
//! RoPE, SwiGLU, QK-norm, MoE routing, flat gradient buffers); `fp8` the fp8 casts and scale
//! update. `fused` and `fp8` build on `prim`, never the other way round. Their CUDA text lives in
//! `.cu` templates beside each generator (`template.rs` says why). No `unsafe` here: launching
//! is the engine's (`engine/launch.rs`).

pub mod fp8;
pub mod fused;
#[cfg(test)]
mod gpu_tests;
pub mod prim;
pub(crate) mod template;

/// One line per source, `index: header blake3`: a snapshot of many generated sources small
/// enough to review, which still changes when one byte of one of them does.
#[cfg(test)]
fn digests(sources: &[String]) -> String {
    sources
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let header = s.lines().next().unwrap_or_default();
            format!("{i}: {header} {}\n", blake3::hash(s.as_bytes()).to_hex())
        })
        .collect()
}
