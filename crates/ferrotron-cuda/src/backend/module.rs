//! `ModuleOps` for [`Cuda`]: what language models use, and a clear stop for what they do not.
//!
//! Embedding (and its backward, an atomic `select_add`) and layer norm come from burn's defaults
//! over our tensor ops; linear and its three backward passes are single cuBLASLt GEMMs
//! (`crate::blas::linear`: batch folded into M, bias epilogue, one weight-gradient GEMM). Attention
//! is burn's decomposition (matmul, masked softmax, matmul) on our kernels until the fused
//! flash-attention extension lands. 1-D/2-D convolutions (and their transposes and backward passes)
//! are im2col + matmul ([`conv`]). 3-D convolution, pooling, interpolation, deformable convolution
//! and FFTs are image/signal ops that no Ferrotron model reaches; they stop with a message naming
//! the op instead of computing something half-tested.

use burn::tensor::ops::attention::attention_fallback;
use burn::tensor::ops::{
    AttentionModuleOptions, BoolTensor, ConvOptions, ConvTransposeOptions, DeformConv2dBackward,
    DeformConvOptions, FloatTensor, IntTensor, InterpolateOptions, MaxPool2dBackward,
    MaxPool2dWithIndices, ModuleOps,
};

use super::convert::ok;
use super::{Cuda, conv};

/// The ops this backend stops on, listed once for the README and the test that checks it.
pub(super) const UNIMPLEMENTED_MODULE_OPS: &[&str] = &[
    "conv3d",
    "conv_transpose3d",
    "deform_conv2d",
    "deform_conv2d_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool2d_backward",
    "max_pool2d",
    "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward",
    "interpolate",
    "interpolate_backward",
    "rfft",
    "irfft",
];

fn not_implemented(op: &str) -> ! {
    debug_assert!(UNIMPLEMENTED_MODULE_OPS.contains(&op));
    panic!(
        "ferrotron-cuda does not implement {op}: it serves language models (no 3-D convolution, \
         pooling, interpolation or FFT); run this model on burn-flex or burn-cuda"
    )
}

