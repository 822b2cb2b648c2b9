//! Every host read a step makes goes through [`read_to_host`], which counts it on the calling
//! thread (each rank's loop runs on one thread, thread ranks included), so a test can hold the
//! multi-rank steps to at most one read per logged step.
//!
//! A host read is what makes the host wait for the device: reading a device value (on a GPU a
//! stream synchronisation that waits for every queued kernel, on the CPU a copy), or a host
//! collective, which on NCCL stages its buffer on the compute stream and waits for it too. A step
//! whose statistics stay on the device queues its next step while the previous one still runs;
//! each read in between empties that queue and leaves the device idle while the host catches up.

use std::cell::Cell;

thread_local! {
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// Runs `read` (a read of device values to the host, or a host collective) and counts it.
pub(crate) fn read_to_host<T>(read: impl FnOnce() -> T) -> T {
    READS.with(|reads| reads.set(reads.get() + 1));
    read()
}

/// The host reads this thread has made so far.
pub(crate) fn host_reads() -> u64 {
    READS.with(Cell::get)
}
