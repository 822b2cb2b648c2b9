//! Mixed precision the way Megatron does it: the model's parameters and all its compute in a
//! 16-bit dtype (`precision.dtype`: bf16 by default, fp16), while everything that accumulates
//! small increments stays in fp32 — the master copy of each parameter, the Adam moments, the
//! gradients summed over microbatches and their global norm. A 16-bit parameter alone cannot
//! train: near 1.0 a bf16 step is 2⁻⁷, so an update of `lr · 1` with `lr = 3e-4` rounds away and
//! the weight never moves; the fp32 master copy keeps those increments.
//!
//! The compute dtype is the device's *default float dtype* (burn 0.21's device settings), set
//! once by the caller before the first tensor is created on the device. Every tensor the model
//! creates — parameters at init, positions, masks, loaded checkpoints — then shares one dtype, so
//! no op ever sees two float dtypes (burn does not promote; backends reject mixed operands). The
//! step reads the dtype back from the parameters themselves: an fp32 parameter is its own master,
//! nothing is copied or cast, and the fp32 path (every CPU run) is bit-identical to a run without
//! this module.
//!
//! Rule for backends: the CPU backend (burn-flex) always computes in fp32 whatever the recipe
//! says — it has bf16 storage and arithmetic, but emulated, slower than fp32 and with no
//! accuracy to gain; GPU backends follow `precision.dtype`. fp16 needs loss scaling (its range
//! underflows small gradients), which the runtime does not have yet, so it is refused.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::set_default_float_dtype;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Tensor};
use ferrotron_recipe::Dtype;

use crate::TrainError;

/// The dtype the model computes in on a GPU backend for the recipe's `precision.dtype`.
pub fn compute_dtype(dtype: Dtype) -> Result<FloatDType, TrainError> {
    match dtype {
        Dtype::Bf16 => Ok(FloatDType::BF16),
        Dtype::Fp32 => Ok(FloatDType::F32),
        Dtype::Fp16 => Err(TrainError::Config(
            "precision.dtype fp16 needs loss scaling, which the runtime does not implement yet; \
             use bf16 (same tensor-core speed on Ampere and later, fp32's range) or fp32"
                .into(),
        )),
    }
}

/// Make `dtype` the default float dtype of `device`, so the model's parameters and every tensor
/// it creates are in it. Call before any tensor exists on the device; calling again with the
/// same dtype is fine, a different one is an error (burn fixes a device's defaults on first use).
pub fn use_compute_dtype<B: Backend>(
    device: &B::Device,
    dtype: FloatDType,
) -> Result<(), TrainError> {
    match set_default_float_dtype::<B>(device, dtype) {
        Ok(()) => Ok(()),
        Err(err) => {
            let current = burn::tensor::get_device_settings::<B>(device).float_dtype;
            if current == dtype {
                Ok(())
            } else {
                Err(TrainError::Config(format!(
                    "cannot compute in {dtype:?} on {device:?}: {err} (the device already \
                     computes in {current:?})"
                )))
            }
        }
    }
}

/// `tensor` in fp32: the identity (no op, no copy) for a tensor that already is.
pub fn to_fp32<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Tensor<B, D> {
    tensor.cast(FloatDType::F32)
}

/// Widen every gradient of `model` that is not fp32 (a 16-bit parameter's) to fp32, so the
/// microbatch sum, the global norm and the optimizer see fp32. Gradients already in fp32 are left
/// exactly as they are.
pub fn grads_to_fp32<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    mut grads: GradientsParams,
) -> GradientsParams {
    let mut widen = WidenGrads::<B::InnerBackend> {
        grads: &mut grads,
        _inner: std::marker::PhantomData,
    };
    model.visit(&mut widen);
    grads
}

struct WidenGrads<'a, I: Backend> {
    grads: &'a mut GradientsParams,
    _inner: std::marker::PhantomData<I>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for WidenGrads<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let narrow = self
            .grads
            .get::<B::InnerBackend, D>(param.id)
            .is_some_and(|grad| !is_fp32(grad.dtype()));
        if narrow && let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, to_fp32(grad));
        }
    }
}

fn is_fp32(dtype: burn::tensor::DType) -> bool {
    dtype == burn::tensor::DType::F32
}

/// fp32 master copies of the parameters that live in a 16-bit dtype, flattened, keyed by
/// parameter. The optimizer updates the master copy and hands the model its rounded value.
#[derive(Debug, Clone)]
pub struct MasterWeights<I: Backend> {
    weights: HashMap<ParamId, Tensor<I, 1>>,
}

