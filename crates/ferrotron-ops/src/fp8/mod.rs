//! fp8 linear layers on Transformer Engine's recipe: the scaling state and grids (`scaling`),
//! one node per linear (`linear`, `node`), per MLP (`mlp`) or per MoE linear's experts
//! (`experts`), and what their casts read on the way in (an input norm, RoPE, a residual after
//! dropout: `norm`, `rope`, `residual`, `source`).

pub(crate) mod experts;
pub(crate) mod linear;
pub(crate) mod mlp;
pub(crate) mod node;
pub(crate) mod norm;
pub(crate) mod residual;
pub(crate) mod rope;
pub mod scaling;
pub(crate) mod source;
