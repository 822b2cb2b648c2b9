//! Between burn modules and shards: which of a rank's parameters it writes, under which global
//! name, and putting a checkpoint's values back into a rank's (sharded) module. Parameters are
//! matched by [`ParamRole::id`], since a rank's module paths (`layers.0` of the second pipeline
//! stage) are not the global names (`layers.4`).

use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use ferrotron_ops::FusedOps;
use ferrotron_parallel::{ParallelContext, ParamRole, ShardSpec};

use super::load::ShardedCheckpoint;
use super::tensors::{ShardTensor, ShardValues};
use crate::params::{NamedTensor, ParamEntry};
use crate::{AdamW, EXP_AVG, EXP_AVG_SQ, TrainError};

/// Whether this rank writes the parameter's shard: one copy per unique shard. Dense shards are
/// identical across data × context parallel ranks (and, when `tp_duplicate`, across tp ranks);
/// expert shards across expert-data-parallel ranks. Rank 0 of those groups writes. A tied
/// embedding's copy on the last pipeline stage is the first stage's (same gradients, same
/// update), so only the first stage writes it.
pub fn is_primary_replica(role: &ParamRole, ctx: &ParallelContext) -> bool {
    if role.tied_embedding && ctx.pp.rank() != 0 {
        return false;
    }
    if role.expert {
        ctx.edp.rank() == 0
    } else {
        ctx.dp_cp.rank() == 0 && (!role.tp_duplicate || ctx.tp.rank() == 0)
    }
}

/// The spec of an optimizer moment: its parameter's, named `<global name>.<suffix>`.
pub fn moment_spec(param: &ShardSpec, suffix: &str) -> ShardSpec {
    ShardSpec {
        global_name: format!("{}.{suffix}", param.global_name),
        ..param.clone()
    }
}

/// This rank's parameters of `module` that it writes (see [`is_primary_replica`]), under their
/// global names. Call once per model chunk and concatenate. Every float parameter must have a
/// role: one without would silently be missing from the checkpoint.
pub fn model_shards<B: Backend, M: Module<B>>(
    module: &M,
    roles: &[ParamRole],
    ctx: &ParallelContext,
) -> Result<Vec<ShardTensor>, TrainError> {
    let roles = roles_by_id(roles);
    let writes = |id: ParamId| {
        roles
            .get(&id)
            .is_some_and(|role| is_primary_replica(role, ctx))
    };
    shards_of(param_values(module, &writes), &roles, ctx)
}

/// [`model_shards`] of a module that `optimizer` trains: a 16-bit parameter is saved as its
/// fp32 master copy (what the next update starts from), so a mixed-precision run resumes exactly.
/// Each value is copied from the device once, and only where this rank writes it: the 16-bit
/// copy of a parameter with a master is not read at all (a save's stall is these copies).
pub(crate) fn trained_shards<B: Backend, M: Module<B>, I: FusedOps>(
    module: &M,
    roles: &[ParamRole],
    optimizer: &AdamW<I>,
    ctx: &ParallelContext,
) -> Result<Vec<ShardTensor>, TrainError> {
    let roles = roles_by_id(roles);
    let writes = |id: ParamId| {
        roles
            .get(&id)
            .is_some_and(|role| is_primary_replica(role, ctx))
    };
    let own_value = |id: ParamId| writes(id) && !optimizer.has_master(id);
    let mut values = param_values(module, &own_value);
    for (id, values) in &mut values {
        if values.is_none() && writes(*id) {
            *values = optimizer.master_values(*id);
        }
    }
    shards_of(values, &roles, ctx)
}

/// Every float parameter of `module` in visiting order, with its values where `read` asks.
fn param_values<B: Backend, M: Module<B>>(
    module: &M,
    read: &dyn Fn(ParamId) -> bool,
) -> Vec<(ParamId, Option<ShardValues>)> {
    let mut collector = ValueCollector {
        read,
        values: Vec::new(),
    };
    module.visit(&mut collector);
    collector.values
}

