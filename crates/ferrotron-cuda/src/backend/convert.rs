//! The seams between burn's types and the engine's: dtypes, scalars, slices, host data.
//!
//! All of it is plain logic (no device), so CI tests it. Dtypes the engine lacks fail with an
//! error naming the dtype and the dtypes it has, except for host data of a wider type than we
//! store (f64 floats, other integer widths), which is narrowed on the host at upload: burn's
//! record loaders and tests hand over such data and expect the backend's default dtype.

use std::sync::Arc;

use burn::tensor::{
    BoolStore, DType, Distribution, FloatDType, IntDType, Scalar, Slice, TensorData,
};

use crate::engine::device::CudaDevice;
use crate::engine::dtype::{DType as EDType, Scalar as EScalar, unsupported};
pub(crate) use crate::engine::dtype::{burn_dtype, engine_dtype};
use crate::engine::layout::SliceArg;
use crate::engine::tensor::CudaTensor;
use crate::error::{CudaError, OpContext, Result};
use crate::kernels::prim::random::Distribution as EDistribution;

/// The engine dtype for a requested float dtype.
pub(crate) fn float_dtype(dtype: FloatDType) -> EDType {
    match dtype {
        FloatDType::F16 => EDType::F16,
        FloatDType::BF16 => EDType::BF16,
        // f64 is not stored; f32 is the widest float the engine computes in.
        FloatDType::F32 | FloatDType::Flex32 | FloatDType::F64 => EDType::F32,
    }
}

/// The engine dtype for a requested int dtype: i64, i32 and u8 as asked, other widths as i64.
pub(crate) fn int_dtype(dtype: IntDType) -> EDType {
    match dtype {
        IntDType::I32 => EDType::I32,
        IntDType::U8 => EDType::U8,
        _ => EDType::I64,
    }
}

/// A burn scalar as the engine's scalar.
pub(crate) fn scalar(value: Scalar) -> EScalar {
    match value {
        Scalar::Float(v) => EScalar::Float(v),
        Scalar::Int(v) => EScalar::Int(v),
        Scalar::UInt(v) => EScalar::Int(i64::try_from(v).unwrap_or(i64::MAX)),
        Scalar::Bool(v) => EScalar::Bool(v),
    }
}

/// A burn distribution as the engine's (burn's `Default` is uniform on `[0, 1)`).
pub(crate) fn distribution(d: Distribution) -> EDistribution {
    match d {
        Distribution::Default => EDistribution::Uniform {
            low: 0.0,
            high: 1.0,
        },
        Distribution::Uniform(low, high) => EDistribution::Uniform { low, high },
        Distribution::Normal(mean, std) => EDistribution::Normal { mean, std },
        Distribution::Bernoulli(p) => EDistribution::Bernoulli { p },
    }
}

/// Resolves burn slices (negative indices count from the end, open ends) against a shape.
pub(crate) fn slice_args(slices: &[Slice], shape: &[usize]) -> Result<Vec<SliceArg>> {
    if slices.len() > shape.len() {
        return Err(CudaError::invalid(
            OpContext::new("slice").shape(shape),
            format!("{} slices for rank {}", slices.len(), shape.len()),
        ));
    }
    let mut out = Vec::with_capacity(shape.len());
    for (dim, &size) in shape.iter().enumerate() {
        let Some(s) = slices.get(dim) else {
            out.push(SliceArg::full(size));
            continue;
        };
        let resolve = |i: isize| -> usize {
            let i = if i < 0 { i + size as isize } else { i };
            i.clamp(0, size as isize) as usize
        };
        let start = resolve(s.start);
        let end = s.end.map_or(size, resolve).max(start);
        if s.step == 0 {
            return Err(CudaError::invalid(
                OpContext::new("slice").shape(shape),
                format!("step 0 on dim {dim}"),
            ));
        }
        out.push(SliceArg {
            start,
            end,
            step: s.step,
        });
    }
    Ok(out)
}

/// Host data as it will be stored: the engine dtype, and the data converted to it when burn's
/// dtype is one the engine does not store.
pub(crate) fn storable(data: TensorData) -> (TensorData, EDType) {
    match data.dtype {
        DType::F64 => (data.convert::<f32>(), EDType::F32),
        DType::I16 | DType::I8 | DType::U16 | DType::U32 | DType::U64 => {
            (data.convert::<i64>(), EDType::I64)
        }
        DType::Bool(BoolStore::U32) => {
            let bytes: Vec<u8> = data.iter::<u32>().map(|v| u8::from(v != 0)).collect();
            let shape = data.shape.clone();
            (
                TensorData::from_bytes_vec(bytes, shape, DType::Bool(BoolStore::U8)),
                EDType::Bool,
            )
        }
        // Native bools are one byte holding 0 or 1: the engine's bool layout already.
        dtype => {
            let engine = engine_dtype(dtype).unwrap_or(EDType::F32);
            (data, engine)
        }
    }
}

