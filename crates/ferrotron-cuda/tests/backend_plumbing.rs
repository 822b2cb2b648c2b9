//! GPU-free checks of the burn backend's plumbing, run by CI: the type-level contract (it is a
//! burn `Backend`, `Autodiff<Cuda>` is an autodiff backend, the dtypes burn will pick), and what
//! a user sees when something cannot work (no GPU, an unsupported op or dtype). Numerics are
//! the GPU op table's job (`gpu_check`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{BoolStore, DType, FloatDType, Tensor, TensorData, get_device_settings};
use ferrotron_cuda::{Cuda, GpuDevice, driver_available};

fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn is_backend<B: Backend>() -> &'static str {
    std::any::type_name::<B>()
}

fn is_autodiff<B: AutodiffBackend>() -> &'static str {
    std::any::type_name::<B::InnerBackend>()
}

#[test]
fn cuda_is_a_burn_backend_and_autodiff_wraps_it() {
    assert!(is_backend::<Cuda>().ends_with("Cuda"));
    assert!(is_autodiff::<Autodiff<Cuda>>().ends_with("Cuda"));
}

#[test]
fn burn_resolves_f32_i64_and_byte_bools_as_defaults() {
    let settings = get_device_settings::<Autodiff<Cuda>>(&GpuDevice::new(5));
    assert_eq!(settings.float_dtype, FloatDType::F32);
    assert_eq!(DType::from(settings.int_dtype), DType::I64);
    assert_eq!(DType::from(settings.bool_dtype), DType::Bool(BoolStore::U8));
    assert!(Cuda::supports_dtype(&GpuDevice::new(0), DType::BF16));
    assert!(!Cuda::supports_dtype(&GpuDevice::new(0), DType::F64));
}

#[test]
fn without_a_gpu_tensor_creation_says_why() {
    if driver_available() {
        return; // This test is about machines without a driver (CI).
    }
    let message = panic_message(|| {
        let _ =
            Tensor::<Cuda, 1>::from_data(TensorData::new(vec![1.0f32], [1]), &GpuDevice::new(0));
    });
    assert!(message.starts_with("ferrotron-cuda:"), "{message}");
    assert!(message.contains("CUDA driver"), "{message}");
    assert_eq!(Cuda::device_count(0), 0);
}

#[test]
fn quantization_is_refused_by_name() {
    use burn::tensor::ops::QTensorOps;
    let message = panic_message(|| {
        let _ = Cuda::q_from_data(TensorData::new(vec![1i8], [1]), &GpuDevice::new(0));
    });
    assert!(
        message.contains("does not implement quantized tensors (q_from_data)"),
        "{message}"
    );
}
