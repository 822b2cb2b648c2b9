//! [`FusedOps::host_pass`](ferrotron_ops::FusedOps::host_pass) on page-locked pieces: the
//! copy engines bring piece i + 1 down (on the compute stream, behind the step's backward) and
//! send piece i − 1 up (on a stream of their own, so both directions run at once) while the
//! caller's pass runs on piece i on the host's cores.
//!
//! Each direction has two page-locked buffers of [`PIECE_BYTES`], allocated on the first pass
//! and kept for the life of the process as the device is. On one H100 the link moved 54 GB/s
//! each way between page-locked memory and the device, 12 GB/s from pageable memory
//! (`tools/README.md`, issue 49), so an 8B model's fp32 gradients come down in about 0.6 s and
//! the pass itself sets the pace.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use burn::tensor::{bf16, f16};
use cudarc::driver::{result, sys};
use ferrotron_ops::{HostPass, HostPiece, HostValues, HostValuesMut};

use crate::engine::device::CudaDevice;
use crate::engine::dtype::DType;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, DriverResultExt, OpContext, Result};

/// Bytes of each page-locked piece buffer (four per device).
const PIECE_BYTES: usize = 32 << 20;

/// A page-locked buffer and the event recorded after the last copy that used it.
struct Pinned {
    host: *mut u8,
    copied: sys::CUevent,
}

// SAFETY: a driver allocation and an event, usable from any thread; a buffer is only touched
// under its device's mutex.
unsafe impl Send for Pinned {}

/// A device's piece buffers (two down, two up) and the stream the uploads go on.
struct Buffers {
    down: [Pinned; 2],
    up: [Pinned; 2],
    upload_stream: sys::CUstream,
    uploaded: sys::CUevent,
}

// SAFETY: as for `Pinned`; the stream is a driver handle used under the same mutex.
unsafe impl Send for Buffers {}

/// The buffers of one device, allocated on its first host pass.
#[derive(Default)]
pub(crate) struct HostPassBuffers {
    buffers: Mutex<Option<Buffers>>,
}

/// One piece to stream: its input, its first element and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    input: usize,
    offset: usize,
    len: usize,
}

/// The pieces of `lens` in order, at most `max_len` elements each.
fn pieces(lens: &[usize], max_len: usize) -> Vec<Piece> {
    lens.iter()
        .enumerate()
        .flat_map(|(input, &len)| {
            (0..len).step_by(max_len).map(move |offset| Piece {
                input,
                offset,
                len: max_len.min(len - offset),
            })
        })
        .collect()
}

/// Streams `inputs` (row-major buffers of `device`; the caller copies a strided view first)
/// through the host with `pass` and returns the outputs, each of the dtype paired with its
/// input.
pub(crate) fn host_pass(
    device: &Arc<CudaDevice>,
    inputs: Vec<(CudaTensor, DType)>,
    pass: &mut HostPass<'_>,
) -> Result<Vec<CudaTensor>> {
    let ctx = || OpContext::new("host_pass");
    if let Some((x, _)) = inputs.iter().find(|(x, _)| !x.is_contiguous()) {
        return Err(CudaError::invalid(
            x.op("host_pass"),
            "inputs must be row-major",
        ));
    }
    let outputs = inputs
        .iter()
        .map(|(x, out)| CudaTensor::empty(device, &[x.numel()], *out))
        .collect::<Result<Vec<_>>>()?;
    device.bind()?;
    let mut guard = device
        .host_pass_buffers()
        .buffers
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if guard.is_none() {
        *guard = Some(Buffers::allocate().ctx(ctx)?);
    }
    let buffers = guard.as_ref().expect("allocated above");
    let compute = device.cu_stream();
    // The outputs were allocated in the compute stream's order; the uploads wait for that.
    // SAFETY: live events and streams of this context.
    unsafe {
        result::event::record(buffers.uploaded, compute).ctx(ctx)?;
        result::stream::wait_event(
            buffers.upload_stream,
            buffers.uploaded,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
        .ctx(ctx)?;
    }
    let widest = inputs
        .iter()
        .flat_map(|(x, out)| [x.dtype().size_in_bytes(), out.size_in_bytes()])
        .max()
        .unwrap_or(1);
    let lens: Vec<usize> = inputs.iter().map(|(x, _)| x.numel()).collect();
    let pieces = pieces(&lens, PIECE_BYTES / widest);
    // Behind the first copy down is the step's backward, and behind that may be a collective
    // whose peer died: the process watchdog watches the waits.
    let _waiting = ferrotron_dist::watchdog::global().waiting("streaming buffers through the host");
    let stream = Stream {
        buffers,
        inputs: &inputs,
        outputs: &outputs,
        compute,
    };
    for (index, piece) in pieces.iter().enumerate() {
        stream.down(index, *piece)?;
        if index > 0 {
            stream.through(index - 1, pieces[index - 1], pass)?;
        }
    }
    if let Some(last) = pieces.len().checked_sub(1) {
        stream.through(last, pieces[last], pass)?;
    }
    // The compute stream uses the outputs only once their uploads are done.
    // SAFETY: live events and streams of this context.
    unsafe {
        result::event::record(buffers.uploaded, buffers.upload_stream).ctx(ctx)?;
        result::stream::wait_event(
            compute,
            buffers.uploaded,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
        .ctx(ctx)?;
    }
    Ok(outputs)
}

/// One pass's buffers, inputs and outputs.
struct Stream<'a> {
    buffers: &'a Buffers,
    inputs: &'a [(CudaTensor, DType)],
    outputs: &'a [CudaTensor],
    compute: sys::CUstream,
}

impl Stream<'_> {
    /// Queues piece `index`'s copy down into its buffer. That buffer's previous piece
    /// (`index - 2`) was passed through synchronously before this is called.
    fn down(&self, index: usize, piece: Piece) -> Result<()> {
        let ctx = || OpContext::new("host_pass: copy down");
        let (input, _) = &self.inputs[piece.input];
        let size = input.dtype().size_in_bytes();
        let buffer = &self.buffers.down[index % 2];
        // SAFETY: the buffer holds PIECE_BYTES ≥ piece.len × size page-locked bytes that no
        // queued copy uses (see above); the input is contiguous and holds the piece's elements.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                buffer.host.cast::<c_void>(),
                input.data_ptr() + (piece.offset * size) as u64,
                piece.len * size,
                self.compute,
            )
            .result()
            .ctx(ctx)?;
            result::event::record(buffer.copied, self.compute).ctx(ctx)
        }
    }

    /// Waits for piece `index` to be down and for its output buffer's previous upload, runs
    /// `pass` on it and queues the output's copy up.
    fn through(&self, index: usize, piece: Piece, pass: &mut HostPass<'_>) -> Result<()> {
        let ctx = || OpContext::new("host_pass: copy up");
        let (input, out_dtype) = &self.inputs[piece.input];
        let down = &self.buffers.down[index % 2];
        let up = &self.buffers.up[index % 2];
        // SAFETY: live events recorded after the copy into `down` and the last copy out of `up`.
        unsafe {
            result::event::synchronize(down.copied).ctx(ctx)?;
            result::event::synchronize(up.copied).ctx(ctx)?;
        }
        // SAFETY: `down` holds the piece's elements (copied and waited for above) in the input's
        // dtype, page-aligned; `up` holds PIECE_BYTES ≥ piece.len × the output's element size
        // that no copy reads until it is queued below.
        let (values, out) = unsafe {
            (
                values(input.dtype(), down.host, piece.len)?,
                values_mut(*out_dtype, up.host, piece.len)?,
            )
        };
        pass(HostPiece {
            input: piece.input,
            offset: piece.offset,
            values,
            out,
        });
        let size = out_dtype.size_in_bytes();
        // SAFETY: the output holds `piece.offset + piece.len` elements of `size` bytes; `up`
        // stays allocated and unwritten until the event recorded after this copy completes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.outputs[piece.input].data_ptr() + (piece.offset * size) as u64,
                up.host.cast::<c_void>().cast_const(),
                piece.len * size,
                self.buffers.upload_stream,
            )
            .result()
            .ctx(ctx)?;
            result::event::record(up.copied, self.buffers.upload_stream).ctx(ctx)
        }
    }
}

