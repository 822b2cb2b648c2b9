//! Mixture-of-Experts layers in the style of Mixtral and DeepSeek, as Megatron-Core routes them.
//! On one rank every token dispatcher (allgather, alltoall, flex) computes the same function, so
//! the dispatcher choice only matters once expert parallelism arrives.

mod layer;
pub(crate) mod loss;
pub(crate) mod routing;
mod sinkhorn;

pub use layer::{MoeLayer, MoeStats};
pub use routing::{Routing, expert_capacity, route};
