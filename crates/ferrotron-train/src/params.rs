//! Stable parameter names. Burn's `ParamId`s are fresh for every model built, so anything that
//! outlives a process (checkpoints, optimizer moments) is keyed by the parameter's module path
//! (`layers.0.attn.qkv.weight`), which the derived `Module::visit`/`map` walks for us.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

/// A float tensor taken off the device: its name, shape and values (f32, row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

impl NamedTensor {
    /// The values of a tensor of any float dtype, converted to f32.
    pub fn from_tensor<B: Backend, const D: usize>(name: String, tensor: &Tensor<B, D>) -> Self {
        let shape = tensor.dims().to_vec();
        let data = tensor.to_data().convert::<f32>();
        let values = data
            .to_vec::<f32>()
            .expect("a tensor converted to f32 reads back as f32");
        NamedTensor {
            name,
            shape,
            values,
        }
    }

    pub fn to_tensor<B: Backend, const D: usize>(&self, device: &B::Device) -> Tensor<B, D> {
        Tensor::from_data(
            TensorData::new(self.values.clone(), self.shape.clone()),
            device,
        )
    }

    /// [`Self::to_tensor`] in `dtype` rather than the device's default float dtype.
    pub fn to_tensor_as<B: Backend, const D: usize>(
        &self,
        device: &B::Device,
        dtype: DType,
    ) -> Tensor<B, D> {
        Tensor::from_data(
            TensorData::new(self.values.clone(), self.shape.clone()),
            (device, dtype),
        )
    }
}

/// Where a float parameter lives and what it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamEntry {
    pub name: String,
    pub id: ParamId,
    pub shape: Vec<usize>,
}

/// Every float parameter of `module` in visiting order, with its module path as name.
pub fn param_entries<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamEntry> {
    let mut visitor = EntryCollector {
        path: Vec::new(),
        entries: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.entries
}

/// The values of every float parameter of `module`, named by module path.
pub fn named_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<NamedTensor> {
    let mut visitor = TensorCollector {
        path: Vec::new(),
        tensors: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.tensors
}

/// Replace every float parameter of `module` by the tensor of the same name. Parameter ids and
/// the `require_grad` flag are kept. Fails with the list of problems (missing names, wrong
/// shapes, names the module does not have).
pub fn load_named_tensors<B: Backend, M: Module<B>>(
    module: M,
    tensors: &HashMap<String, NamedTensor>,
) -> Result<M, Vec<String>> {
    let mut loader = TensorLoader {
        path: Vec::new(),
        tensors,
        used: Vec::new(),
        problems: Vec::new(),
    };
    let module = module.map(&mut loader);
    let mut problems = loader.problems;
    let mut unused: Vec<&String> = tensors
        .keys()
        .filter(|name| !loader.used.contains(name))
        .collect();
    unused.sort();
    problems.extend(
        unused
            .into_iter()
            .map(|name| format!("{name}: in the checkpoint but not in the model")),
    );
    if problems.is_empty() {
        Ok(module)
    } else {
        Err(problems)
    }
}

struct EntryCollector {
    path: Vec<String>,
    entries: Vec<ParamEntry>,
}

impl<B: Backend> ModuleVisitor<B> for EntryCollector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.entries.push(ParamEntry {
            name: self.path.join("."),
            id: param.id,
            shape: param.lazy_shape().to_vec(),
        });
    }
}

struct TensorCollector {
    path: Vec<String>,
    tensors: Vec<NamedTensor>,
}

impl<B: Backend> ModuleVisitor<B> for TensorCollector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.tensors
            .push(NamedTensor::from_tensor(self.path.join("."), &param.val()));
    }
}

struct TensorLoader<'a> {
    path: Vec<String>,
    tensors: &'a HashMap<String, NamedTensor>,
    used: Vec<&'a String>,
    problems: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for TensorLoader<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let name = self.path.join(".");
        let Some((key, stored)) = self.tensors.get_key_value(&name) else {
            self.problems
                .push(format!("{name}: in the model but not in the checkpoint"));
            return param;
        };
        self.used.push(key);
        let (id, tensor, mapper) = param.consume();
        if tensor.dims().as_slice() != stored.shape.as_slice() {
            self.problems.push(format!(
                "{name}: shape {:?} in the checkpoint, {:?} in the model",
                stored.shape,
                tensor.dims()
            ));
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let require_grad = tensor.is_require_grad();
        // made in the dtype of the parameter it replaces: the compute dtype, or f32 where the
        // model keeps one whatever it computes in (the MoE expert bias)
        let mut loaded: Tensor<B, D> = stored.to_tensor_as(&tensor.device(), tensor.dtype());
        if require_grad {
            loaded = loaded.require_grad();
        }
        Param::from_mapped_value(id, loaded, mapper)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};

    pub(crate) type Cpu = Flex;
    pub(crate) type CpuAutodiff = Autodiff<Flex>;

    /// A small module with nesting, a Vec, an optional bias and a bare parameter: the shapes of
    /// naming that a transformer has.
    #[derive(Module, Debug)]
    pub(crate) struct Tiny<B: Backend> {
        pub(crate) layers: Vec<Linear<B>>,
        pub(crate) scale: Param<Tensor<B, 1>>,
    }

    pub(crate) fn tiny<B: Backend>(device: &B::Device) -> Tiny<B> {
        Tiny {
            layers: vec![
                LinearConfig::new(3, 2).init(device),
                LinearConfig::new(2, 2).with_bias(false).init(device),
            ],
            scale: Param::from_tensor(Tensor::from_floats([1.0, 2.0], device)),
        }
    }

    #[test]
    fn names_are_module_paths() {
        let device = Default::default();
        let model = tiny::<Cpu>(&device);
        let names: Vec<String> = param_entries::<Cpu, _>(&model)
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            names,
            [
                "layers.0.weight",
                "layers.0.bias",
                "layers.1.weight",
                "scale"
            ]
        );
    }

    #[test]
    fn load_round_trips_and_keeps_ids() {
        let device = Default::default();
        let source = tiny::<Cpu>(&device);
        let target = tiny::<Cpu>(&device);
        let ids_before: Vec<ParamId> = param_entries::<Cpu, _>(&target)
            .iter()
            .map(|e| e.id)
            .collect();
        let saved: HashMap<String, NamedTensor> = named_tensors::<Cpu, _>(&source)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        let loaded = load_named_tensors::<Cpu, _>(target, &saved).expect("same model loads");
        let ids_after: Vec<ParamId> = param_entries::<Cpu, _>(&loaded)
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids_before, ids_after);
        let reloaded: Vec<NamedTensor> = named_tensors::<Cpu, _>(&loaded);
        for tensor in reloaded {
            assert_eq!(saved[&tensor.name], tensor);
        }
    }

    #[test]
    fn load_lists_every_problem() {
        let device = Default::default();
        let target = tiny::<Cpu>(&device);
        let mut saved: HashMap<String, NamedTensor> = named_tensors::<Cpu, _>(&target)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        saved.remove("scale");
        saved.get_mut("layers.1.weight").expect("present").shape = vec![4];
        saved.insert(
            "extra".into(),
            NamedTensor {
                name: "extra".into(),
                shape: vec![1],
                values: vec![0.0],
            },
        );
        let problems = load_named_tensors::<Cpu, _>(target, &saved).expect_err("must refuse");
        assert_eq!(
            problems,
            [
                "layers.1.weight: shape [4] in the checkpoint, [2, 2] in the model",
                "scale: in the model but not in the checkpoint",
                "extra: in the checkpoint but not in the model",
            ]
        );
    }
}
