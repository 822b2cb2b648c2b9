//! The communication streams of a device, one per [`Lane`] (`ferrotron_dist::Lane` says which
//! group takes which, and why). NCCL's rule (every member issues a communicator's operations in
//! one order) holds per lane: a group's collectives all go on one stream, in program order, on
//! every rank.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaStream;

use ferrotron_dist::Lane;

use crate::engine::device::CudaDevice;

/// Each device's lane streams, by (device ordinal, lane).
type LaneStreams = Mutex<HashMap<(usize, Lane), Arc<CudaStream>>>;

/// The stream of `lane` on `device`, created on first use and shared by the lane's
/// communicators.
pub(crate) fn comm_stream(device: &Arc<CudaDevice>, lane: Lane) -> Result<Arc<CudaStream>, String> {
    static STREAMS: OnceLock<LaneStreams> = OnceLock::new();
    let mut streams = STREAMS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let key = (device.ordinal(), lane);
    if let Some(stream) = streams.get(&key) {
        return Ok(stream.clone());
    }
    let stream = device
        .context()
        .new_stream()
        .map_err(|e| format!("creating the {lane:?} communication stream: {e:?}"))?;
    streams.insert(key, stream.clone());
    Ok(stream)
}