/// `len` elements of `dtype` at `host`, to read.
///
/// # Safety
/// `host` must hold `len` initialised, suitably aligned elements of `dtype`, unwritten while the
/// slice lives.
unsafe fn values<'a>(dtype: DType, host: *const u8, len: usize) -> Result<HostValues<'a>> {
    // SAFETY: the caller's contract.
    unsafe {
        Ok(match dtype {
            DType::F32 => HostValues::F32(std::slice::from_raw_parts(host.cast::<f32>(), len)),
            DType::BF16 => HostValues::Bf16(std::slice::from_raw_parts(host.cast::<bf16>(), len)),
            DType::F16 => HostValues::F16(std::slice::from_raw_parts(host.cast::<f16>(), len)),
            other => return Err(unsupported(other)),
        })
    }
}

/// `len` elements of `dtype` at `host`, to write.
///
/// # Safety
/// `host` must hold `len` suitably aligned elements of `dtype`, used by nothing else while the
/// slice lives.
unsafe fn values_mut<'a>(dtype: DType, host: *mut u8, len: usize) -> Result<HostValuesMut<'a>> {
    // SAFETY: the caller's contract.
    unsafe {
        Ok(match dtype {
            DType::F32 => {
                HostValuesMut::F32(std::slice::from_raw_parts_mut(host.cast::<f32>(), len))
            }
            DType::BF16 => {
                HostValuesMut::Bf16(std::slice::from_raw_parts_mut(host.cast::<bf16>(), len))
            }
            DType::F16 => {
                HostValuesMut::F16(std::slice::from_raw_parts_mut(host.cast::<f16>(), len))
            }
            other => return Err(unsupported(other)),
        })
    }
}

fn unsupported(dtype: DType) -> CudaError {
    CudaError::unsupported(
        OpContext::new("host_pass").dtype(dtype),
        "a host pass carries f32, bf16 or f16 buffers",
    )
}

impl Buffers {
    fn allocate() -> std::result::Result<Self, cudarc::driver::DriverError> {
        let pinned = || -> std::result::Result<Pinned, cudarc::driver::DriverError> {
            // SAFETY: a plain page-locked allocation, written by a copy or a pass before it is
            // read.
            let host = unsafe { result::malloc_host(PIECE_BYTES, 0) }?.cast::<u8>();
            let copied = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
            Ok(Pinned { host, copied })
        };
        Ok(Self {
            down: [pinned()?, pinned()?],
            up: [pinned()?, pinned()?],
            upload_stream: result::stream::create(result::stream::StreamKind::NonBlocking)?,
            uploaded: result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Piece, pieces};

    #[test]
    fn inputs_are_cut_into_pieces_in_order_none_crossing_an_input() {
        let piece = |input, offset, len| Piece { input, offset, len };
        assert_eq!(
            pieces(&[5, 0, 4], 2),
            [
                piece(0, 0, 2),
                piece(0, 2, 2),
                piece(0, 4, 1),
                piece(2, 0, 2),
                piece(2, 2, 2),
            ]
        );
        assert!(pieces(&[], 3).is_empty());
    }
}
