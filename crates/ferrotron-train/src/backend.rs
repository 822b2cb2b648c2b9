//! The one bound every rank function needs, named once: burn's autodiff over a backend with
//! Ferrotron's collectives and fused ops, whose inner (gradient-free) backend has them too (the
//! optimizer, the gradient exchange and evaluation run there). Spelled out, it is two lines of a
//! `where` clause that every function of a rank's walk repeated; a trait with a blanket impl is
//! Rust's alias for such a bound, so a new requirement is added here, once.
//!
//! What does not take it, on purpose: code that sees only the inner backend (`AdamW<I>`, the
//! exchanges' collectives, evaluation: `I: ParallelOps`), and code that needs no collective or
//! fused op at all (module visitors over any `AutodiffBackend`, the checkpoint format).

use burn::tensor::backend::AutodiffBackend;
use ferrotron_parallel::ParallelOps;

/// A backend a training rank runs on (the CPU's `Autodiff<Flex>`, the GPU's `Autodiff<Cuda>`).
pub trait TrainBackend: AutodiffBackend<InnerBackend: ParallelOps> + ParallelOps {}

impl<B> TrainBackend for B
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
}
