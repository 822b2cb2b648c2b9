//! Each fused op: the composed default against the model's old arithmetic, the autodiff node
//! (driven by the reference kernels) against the composed graph, and burn-flex's kernels.

mod attention;
mod bias_gelu;
mod combine;
mod cpu;
mod cpu_layers;
mod dropout;
mod fp8;
mod fp8_experts;
mod fp8_mlp;
mod gather;
mod grouped;
mod linear_loss;
mod loss;
mod norm;
mod qk_norm;
mod qkv;
mod rope;
mod router;
mod router_aux;
mod sliding_window;
mod swiglu;

pub(crate) use crate::testing::{B, assert_close, flat, fresh, tensor, values};