impl ModuleOps<Cuda> for Cuda {
    fn conv2d(
        x: FloatTensor<Cuda>,
        weight: FloatTensor<Cuda>,
        bias: Option<FloatTensor<Cuda>>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Cuda> {
        ok(conv::conv2d(&x, &weight, bias.as_ref(), &options))
    }

    fn deform_conv2d(
        _x: FloatTensor<Cuda>,
        _offset: FloatTensor<Cuda>,
        _weight: FloatTensor<Cuda>,
        _mask: Option<FloatTensor<Cuda>>,
        _bias: Option<FloatTensor<Cuda>>,
        _options: DeformConvOptions<2>,
    ) -> FloatTensor<Cuda> {
        not_implemented("deform_conv2d")
    }

    fn deform_conv2d_backward(
        _x: FloatTensor<Cuda>,
        _offset: FloatTensor<Cuda>,
        _weight: FloatTensor<Cuda>,
        _mask: Option<FloatTensor<Cuda>>,
        _bias: Option<FloatTensor<Cuda>>,
        _output_grad: FloatTensor<Cuda>,
        _options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Cuda> {
        not_implemented("deform_conv2d_backward")
    }

    fn conv3d(
        _x: FloatTensor<Cuda>,
        _weight: FloatTensor<Cuda>,
        _bias: Option<FloatTensor<Cuda>>,
        _options: ConvOptions<3>,
    ) -> FloatTensor<Cuda> {
        not_implemented("conv3d")
    }

    fn conv_transpose2d(
        x: FloatTensor<Cuda>,
        weight: FloatTensor<Cuda>,
        bias: Option<FloatTensor<Cuda>>,
        options: ConvTransposeOptions<2>,
    ) -> FloatTensor<Cuda> {
        ok(conv::conv_transpose2d(&x, &weight, bias.as_ref(), &options))
    }

    fn conv_transpose3d(
        _x: FloatTensor<Cuda>,
        _weight: FloatTensor<Cuda>,
        _bias: Option<FloatTensor<Cuda>>,
        _options: ConvTransposeOptions<3>,
    ) -> FloatTensor<Cuda> {
        not_implemented("conv_transpose3d")
    }

    fn avg_pool2d(
        _x: FloatTensor<Cuda>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _count_include_pad: bool,
        _ceil_mode: bool,
    ) -> FloatTensor<Cuda> {
        not_implemented("avg_pool2d")
    }

    fn avg_pool2d_backward(
        _x: FloatTensor<Cuda>,
        _grad: FloatTensor<Cuda>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _count_include_pad: bool,
        _ceil_mode: bool,
    ) -> FloatTensor<Cuda> {
        not_implemented("avg_pool2d_backward")
    }

    fn adaptive_avg_pool2d(_x: FloatTensor<Cuda>, _output_size: [usize; 2]) -> FloatTensor<Cuda> {
        not_implemented("adaptive_avg_pool2d")
    }

    fn adaptive_avg_pool2d_backward(
        _x: FloatTensor<Cuda>,
        _grad: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        not_implemented("adaptive_avg_pool2d_backward")
    }

    fn max_pool2d(
        _x: FloatTensor<Cuda>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _dilation: [usize; 2],
        _ceil_mode: bool,
    ) -> FloatTensor<Cuda> {
        not_implemented("max_pool2d")
    }

    fn max_pool2d_with_indices(
        _x: FloatTensor<Cuda>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _dilation: [usize; 2],
        _ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Cuda> {
        not_implemented("max_pool2d_with_indices")
    }

    fn max_pool2d_with_indices_backward(
        _x: FloatTensor<Cuda>,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _dilation: [usize; 2],
        _ceil_mode: bool,
        _output_grad: FloatTensor<Cuda>,
        _indices: IntTensor<Cuda>,
    ) -> MaxPool2dBackward<Cuda> {
        not_implemented("max_pool2d_with_indices_backward")
    }

    fn interpolate(
        _x: FloatTensor<Cuda>,
        _output_size: [usize; 2],
        _options: InterpolateOptions,
    ) -> FloatTensor<Cuda> {
        not_implemented("interpolate")
    }

    fn interpolate_backward(
        _x: FloatTensor<Cuda>,
        _grad: FloatTensor<Cuda>,
        _output_size: [usize; 2],
        _options: InterpolateOptions,
    ) -> FloatTensor<Cuda> {
        not_implemented("interpolate_backward")
    }

    fn linear(
        x: FloatTensor<Cuda>,
        weight: FloatTensor<Cuda>,
        bias: Option<FloatTensor<Cuda>>,
    ) -> FloatTensor<Cuda> {
        ok(crate::blas::linear::linear(&x, &weight, bias.as_ref()))
    }

    fn linear_x_backward(
        weight: FloatTensor<Cuda>,
        output_grad: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        ok(crate::blas::linear::linear_x_backward(
            &weight,
            &output_grad,
        ))
    }

    fn linear_weight_backward(
        x: FloatTensor<Cuda>,
        output_grad: FloatTensor<Cuda>,
    ) -> FloatTensor<Cuda> {
        ok(crate::blas::linear::linear_weight_backward(
            &x,
            &output_grad,
        ))
    }

    fn linear_bias_backward(output_grad: FloatTensor<Cuda>) -> FloatTensor<Cuda> {
        ok(crate::blas::linear::linear_bias_backward(&output_grad))
    }

    fn attention(
        query: FloatTensor<Cuda>,
        key: FloatTensor<Cuda>,
        value: FloatTensor<Cuda>,
        mask: Option<BoolTensor<Cuda>>,
        attn_bias: Option<FloatTensor<Cuda>>,
        options: AttentionModuleOptions,
    ) -> FloatTensor<Cuda> {
        attention_fallback::<Cuda>(query, key, value, mask, attn_bias, options)
    }

    fn rfft(
        _signal: FloatTensor<Cuda>,
        _dim: usize,
        _n: Option<usize>,
    ) -> (FloatTensor<Cuda>, FloatTensor<Cuda>) {
        not_implemented("rfft")
    }

    fn irfft(
        _spectrum_re: FloatTensor<Cuda>,
        _spectrum_im: FloatTensor<Cuda>,
        _dim: usize,
        _n: Option<usize>,
    ) -> FloatTensor<Cuda> {
        not_implemented("irfft")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimplemented_ops_say_which_op_and_what_to_use_instead() {
        let payload = std::panic::catch_unwind(|| not_implemented("rfft")).unwrap_err();
        let message = payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(message.contains("does not implement rfft"), "{message}");
        assert!(message.contains("burn-flex"), "{message}");
    }
}