impl<I: Backend> Default for MasterWeights<I> {
    fn default() -> Self {
        MasterWeights {
            weights: HashMap::new(),
        }
    }
}

impl<I: Backend> MasterWeights<I> {
    /// The fp32 value of parameter `id` to update: its master copy when it has one, else the
    /// parameter's own value widened (the first step of a 16-bit parameter; an fp32 parameter is
    /// passed through untouched).
    pub fn take(&mut self, id: ParamId, param: Tensor<I, 1>) -> Tensor<I, 1> {
        match self.weights.remove(&id) {
            Some(master) => master,
            None => to_fp32(param),
        }
    }

    /// The dtype of the rounded copy an update of a `dtype` parameter must also write: its own
    /// for a 16-bit parameter (which has an fp32 master), none for an fp32 one (its own master).
    pub fn rounded_dtype(dtype: burn::tensor::DType) -> Option<burn::tensor::DType> {
        (!is_fp32(dtype)).then_some(dtype)
    }

    /// Keep the updated fp32 `value` of parameter `id` and return the parameter's new value:
    /// the `rounded` copy the update wrote for a 16-bit parameter (then `value` becomes its
    /// master), or `value` itself for an fp32 parameter, which is its own master.
    pub fn keep(
        &mut self,
        id: ParamId,
        value: Tensor<I, 1>,
        rounded: Option<Tensor<I, 1>>,
    ) -> Tensor<I, 1> {
        match rounded {
            Some(rounded) => {
                self.weights.insert(id, value);
                rounded
            }
            None => value,
        }
    }

    /// How many parameters have an fp32 master copy (0 in an fp32 run).
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// The master copy of parameter `id`, flattened, if it has one.
    pub fn get(&self, id: ParamId) -> Option<&Tensor<I, 1>> {
        self.weights.get(&id)
    }

