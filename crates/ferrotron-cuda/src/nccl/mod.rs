//! NCCL for the CUDA backend: [`NcclComm`], one communicator per process group, with the
//! collectives on device tensors (the model's region operators, no host copies) and on host
//! slices (`ferrotron_dist::Communicator`, what the runtime's gradient sync and small reductions
//! use), the rendezvous of its unique id over the TCP bootstrap, and bandwidth accounting.
//!
//! NCCL is loaded at run time through cudarc (`libnccl.so` on `LD_LIBRARY_PATH`), so this
//! builds and unit-tests where there is no GPU; [`nccl_available`] says whether it loads.
//!
//! | file | job |
//! |---|---|
//! | `comm.rs` | creation (solo, world over TCP, `new_group`, `split`), stream ordering, waits with a deadline, abort |
//! | `tensor.rs` | collectives on `CudaTensor`s (even and uneven all-gather, reduce-scatter, all-reduce, broadcast, grouped send/recv, uneven all-to-all, along any dim) |
//! | `lane.rs` | the two communication streams: data-parallel traffic apart from the model's collectives |
//! | `host.rs` | `Communicator` on host slices, staged through device buffers |
//! | `args.rs` | argument checks NCCL itself would not make |
//! | `types.rs` | element types → NCCL data types, reductions |
//! | `stats.rs` | bytes and GPU time per collective kind; algorithm and bus bandwidth |
//! | `warmup.rs` | connecting every communicator of a rank before the model is built (issue 44) |
//! | `exporter.rs` | those bandwidths as Prometheus series in the default registry (served on `/metrics`) |

mod args;
mod comm;
mod exporter;
mod host;
mod lane;
pub mod stats;
mod tensor;
mod types;
mod warmup;

pub use args::{divisible_rows, pairwise_counts, uneven_rows};
pub use comm::{
    DEFAULT_TIMEOUT, NcclComm, abort_all, id_to_words, nccl_available, nccl_version, words_to_id,
};
pub use stats::{CollectiveKind, KindStats, KindTotals};
pub use tensor::{RecvSpec, StartedCollective};
pub use types::{reduce_op, reducible_type, tensor_type, wire_type};
pub use warmup::{GroupKind, WarmupOp, pipeline_neighbours, run_warmup, warm_up, warmup_plan};
