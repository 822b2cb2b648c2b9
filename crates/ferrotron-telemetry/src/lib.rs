//! Everything a training run tells the outside world, kept out of the training loop.
//!
//! The loop is synchronous and must never block on observers, so each channel here is cheap to
//! feed: Prometheus gauges are atomics read by a server on its own thread, JSONL lines and
//! TensorBoard events are one `write` each, and the progress display degrades to log lines when
//! nobody watches a terminal.

mod error;
mod jsonl;
mod manifest;
mod memory;
mod metrics;
mod progress;
mod server;
mod snapshot;
mod tensorboard;
mod tracing_setup;

pub use error::TelemetryError;
pub use jsonl::JsonlWriter;
pub use manifest::{
    MANIFEST_FILE, MANIFEST_VERSION, PlanRecord, ProgramInfo, RunDetails, RunManifest, RunStatus,
    WorldLayout,
};
pub use memory::{MemoryProbe, process_memory_bytes};
pub use metrics::{IterationCounts, Metrics, StepMetrics};
pub use progress::Progress;
pub use server::{MAX_CONNECTIONS, MetricsServer};
pub use tensorboard::TensorBoardWriter;
pub use tracing_setup::init_tracing;
