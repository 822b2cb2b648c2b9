//! One module per fused op: its spec, composed default, reference kernels and autodiff node.

pub(crate) mod adamw;
pub(crate) mod attention;
pub(crate) mod bias_gelu;
pub(crate) mod combine;
pub(crate) mod dropout;
pub(crate) mod embedding;
pub(crate) mod flat;
pub(crate) mod gather;
pub(crate) mod gelu;
pub(crate) mod group_rows;
pub(crate) mod grouped;
pub(crate) mod host_pass;
pub(crate) mod linear_loss;
pub(crate) mod logits;
pub(crate) mod loss;
pub(crate) mod moe;
pub(crate) mod norm;
pub(crate) mod qk_norm;
pub(crate) mod qkv;
pub(crate) mod rope;
pub(crate) mod router;
pub(crate) mod router_aux;
pub(crate) mod swiglu;
pub(crate) mod tied_loss;
