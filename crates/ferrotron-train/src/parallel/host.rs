//! Parameters and gradients by `ParamId`, on the host as flat f32. Communicators move flat
//! buffers (as NCCL does), and burn's `GradientsParams` can only be read with the tensor's rank
//! known at compile time, which a module visitor supplies; these helpers do that walk once so the
//! rest of the runtime deals in `Vec<f32>`.

use std::collections::HashMap;
use std::marker::PhantomData;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

/// The values of a tensor as f32, row-major.
pub(super) fn to_vec<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("a tensor converted to f32 reads back as f32")
}

/// Shapes of every float parameter of `module`.
pub(super) fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<usize>> {
    struct Shapes(HashMap<ParamId, Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.insert(param.id, param.lazy_shape().to_vec());
        }
    }
    let mut shapes = Shapes(HashMap::new());
    module.visit(&mut shapes);
    shapes.0
}

/// Values of every float parameter of `module`.
pub(super) fn param_values<B: Backend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<f32>> {
    struct Values(HashMap<ParamId, Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.insert(param.id, to_vec(param.val()));
        }
    }
    let mut values = Values(HashMap::new());
    module.visit(&mut values);
    values.0
}

/// Replace the parameters named in `values` (same element count as the parameter); ids and the
/// `require_grad` flag are kept, others are untouched.
pub(super) fn set_param_values<B: Backend, M: Module<B>>(
    module: M,
    values: &HashMap<ParamId, &[f32]>,
) -> M {
    struct Setter<'a>(&'a HashMap<ParamId, &'a [f32]>);
    impl<B: Backend> ModuleMapper<B> for Setter<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let Some(values) = self.0.get(&param.id) else {
                return param;
            };
            let (id, tensor, mapper) = param.consume();
            let require_grad = tensor.is_require_grad();
            let data = TensorData::new(values.to_vec(), tensor.dims().to_vec());
            let mut fresh = Tensor::<B, D>::from_data(data, &tensor.device());
            if require_grad {
                fresh = fresh.require_grad();
            }
            Param::from_mapped_value(id, fresh, mapper)
        }
    }
    module.map(&mut Setter(values))
}

/// The gradients `grads` holds for `module`'s parameters, as f32 (absent: no gradient).
pub(super) fn grad_values<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &GradientsParams,
) -> HashMap<ParamId, Vec<f32>> {
    struct Reader<'a, I: Backend> {
        grads: &'a GradientsParams,
        out: HashMap<ParamId, Vec<f32>>,
        inner: PhantomData<I>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Reader<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.out.insert(param.id, to_vec(grad));
            }
        }
    }
    let mut reader = Reader::<B::InnerBackend> {
        grads,
        out: HashMap::new(),
        inner: PhantomData,
    };
    module.visit(&mut reader);
    reader.out
}

/// `GradientsParams` for `module` from host values (parameters absent from `values` get none).
pub(super) fn grads_from_values<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    values: &HashMap<ParamId, &[f32]>,
) -> GradientsParams {
    struct Writer<'a, I: Backend> {
        values: &'a HashMap<ParamId, &'a [f32]>,
        grads: GradientsParams,
        inner: PhantomData<I>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Writer<'_, B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(values) = self.values.get(&param.id) else {
                return;
            };
            let tensor = param.val();
            let data = TensorData::new(values.to_vec(), tensor.dims().to_vec());
            let grad = Tensor::<B::InnerBackend, D>::from_data(data, &tensor.device());
            self.grads.register::<B::InnerBackend, D>(param.id, grad);
        }
    }
    let mut writer = Writer::<B::InnerBackend> {
        values,
        grads: GradientsParams::new(),
        inner: PhantomData,
    };
    module.visit(&mut writer);
    writer.grads
}

/// `module` with every trainable parameter replaced by a fresh leaf over the same values.
pub(super) fn private_leaves<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> M {
    struct Fresh;
    impl<B: AutodiffBackend> ModuleMapper<B> for Fresh {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let fresh = if tensor.is_require_grad() {
                tensor.detach().require_grad()
            } else {
                tensor
            };
            Param::from_mapped_value(id, fresh, mapper)
        }
    }
    module.clone().map(&mut Fresh)
}