/// The shards this rank writes: every parameter must have a role, and the ones this rank writes
/// their values.
fn shards_of(
    values: Vec<(ParamId, Option<ShardValues>)>,
    roles: &HashMap<ParamId, &ParamRole>,
    ctx: &ParallelContext,
) -> Result<Vec<ShardTensor>, TrainError> {
    let mut shards = Vec::new();
    for (id, values) in values {
        let role = roles.get(&id).ok_or_else(|| {
            TrainError::Config(format!(
                "a parameter ({id}) has no ParamRole, so it has no global name to be saved under"
            ))
        })?;
        if is_primary_replica(role, ctx) {
            let values = values.ok_or_else(|| {
                TrainError::Config(format!(
                    "parameter {} was not read for the checkpoint",
                    role.shard.global_name
                ))
            })?;
            shards.push(ShardTensor {
                spec: role.shard.clone(),
                values,
            });
        }
    }
    Ok(shards)
}

/// The AdamW moments of the parameters this rank writes, as `<global>.exp_avg` and
/// `<global>.exp_avg_sq` shards. Parameters that never had a gradient have none.
pub fn adamw_shards<I: FusedOps>(
    optimizer: &AdamW<I>,
    roles: &[ParamRole],
    ctx: &ParallelContext,
) -> Result<Vec<ShardTensor>, TrainError> {
    let primary: Vec<&ParamRole> = roles
        .iter()
        .filter(|r| is_primary_replica(r, ctx))
        .collect();
    let entries = entries_of(primary.iter().copied())?;
    let specs: HashMap<String, &ShardSpec> = primary
        .iter()
        .flat_map(|role| {
            [EXP_AVG, EXP_AVG_SQ]
                .map(|suffix| (format!("{}.{suffix}", role.shard.global_name), &role.shard))
        })
        .collect();
    optimizer
        .state_values(&entries)
        .into_iter()
        .map(|(_, name, values)| {
            let param = specs.get(&name).ok_or_else(|| {
                TrainError::Config(format!("optimizer moment {name} has no parameter"))
            })?;
            let suffix = name.rsplit('.').next().unwrap_or(EXP_AVG).to_owned();
            Ok(ShardTensor {
                spec: moment_spec(param, &suffix),
                values,
            })
        })
        .collect()
}

impl ShardedCheckpoint {
    /// Replace every parameter of `module` (a rank's chunk) by its shard of the checkpoint's
    /// global tensor. Fails listing every parameter that could not be loaded.
    pub fn load_module<B: Backend, M: Module<B>>(
        &self,
        module: M,
        roles: &[ParamRole],
    ) -> Result<M, TrainError> {
        let mut loader = ShardLoader {
            checkpoint: self,
            roles: roles_by_id(roles),
            problems: Vec::new(),
        };
        let module = module.map(&mut loader);
        if loader.problems.is_empty() {
            Ok(module)
        } else {
            Err(TrainError::checkpoint(
                self.dir(),
                loader.problems.join("\n  "),
            ))
        }
    }

    /// Restore the AdamW moments of `roles`' parameters (this rank's shards of them) and the
    /// step count (the checkpoint's iteration).
    pub fn load_adamw<I: Backend>(
        &self,
        optimizer: &mut AdamW<I>,
        roles: &[ParamRole],
        device: &I::Device,
    ) -> Result<(), TrainError> {
        let entries = entries_of(roles.iter())?;
        let mut moments = HashMap::new();
        for role in roles {
            for suffix in [EXP_AVG, EXP_AVG_SQ] {
                let spec = moment_spec(&role.shard, suffix);
                if !self.contains(&spec.global_name) {
                    continue;
                }
                let values = self.shard(&spec)?;
                moments.insert(
                    spec.global_name.clone(),
                    NamedTensor {
                        name: spec.global_name,
                        shape: vec![values.len()],
                        values,
                    },
                );
            }
        }
        optimizer
            .load_state(&entries, &moments, self.manifest().iteration, device)
            .map_err(|problems| TrainError::checkpoint(self.dir(), problems.join("; ")))
    }

