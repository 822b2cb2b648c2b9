//! Activation recomputation (Megatron's full recompute) as graph cuts.
//!
//! burn 0.21's autodiff keeps every op's saved tensors until the backward pass, and its backward
//! cannot be entered again from inside a node (the node runs under the graph's lock, which a
//! nested backward takes too). So a recomputed range of layers is a *cut* instead of a node: its
//! forward runs untracked (no graph, nothing saved), its outputs enter the graph as fresh leaves,
//! and the range is recorded on this thread's [`Tape`]. After the main backward has filled those
//! leaves' gradients, the trainer's driver walks the tape backwards: it re-runs each range with
//! autodiff on its saved input, differentiates the re-run against the leaves' gradients, and
//! hands the input's gradient on upstream. What stays alive between forward and backward is one
//! input per range instead of every activation inside it.
//!
//! Dropout inside a range must draw the same masks when it is re-run. The generator is marked
//! where each layer starts ([`crate::ParallelOps::rng_mark`]) and a re-run restores the mark of
//! its first layer; the driver marks before and restores after its re-runs, so the draws after a
//! backward are those of a run without recomputation.
//!
//! The tape is per thread because a rank is a thread on the CPU and a process on the GPU, and a
//! forward's ranges belong to the backward of the same rank; the trainer takes the tape after each
//! forward and keeps it with that microbatch until its backward.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

/// A generator position dropout can be sent back to: (seed, counter) on a counter-based
/// generator; on a backend whose generator state cannot be read, the seed the stream was
/// re-keyed with when the mark was taken.
pub type RngMark = [u64; 2];

/// A range's forward: its inputs to its outputs. Called untracked (`track` false: parameters
/// without gradients, so autodiff records nothing) in the forward pass and tracked when the
/// backward re-runs it.
pub type Rerun<B> = Rc<dyn Fn(Vec<FloatTensor<B>>, bool) -> Vec<FloatTensor<B>>>;

/// How the backward driver gets a range's tracked outputs back.
pub enum Replay<B: AutodiffBackend> {
    /// Re-run the range from the generator position at its start (recomputation).
    Rerun { mark: RngMark, rerun: Rerun<B> },
    /// The range ran tracked in the forward on `inputs` (fresh leaves) and its graph to
    /// `outputs` was kept: a cut without recomputation, so that the backward proceeds range by
    /// range and what a range's parameters need can start as soon as their gradients are final
    /// (the data-parallel reduction's overlap).
    Kept {
        inputs: Vec<FloatTensor<B>>,
        outputs: Vec<FloatTensor<B>>,
    },
}

/// One cut range as the backward driver needs it.
pub struct Segment<B: AutodiffBackend> {
    /// The range's inputs as the graph holds them, each with whether it carries a gradient.
    pub inputs: Vec<(FloatTensor<B>, bool)>,
    /// The leaves standing for its outputs in the graph.
    pub outputs: Vec<FloatTensor<B>>,
    pub replay: Replay<B>,
}

/// A range's forward run once, tracked, for [`Replay::Kept`].
pub type Run<B> = Box<dyn FnOnce(Vec<FloatTensor<B>>) -> Vec<FloatTensor<B>>>;

/// A forward pass's recomputed ranges, in forward order.
pub struct Tape<B: AutodiffBackend> {
    pub segments: Vec<Segment<B>>,
}

thread_local! {
    static TAPE: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Records a range on this thread's tape (called by `Autodiff`'s [`crate::ParallelOps::recompute`]
/// and [`crate::ParallelOps::cut_kept`]).
pub(crate) fn record<B: AutodiffBackend>(segment: Segment<B>) {
    TAPE.with(|tape| tape.borrow_mut().push(Box::new(segment)));
}

/// The ranges this thread recorded since the last call: one forward pass's, taken right after
/// it.
///
/// # Panics
/// When a range was recorded on another backend type (two autodiff backends on one thread).
pub fn take<B: AutodiffBackend>() -> Tape<B> {
    let recorded = TAPE.with(|tape| std::mem::take(&mut *tape.borrow_mut()));
    let segments = recorded
        .into_iter()
        .map(|segment| {
            *segment
                .downcast::<Segment<B>>()
                .unwrap_or_else(|_| panic!("a recomputed range of another backend on this thread"))
        })
        .collect();
    Tape { segments }
}
