//! Mixture-of-Experts layers in the style of Mixtral and DeepSeek, as Megatron-Core routes them.
//! On one rank every token dispatcher (allgather, alltoall, flex) computes the same function; in
//! a parallel layout the experts are spread over expert-parallel ranks and the dispatcher
//! carries tokens to them, with the routing and losses still those of the one-rank layer.

mod decisions;
mod dispatch;
mod expert;
mod grouped;
mod layer;
pub(crate) mod loss;
mod microbatch;
mod parallel;
pub(crate) mod routing;
mod sinkhorn;

#[cfg(test)]
mod reference;

pub use layer::{MoeLayer, MoeStats};
pub use routing::{Routing, expert_capacity, route};
