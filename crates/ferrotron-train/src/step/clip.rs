//! Global gradient-norm clipping. burn 0.21 clips each tensor on its own, which changes the
//! direction of the update; Megatron (and every large-model recipe) clips by the L2 norm of
//! all gradients together, so the update keeps its direction and only its length shrinks.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

/// [`clip_coefficient`] computed on the device from the sum of squares, in f32, so the step
/// never waits for the norm; `None` when clipping is off.
pub(crate) fn device_clip_coefficient<I: Backend>(
    sum_of_squares: &Tensor<I, 1>,
    max_norm: f64,
) -> Option<Tensor<I, 1>> {
    (max_norm > 0.0).then(|| {
        sum_of_squares
            .clone()
            .cast(burn::tensor::DType::F32)
            .sqrt()
            .add_scalar(1e-6)
            .recip()
            .mul_scalar(max_norm)
            .clamp_max(1.0)
    })
}

/// [`clip_coefficient`] of the norm `√sum_of_squares`, computed on the device in f64 and
/// rounded to f32 (`[1]`): the host's coefficient to the bit (square root, sum and quotient are
/// correctly rounded in both), without waiting for the norm. 1 when clipping is off.
pub(crate) fn exact_device_clip_coefficient<I: Backend>(
    sum_of_squares: &Tensor<I, 1>,
    max_norm: f64,
) -> Tensor<I, 1> {
    let device = sum_of_squares.device();
    let scalar = |value: f64| {
        Tensor::<I, 1>::from_data(TensorData::new(vec![value], [1]), (&device, DType::F64))
    };
    if max_norm <= 0.0 {
        return scalar(1.0).cast(DType::F32);
    }
    let norm = sum_of_squares.clone().cast(DType::F64).sqrt();
    scalar(max_norm)
        .div(norm + scalar(1e-6))
        .clamp_max(1.0)
        .cast(DType::F32)
}

/// The factor gradients are multiplied by so their global norm is at most `max_norm`
/// (Megatron: `max_norm / (norm + 1e-6)` when below 1; `max_norm` 0 disables clipping).
pub(crate) fn clip_coefficient(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0.0 {
        return 1.0;
    }
    let coefficient = max_norm / (norm + 1e-6);
    coefficient.min(1.0)
}

/// The norm per tensor, as the host step computed it before every step kept its gradients in
/// flat buffers: the reference the flat buffers' `Σ g²` is tested against (the same bits).
#[cfg(test)]
pub(crate) mod per_tensor {
    use burn::module::{AutodiffModule, ModuleVisitor, Param};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::Backend;
    use burn::tensor::cast::ToElement;
    use burn::tensor::{Tensor, TensorPrimitive};
    use ferrotron_ops::{FusedOps, OrderedSum};

    use crate::run::host_read::read_to_host;

    /// The L2 norm of all gradients of `model` together (one device sync), per tensor: the
    /// reference the steps' flat norm is tested against.
    pub(crate) fn global_grad_norm<B, M>(model: &M, grads: &GradientsParams) -> f64
    where
        B: crate::TrainBackend,
        M: AutodiffModule<B>,
    {
        match grad_sum_of_squares::<B, M>(model, grads) {
            Some(total) => read_to_host(|| total.into_scalar().to_f64()).sqrt(),
            None => 0.0,
        }
    }

    /// The sum of squares of all gradients of `model`, left on the device (`[1]` f32; `None`: no
    /// gradients), one [`FusedOps::sum_of_squares`] per parameter (one reduction kernel on a GPU,
    /// reading a 16-bit gradient as it is), added in model order by [`OrderedSum`] (as the flat
    /// buffers' `composed_segment_sum_of_squares` adds them, so both give the same bits).
    pub(crate) fn grad_sum_of_squares<B, M>(
        model: &M,
        grads: &GradientsParams,
    ) -> Option<Tensor<B::InnerBackend, 1>>
    where
        B: crate::TrainBackend,
        M: AutodiffModule<B>,
    {
        let mut visitor = SquaredNorm::<B::InnerBackend> { grads, total: None };
        model.visit(&mut visitor);
        visitor.total.map(OrderedSum::total)
    }

    struct SquaredNorm<'a, I: Backend> {
        grads: &'a GradientsParams,
        total: Option<OrderedSum<I>>,
    }

    impl<B: crate::TrainBackend> ModuleVisitor<B> for SquaredNorm<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) else {
                return;
            };
            let flat: Tensor<B::InnerBackend, 1> = grad.flatten(0, D - 1);
            let squares = Tensor::from_primitive(TensorPrimitive::Float(
                <B::InnerBackend as FusedOps>::sum_of_squares(flat.into_primitive().tensor()),
            ));
            self.total = Some(OrderedSum::add(self.total.take(), squares));
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::optim::GradientsParams;
    use burn::tensor::cast::ToElement;

    use super::per_tensor::*;
    use super::*;
    use crate::params::tests::{CpuAutodiff, tiny};

    type Cpu = crate::CpuBackend;

    #[test]
    fn norm_spans_all_parameters() {
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        // loss = Σ 3·scale + Σ layers.0.bias: grads are 3 (×2 elements) and 1 (×2 elements),
        // so the global norm is sqrt(9 + 9 + 1 + 1) = sqrt(20); the weights get no gradient.
        let loss = model.scale.val().mul_scalar(3.0).sum()
            + model.layers[0]
                .bias
                .as_ref()
                .expect("layer 0 has a bias")
                .val()
                .sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let norm = global_grad_norm::<CpuAutodiff, _>(&model, &grads);
        assert!((norm - 20f64.sqrt()).abs() < 1e-6, "norm {norm}");
    }

    #[test]
    fn the_device_coefficient_is_the_hosts_to_the_bit() {
        let device = Default::default();
        let mut state: u64 = 7;
        for max_norm in [0.0, 0.3, 1.0, 5.0] {
            for _ in 0..200 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // sums of squares from 1e-6 to 1e6, around every max_norm²
                let exponent = (state >> 40) as f64 / (1u64 << 24) as f64 * 12.0 - 6.0;
                let squares = 10f64.powf(exponent) as f32;
                let tensor = Tensor::<Cpu, 1>::from_floats([squares], &device);
                let on_device = exact_device_clip_coefficient(&tensor, max_norm)
                    .into_scalar()
                    .to_f32();
                let host = clip_coefficient(f64::from(squares).sqrt(), max_norm) as f32;
                assert_eq!(
                    on_device.to_bits(),
                    host.to_bits(),
                    "Σg² {squares}, max {max_norm}"
                );
            }
        }
    }

    #[test]
    fn coefficient_only_ever_shrinks() {
        assert_eq!(clip_coefficient(0.5, 1.0), 1.0);
        let c = clip_coefficient(4.0, 1.0);
        assert!((c - 1.0 / (4.0 + 1e-6)).abs() < 1e-15);
        assert_eq!(clip_coefficient(1e9, 0.0), 1.0);
        // scaling by the coefficient brings the norm to the limit
        let scaled: f64 = 4.0 * c;
        assert!((scaled - 1.0).abs() < 1e-6);
    }
}