    /// The fp32 master copies of `module`'s 16-bit parameters, from the saved values (the module
    /// holds them rounded); an fp32 parameter is its own master and gets none.
    pub(crate) fn restore_master_weights<B: Backend, M: Module<B>, I: Backend>(
        &self,
        optimizer: &mut AdamW<I>,
        module: &M,
        roles: &[ParamRole],
        device: &I::Device,
    ) -> Result<(), TrainError> {
        let mut collector = SixteenBit {
            ids: HashSet::new(),
        };
        module.visit(&mut collector);
        for role in roles.iter().filter(|r| collector.ids.contains(&r.id)) {
            optimizer.restore_master(role.id, &self.shard(&role.shard)?, device);
        }
        Ok(())
    }
}

/// AdamW's view of the parameters: named by global name, shaped like the local shard.
fn entries_of<'a>(
    roles: impl Iterator<Item = &'a ParamRole>,
) -> Result<Vec<ParamEntry>, TrainError> {
    roles
        .map(|role| {
            let shape = role
                .shard
                .local_shape()
                .map_err(|e| TrainError::Config(e.to_string()))?;
            Ok(ParamEntry {
                name: role.shard.global_name.clone(),
                id: role.id,
                shape,
            })
        })
        .collect()
}

fn roles_by_id(roles: &[ParamRole]) -> HashMap<ParamId, &ParamRole> {
    roles.iter().map(|role| (role.id, role)).collect()
}

struct ValueCollector<'a> {
    read: &'a dyn Fn(ParamId) -> bool,
    values: Vec<(ParamId, Option<ShardValues>)>,
}

impl<B: Backend> ModuleVisitor<B> for ValueCollector<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let values = (self.read)(param.id).then(|| {
            NamedTensor::from_tensor(String::new(), &param.val())
                .values
                .into()
        });
        self.values.push((param.id, values));
    }
}

/// The parameters stored in a 16-bit dtype.
struct SixteenBit {
    ids: HashSet<ParamId>,
}

impl<B: Backend> ModuleVisitor<B> for SixteenBit {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.val().dtype() != DType::F32 {
            self.ids.insert(param.id);
        }
    }
}

struct ShardLoader<'a> {
    checkpoint: &'a ShardedCheckpoint,
    roles: HashMap<ParamId, &'a ParamRole>,
    problems: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for ShardLoader<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(role) = self.roles.get(&param.id) else {
            self.problems.push(format!(
                "a parameter ({}) has no ParamRole, so its global name is unknown",
                param.id
            ));
            return param;
        };
        let values = match self.checkpoint.shard(&role.shard) {
            Ok(values) => values,
            Err(err) => {
                self.problems.push(match err {
                    TrainError::Checkpoint { message, .. } => message,
                    other => other.to_string(),
                });
                return param;
            }
        };
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        if dims.iter().product::<usize>() != values.len() {
            self.problems.push(format!(
                "{}: the shard holds {} values, the rank's parameter has shape {dims:?}",
                role.shard.global_name,
                values.len()
            ));
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let require_grad = tensor.is_require_grad();
        // made in fp32 and cast by the backend, as the optimizer rounds a master copy into a
        // 16-bit parameter: a resumed parameter holds the bits the uninterrupted run's holds (a
        // host-side conversion rounds some ties the other way)
        let fp32 = TensorData::new(values, dims);
        let wide: Tensor<B, D> = Tensor::from_data(fp32, (&tensor.device(), DType::F32));
        let mut loaded = wide.cast(tensor.dtype());
        if require_grad {
            loaded = loaded.require_grad();
        }
        Param::from_mapped_value(id, loaded, mapper)
    }
}