/// Uploads host data.
pub(crate) fn upload(data: TensorData, device: &Arc<CudaDevice>) -> Result<CudaTensor> {
    if matches!(data.dtype, DType::QFloat(_)) {
        return Err(unsupported("quantized data".to_string()));
    }
    let (data, dtype) = storable(data);
    CudaTensor::from_bytes(device, data.as_bytes(), &data.shape, dtype)
}

/// Downloads a tensor (synchronises the stream).
pub(crate) fn download(tensor: &CudaTensor) -> Result<TensorData> {
    let bytes = tensor.to_bytes()?;
    Ok(TensorData::from_bytes_vec(
        bytes,
        tensor.shape().to_vec(),
        burn_dtype(tensor.dtype()),
    ))
}

/// Unwraps an engine result inside a burn op trait method, whose signature has no error
/// channel: the panic message is the engine's error, which names the op, shapes and dtype.
#[track_caller]
pub(crate) fn ok<T>(result: Result<T>) -> T {
    result.unwrap_or_else(|err| panic!("ferrotron-cuda: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_map_both_ways() {
        for engine in EDType::ALL {
            assert_eq!(engine_dtype(burn_dtype(engine)).ok(), Some(engine));
        }
        assert_eq!(
            engine_dtype(DType::Bool(BoolStore::Native)).ok(),
            Some(EDType::Bool)
        );
        assert_eq!(float_dtype(FloatDType::BF16), EDType::BF16);
        assert_eq!(int_dtype(IntDType::I16), EDType::I64);
    }

    #[test]
    fn unsupported_dtypes_name_themselves_and_the_alternatives() {
        let err = engine_dtype(DType::F64).unwrap_err().to_string();
        assert!(err.contains("F64") && err.contains("bf16"), "{err}");
    }

    #[test]
    fn burn_slices_resolve_negative_and_open_ends() {
        let args = slice_args(
            &[Slice::new(-3, None, 1), Slice::new(1, Some(-1), 2)],
            &[10, 6, 4],
        )
        .unwrap();
        assert_eq!(
            args,
            vec![
                SliceArg {
                    start: 7,
                    end: 10,
                    step: 1
                },
                SliceArg {
                    start: 1,
                    end: 5,
                    step: 2
                },
                SliceArg::full(4),
            ]
        );
        assert!(slice_args(&[Slice::full(); 4], &[1, 2, 3]).is_err());
    }

    #[test]
    fn wide_host_data_is_narrowed_to_what_is_stored() {
        let (data, dtype) = storable(TensorData::new(vec![1.5f64, -2.0], [2]));
        assert_eq!((data.dtype, dtype), (DType::F32, EDType::F32));
        let (data, dtype) = storable(TensorData::new(vec![7u16, 9], [2]));
        assert_eq!((data.dtype, dtype), (DType::I64, EDType::I64));
        assert_eq!(data.to_vec::<i64>().unwrap(), vec![7, 9]);
        let (data, dtype) = storable(TensorData::new(vec![true, false], [2]));
        assert_eq!(
            (data.as_bytes().to_vec(), dtype),
            (vec![1u8, 0], EDType::Bool)
        );
    }

    #[test]
    fn distributions_keep_their_parameters() {
        assert_eq!(
            distribution(Distribution::Default),
            EDistribution::Uniform {
                low: 0.0,
                high: 1.0
            }
        );
        assert_eq!(
            distribution(Distribution::Normal(0.5, 2.0)),
            EDistribution::Normal {
                mean: 0.5,
                std: 2.0
            }
        );
        assert_eq!(
            distribution(Distribution::Bernoulli(0.3)),
            EDistribution::Bernoulli { p: 0.3 }
        );
    }

    #[test]
    fn scalars_keep_their_kind() {
        assert_eq!(scalar(Scalar::Float(0.5)), EScalar::Float(0.5));
        assert_eq!(scalar(Scalar::UInt(3)), EScalar::Int(3));
        assert_eq!(scalar(Scalar::Bool(true)), EScalar::Bool(true));
    }
}
