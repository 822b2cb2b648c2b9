//! Device buffers streamed through the host's cores, piece by piece: the optimizer CPU
//! offload's update (`optimizer_cpu_offload`).
//!
//! An offloaded step reads each gradient once on the host and sends each new 16-bit weight
//! back once. Done whole — the buffer down, the update, the result up — the link and the cores
//! take turns, and every copy lands in fresh pageable memory that the driver stages again: an
//! 8B model's update took 14 s on one H100 that way (`tools/README.md`). Cut into pieces, the
//! copy engines bring piece i + 1 down and send piece i − 1 up while the cores work on piece i,
//! straight in and out of page-locked buffers, so the step pays for the slowest of the three
//! rather than their sum and the host's memory traffic is the update's own.
//!
//! [`FusedOps::host_pass`](crate::FusedOps::host_pass) is the operation; this module holds what
//! its callers and backends share: the pieces as typed slices and the composed default, which
//! downloads each buffer whole and cuts it into the same kind of pieces (so a CPU run exercises
//! the callers' piece arithmetic).

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use std::ops::Range;

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive, bf16, f16};

/// Elements per piece of the composed default: small enough that the tests' parameter groups
/// span several pieces.
const COMPOSED_PIECE: usize = 1 << 16;

/// Values read as they are stored: a piece of a buffer on the host to read, a gradient,
/// or the old values of an update out of place.
#[derive(Debug, Clone, Copy)]
pub enum HostValues<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

/// A piece of a buffer on the host to write, in its dtype.
#[derive(Debug)]
pub enum HostValuesMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

impl HostValuesMut<'_> {
    pub fn len(&self) -> usize {
        match self {
            Self::F32(x) => x.len(),
            Self::Bf16(x) => x.len(),
            Self::F16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One piece of a host pass: elements `offset..offset + values.len()` of input `input`, and the
/// output's elements at the same positions to fill.
#[derive(Debug)]
pub struct HostPiece<'a> {
    pub input: usize,
    pub offset: usize,
    pub values: HostValues<'a>,
    pub out: HostValuesMut<'a>,
}

/// The pass a caller runs on each piece, in order.
pub type HostPass<'a> = dyn FnMut(HostPiece<'_>) + 'a;

/// The default host pass: each input downloaded whole, cut into pieces for `pass`, its output
/// uploaded whole.
pub fn composed_host_pass<B: Backend>(
    inputs: Vec<(FloatTensor<B>, DType)>,
    pass: &mut HostPass<'_>,
) -> Vec<FloatTensor<B>> {
    inputs
        .into_iter()
        .enumerate()
        .map(|(input, (tensor, out_dtype))| {
            let device = B::float_device(&tensor);
            let data = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(tensor)).into_data();
            let len = data.num_elements();
            let mut out = HostBuffer::zeros(out_dtype, len);
            for offset in (0..len).step_by(COMPOSED_PIECE) {
                let range = offset..(offset + COMPOSED_PIECE).min(len);
                pass(HostPiece {
                    input,
                    offset,
                    values: values(&data, range.clone()),
                    out: out.slice_mut(range),
                });
            }
            Tensor::<B, 1>::from_data(out.into_data(), (&device, out_dtype))
                .into_primitive()
                .tensor()
        })
        .collect()
}

/// Elements `range` of `data`.
fn values(data: &TensorData, range: Range<usize>) -> HostValues<'_> {
    const READ: &str = "a buffer reads back in its dtype";
    match data.dtype {
        DType::F32 => HostValues::F32(&data.as_slice::<f32>().expect(READ)[range]),
        DType::BF16 => HostValues::Bf16(&data.as_slice::<bf16>().expect(READ)[range]),
        DType::F16 => HostValues::F16(&data.as_slice::<f16>().expect(READ)[range]),
        dtype => panic!("a host pass carries f32, bf16 or f16, not {dtype:?}"),
    }
}

/// An output being filled on the host.
enum HostBuffer {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl HostBuffer {
    fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F32 => Self::F32(vec![0.0; len]),
            DType::BF16 => Self::Bf16(vec![bf16::ZERO; len]),
            DType::F16 => Self::F16(vec![f16::ZERO; len]),
            dtype => panic!("a host pass writes f32, bf16 or f16, not {dtype:?}"),
        }
    }

    fn slice_mut(&mut self, range: Range<usize>) -> HostValuesMut<'_> {
        match self {
            Self::F32(x) => HostValuesMut::F32(&mut x[range]),
            Self::Bf16(x) => HostValuesMut::Bf16(&mut x[range]),
            Self::F16(x) => HostValuesMut::F16(&mut x[range]),
        }
    }

    fn into_data(self) -> TensorData {
        match self {
            Self::F32(x) => {
                let len = x.len();
                TensorData::new(x, [len])
            }
            Self::Bf16(x) => {
                let len = x.len();
                TensorData::new(x, [len])
            }
            Self::F16(x) => {
                let len = x.len();
                TensorData::new(x, [len])
            }
        }
    }
}
