//! Module walks the parallel runtime needs: a rank's parameter values on the host (what a
//! finished rank reports for the equivalence tests), and fresh parameter leaves for a pipeline
//! forward (`pipeline.rs` says why).

use std::collections::HashMap;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

/// The values of a tensor as f32, row-major.
pub(crate) fn to_vec<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("a tensor converted to f32 reads back as f32")
}

/// Values of every float parameter of `module`.
pub(crate) fn param_values<B: Backend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<f32>> {
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

/// `module` with every trainable parameter replaced by a fresh leaf over the same values.
pub(crate) fn private_leaves<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> M {
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
