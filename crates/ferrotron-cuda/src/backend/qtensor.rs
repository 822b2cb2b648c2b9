//! Quantized tensors: not supported, by construction.
//!
//! The quantized primitive is an uninhabited type, so every op that *takes* one is statically
//! unreachable (no runtime check, no half-working path), and the two ops that would *create* one
//! (`q_from_data`, `quantize`) stop with a message naming the backend and the op. Ferrotron
//! trains in bf16/f32; fp8 GEMMs, when they come, go through cuBLASLt directly, not through
//! burn's quantization API.

use burn::tensor::backend::ExecutionError;
use burn::tensor::ops::{FloatTensor, IntTensor, QTensorOps, QuantizedTensor};
use burn::tensor::quantization::{QTensorPrimitive, QuantScheme, QuantizationParametersPrimitive};
use burn::tensor::{DType, FloatDType, Shape, Slice, TensorData, TensorMetadata};

use super::{Cuda, GpuDevice};

/// The quantized tensor primitive of [`Cuda`]: a type with no values.
#[derive(Debug, Clone)]
pub enum NoQuantizedTensor {}

impl TensorMetadata for NoQuantizedTensor {
    fn dtype(&self) -> DType {
        match *self {}
    }
    fn shape(&self) -> Shape {
        match *self {}
    }
}

impl QTensorPrimitive for NoQuantizedTensor {
    fn scheme(&self) -> &QuantScheme {
        match *self {}
    }
}

/// The message every quantization entry point stops with.
pub(crate) fn quantization_unsupported(op: &str) -> ! {
    panic!(
        "ferrotron-cuda does not implement quantized tensors ({op}); \
         keep the model in f32/bf16/f16 on this backend"
    )
}

impl QTensorOps<Cuda> for Cuda {
    fn q_from_data(_data: TensorData, _device: &GpuDevice) -> QuantizedTensor<Cuda> {
        quantization_unsupported("q_from_data")
    }

    fn quantize(
        _tensor: FloatTensor<Cuda>,
        _scheme: &QuantScheme,
        _qparams: QuantizationParametersPrimitive<Cuda>,
    ) -> QuantizedTensor<Cuda> {
        quantization_unsupported("quantize")
    }

    fn dequantize(tensor: QuantizedTensor<Cuda>, _dtype: FloatDType) -> FloatTensor<Cuda> {
        match tensor {}
    }

    fn q_device(tensor: &QuantizedTensor<Cuda>) -> GpuDevice {
        match *tensor {}
    }

    fn q_to_device(tensor: QuantizedTensor<Cuda>, _device: &GpuDevice) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    fn q_reshape(tensor: QuantizedTensor<Cuda>, _shape: Shape) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    async fn q_into_data(tensor: QuantizedTensor<Cuda>) -> Result<TensorData, ExecutionError> {
        match tensor {}
    }

    fn q_expand(tensor: QuantizedTensor<Cuda>, _shape: Shape) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    fn q_swap_dims(tensor: QuantizedTensor<Cuda>, _d1: usize, _d2: usize) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    fn q_permute(tensor: QuantizedTensor<Cuda>, _axes: &[usize]) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    fn q_flip(tensor: QuantizedTensor<Cuda>, _axes: &[usize]) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    fn q_select(
        tensor: QuantizedTensor<Cuda>,
        _dim: usize,
        _indices: IntTensor<Cuda>,
    ) -> QuantizedTensor<Cuda> {
        match tensor {}
    }

    fn q_slice(tensor: QuantizedTensor<Cuda>, _slices: &[Slice]) -> QuantizedTensor<Cuda> {
        match tensor {}
    }
}
