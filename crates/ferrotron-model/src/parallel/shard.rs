//! One rule per layer says how each of its parameters is split over ranks. Cutting a rank's
//! shard out of the full one-rank model and reporting its [`ParamRole`]s both read that rule, so
//! the tensors a rank holds and what the runtime and checkpoints believe it holds cannot drift.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ferrotron_parallel::{ParamRole, ShardError, ShardSpec, Split};

use super::TensorParallel;
use crate::ModelError;

/// How one parameter sits in its one-rank tensor and how its gradient is reduced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Applied in order; empty for a replicated parameter.
    pub splits: Vec<Split>,
    pub tp_partial: bool,
    pub tp_duplicate: bool,
    pub expert: bool,
    pub tied_embedding: bool,
}

impl Placement {
    /// Replicated over `tp`: norm weights, row-parallel biases, position embeddings. With
    /// sequence parallelism each rank sees only its part of the sequence, so the gradient is a
    /// partial sum over tp.
    pub fn replicated(tp: &TensorParallel) -> Self {
        Placement {
            tp_partial: tp.sequence_parallel,
            tp_duplicate: tp.size() > 1,
            ..Placement::default()
        }
    }

    /// Piece `tp.rank()` of `tp.size()` of each of `parts` fused blocks along `dim`.
    pub fn split(tp: &TensorParallel, dim: usize, parts: usize) -> Self {
        Placement {
            splits: vec![Split::fused(dim, parts, tp.rank(), tp.size())],
            ..Placement::default()
        }
    }
}

/// A copy of `module` (a full one-rank module) holding only this rank's pieces: every float
/// parameter `p` at module path `name` becomes `rule(name)`'s shard of `p`. Parameters get fresh
/// ids and keep their `require_grad` flag; non-float state is copied.
pub(crate) fn cut_module<B: Backend, M: Module<B>>(
    module: &M,
    rule: impl Fn(&str) -> Placement,
) -> Result<M, ModelError> {
    let mut cutter = Cutter {
        path: Vec::new(),
        rule,
        error: None,
    };
    let cut = module.clone().map(&mut cutter);
    match cutter.error {
        Some(error) => Err(error.into()),
        None => Ok(cut),
    }
}

/// The [`ParamRole`] of every float parameter of `module` (a rank's local module), named
/// `prefix.<module path>`; `no_weight_decay` follows Megatron (every 1-D parameter).
pub(crate) fn roles_of<B: Backend, M: Module<B>>(
    module: &M,
    prefix: &str,
    rule: impl Fn(&str) -> Placement,
) -> Vec<ParamRole> {
    let mut collector = RoleCollector {
        path: Vec::new(),
        prefix,
        rule,
        roles: Vec::new(),
    };
    module.visit(&mut collector);
    collector.roles
}

struct Cutter<F> {
    path: Vec<String>,
    rule: F,
    error: Option<ShardError>,
}

impl<B: Backend, F: Fn(&str) -> Placement> ModuleMapper<B> for Cutter<F> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let name = self.path.join(".");
        let (_, tensor, mapper) = param.consume();
        let spec = ShardSpec {
            global_name: name.clone(),
            global_shape: tensor.dims().to_vec(),
            splits: (self.rule)(&name).splits,
        };
        let require_grad = tensor.is_require_grad();
        let device = tensor.device();
        let local = match spec.slice_of(&tensor.to_data()) {
            Ok(data) => Tensor::<B, D>::from_data(data, &device),
            Err(error) => {
                self.error.get_or_insert(error);
                tensor.detach()
            }
        };
        let local = if require_grad {
            local.require_grad()
        } else {
            local
        };
        Param::from_mapped_value(ParamId::new(), local, mapper)
    }
}

struct RoleCollector<'a, F> {
    path: Vec<String>,
    prefix: &'a str,
    rule: F,
    roles: Vec<ParamRole>,
}

impl<B: Backend, F: Fn(&str) -> Placement> ModuleVisitor<B> for RoleCollector<'_, F> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let local_name = self.path.join(".");
        let placement = (self.rule)(&local_name);
        let mut global_shape = param.lazy_shape().to_vec();
        for split in &placement.splits {
            global_shape[split.dim] *= split.count;
        }
        let global_name = if self.prefix.is_empty() {
            local_name
        } else {
            format!("{}.{local_name}", self.prefix)
        };
        self.roles.push(ParamRole {
            id: param.id,
            shard: ShardSpec {
                global_name,
                global_shape,
                splits: placement.splits,
            },
            expert: placement.expert,
            tp_partial: placement.tp_partial,
            tp_duplicate: placement.tp_duplicate,
            tied_embedding: placement.tied_embedding,
            no_weight_decay: D == 1,
        });
    }
}