    /// Restore the master copy of parameter `id` (a checkpoint's fp32 values, flattened).
    pub fn insert(&mut self, id: ParamId, value: Tensor<I, 1>) {
        self.weights.insert(id, value);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::tensor::{DType, TensorData};

    use super::*;
    use crate::{AdamW, AdamWConfig, clip_coefficient, global_grad_norm};

    type Cpu = Flex;
    type CpuAutodiff = Autodiff<Flex>;

    /// One bare parameter, in whatever dtype the test builds it.
    #[derive(Module, Debug)]
    struct Weight<B: Backend> {
        value: Param<Tensor<B, 1>>,
    }

    fn weight(dtype: DType) -> Weight<CpuAutodiff> {
        let device = Default::default();
        let data = TensorData::from([1.0f32, -1.0, 0.5]);
        Weight {
            value: Param::from_tensor(Tensor::from_data(data, (&device, dtype))),
        }
    }

    /// loss = Σ c ⊙ w with c = [1, −2, 4], in the parameter's dtype: the gradient is c.
    fn grads(model: &Weight<CpuAutodiff>) -> GradientsParams {
        let device = Default::default();
        let dtype = model.value.val().dtype();
        let c = Tensor::<CpuAutodiff, 1>::from_data(
            TensorData::from([1.0f32, -2.0, 4.0]),
            (&device, dtype),
        );
        let loss = (model.value.val() * c).sum();
        GradientsParams::from_grads(loss.backward(), model)
    }

    fn values(model: &Weight<CpuAutodiff>) -> Vec<f32> {
        model
            .value
            .val()
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32 values")
    }

    fn adamw() -> AdamW<Cpu> {
        AdamW::new(
            AdamWConfig {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.0,
                moment_dtypes: ferrotron_ops::F32_MOMENTS,
                main_grads_dtype: burn::tensor::DType::F32,
                offload_fraction: None,
            },
            HashSet::new(),
        )
    }

    /// Train both models `steps` times with `lr`; returns (bf16 run's params, its master copy,
    /// the fp32 run's params).
    fn train_both(steps: usize, lr: f64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut low = weight(DType::BF16);
        let mut full = weight(DType::F32);
        let (mut opt_low, mut opt_full) = (adamw(), adamw());
        for _ in 0..steps {
            let g = grads_to_fp32::<CpuAutodiff, _>(&low, grads(&low));
            low = opt_low.step(low, g, lr, 1.0);
            let g = grads_to_fp32::<CpuAutodiff, _>(&full, grads(&full));
            full = opt_full.step(full, g, lr, 1.0);
        }
        let master = opt_low
            .master_weights()
            .get(low.value.id)
            .expect("a bf16 parameter has a master copy")
            .to_data()
            .to_vec::<f32>()
            .expect("the master copy is fp32");
        (values(&low), master, values(&full))
    }

    #[test]
    fn gradients_of_bf16_parameters_become_fp32_and_fp32_ones_stay() {
        let low = weight(DType::BF16);
        let g = grads(&low);
        assert_eq!(
            g.get::<Cpu, 1>(low.value.id).expect("grad").dtype(),
            DType::BF16
        );
        let widened = grads_to_fp32::<CpuAutodiff, _>(&low, g);
        let grad = widened.get::<Cpu, 1>(low.value.id).expect("grad");
        assert_eq!(grad.dtype(), DType::F32);
        assert_eq!(
            grad.to_data().to_vec::<f32>().expect("f32"),
            [1.0, -2.0, 4.0]
        );
        // global-norm clipping then runs in fp32: sqrt(1 + 4 + 16)
        let norm = global_grad_norm::<CpuAutodiff, _>(&low, &widened);
        assert!((norm - 21f64.sqrt()).abs() < 1e-6, "{norm}");
        assert!(clip_coefficient(norm, 1.0) < 1.0);

        let full = weight(DType::F32);
        let g = grads(&full);
        let before = g.get::<Cpu, 1>(full.value.id).expect("grad").into_data();
        let after = grads_to_fp32::<CpuAutodiff, _>(&full, g)
            .get::<Cpu, 1>(full.value.id)
            .expect("grad")
            .into_data();
        assert_eq!(before, after);
    }

    #[test]
    fn master_weights_keep_updates_bf16_cannot_hold() {
        // Adam's first steps move each weight by about lr·sign(g) = 1e-3 per step, below half
        // of bf16's spacing at 1.0 (2⁻⁸ ≈ 3.9e-3): a bf16 weight updated in place would round
        // back to 1.0 every step and never move.
        let (low, master, full) = train_both(10, 1e-3);
        // the fp32 master copy follows the fp32 run (Adam's update does not depend on the
        // gradient's scale, and the gradients are exact in bf16 here)
        for (m, f) in master.iter().zip(&full) {
            assert!((m - f).abs() < 1e-6, "master {master:?} vs fp32 {full:?}");
        }
        // ... and the bf16 parameters are that copy rounded, so they moved by ~1e-2
        for (l, m) in low.iter().zip(&master) {
            let rounded = burn::tensor::bf16::from_f32(*m).to_f32();
            assert_eq!(*l, rounded, "bf16 {low:?} vs master {master:?}");
        }
        assert!((low[0] - 1.0).abs() > 5e-3, "the weight moved: {low:?}");
    }

    #[test]
    fn fp32_parameters_have_no_master_copy() {
        let mut model = weight(DType::F32);
        let mut optimizer = adamw();
        let g = grads_to_fp32::<CpuAutodiff, _>(&model, grads(&model));
        model = optimizer.step(model, g, 1e-3, 1.0);
        assert!(optimizer.master_weights().is_empty());
        assert_eq!(model.value.val().dtype(), DType::F32);
    }

    #[test]
    fn bf16_parameters_stay_bf16_and_moments_are_fp32() {
        let mut model = weight(DType::BF16);
        let mut optimizer = adamw();
        let g = grads_to_fp32::<CpuAutodiff, _>(&model, grads(&model));
        model = optimizer.step(model, g, 1e-3, 1.0);
        assert_eq!(model.value.val().dtype(), DType::BF16);
        let entries = crate::param_entries::<CpuAutodiff, _>(&model);
        let state = optimizer.state_tensors(&entries);
        assert_eq!(state.len(), 2);
        // m = (1 − β1)·g exactly: only fp32 moments hold 0.1·[1, −2, 4] to 1e-7
        let avg = &state[0].values;
        assert!(
            (avg[0] - 0.1).abs() < 1e-7 && (avg[2] - 0.4).abs() < 1e-7,
            "{avg:?}"
        );
    }

    #[test]
    fn recipe_dtypes_map_to_compute_dtypes() {
        assert_eq!(compute_dtype(Dtype::Bf16).ok(), Some(FloatDType::BF16));
        assert_eq!(compute_dtype(Dtype::Fp32).ok(), Some(FloatDType::F32));
        let err = compute_dtype(Dtype::Fp16).expect_err("fp16 is refused");
        assert!(err.to_string().contains("loss scaling"), "{err}");
    }
}
