//! AdamW with decoupled weight decay and a no-decay set, written here rather than taken from
//! burn-optim because burn 0.21's AdamW decays every parameter (Megatron exempts norms and
//! biases), and because its state is keyed by `ParamId`s that change between processes. Here the
//! moments live flat per parameter and are exported under the parameter's stable name.
//!
//! Every training step keeps the same state in flat buffers instead (`flat_adamw.rs`; why both
//! forms remain: `optim/mod.rs`); the state moves between the two forms when a caller of the
//! other form needs it (a checkpoint reads slices of the flat buffers without moving anything).

use std::collections::{HashMap, HashSet};

use burn::backend::Flex;
use burn::module::{AutodiffModule, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use ferrotron_ops::{AdamWStep, FusedOps};
use ferrotron_parallel::{Comm, ParallelOps, ParamRole};

use crate::TrainError;
use crate::checkpoint::{ShardValues, SnapshotGate};
use crate::optim::flat_adamw::{
    self, Family, FlatGrads, FlatState, Group, Layout, ParamFacts, Sharding, ViewMapper,
};
use crate::optim::offload::{self, Held};
use crate::params::{NamedTensor, ParamEntry};
use crate::precision::MasterWeights;

/// AdamW hyper-parameters (the rate comes from the schedule, per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// How `exp_avg` and `exp_avg_sq` are stored (f32, or bf16 under Megatron's
    /// precision-aware optimizer); the update computes in f32 either way.
    pub moment_dtypes: [burn::tensor::DType; 2],
    /// What the gradients are summed in over a step's microbatches and replicas (f32, or bf16
    /// under Megatron's `--main-grads-dtype bf16`).
    pub main_grads_dtype: burn::tensor::DType,
    /// The fraction of the parameters whose state lives in host memory and whose update runs
    /// on the CPU (Megatron's `--optimizer-offload-fraction` under `--optimizer-cpu-offload`;
    /// `None`: no offload). See `offload.rs`.
    pub offload_fraction: Option<f64>,
}

impl AdamWConfig {
    pub fn from_recipe(optimizer: &ferrotron_recipe::Optimizer) -> Self {
        let dtype = |stored: ferrotron_recipe::StateDtype| match stored {
            ferrotron_recipe::StateDtype::Fp32 => burn::tensor::DType::F32,
            ferrotron_recipe::StateDtype::Bf16 => burn::tensor::DType::BF16,
        };
        AdamWConfig {
            beta1: optimizer.beta1,
            beta2: optimizer.beta2,
            eps: optimizer.eps,
            weight_decay: optimizer.weight_decay,
            moment_dtypes: [
                dtype(optimizer.exp_avg_dtype),
                dtype(optimizer.exp_avg_sq_dtype),
            ],
            main_grads_dtype: dtype(optimizer.main_grads_dtype),
            offload_fraction: optimizer
                .optimizer_cpu_offload
                .then_some(optimizer.optimizer_offload_fraction),
        }
    }
}

/// First and second moments of one parameter, flattened.
#[derive(Debug, Clone)]
struct Moments<I: Backend> {
    exp_avg: Held<I>,
    exp_avg_sq: Held<I>,
}

/// The optimizer state: moments on the inner (non-autodiff) backend, the step count for bias
/// correction, and the parameters exempt from weight decay.
#[derive(Debug)]
pub struct AdamW<I: Backend> {
    config: AdamWConfig,
    step: u64,
    moments: HashMap<ParamId, Moments<I>>,
    no_decay: HashSet<ParamId>,
    /// fp32 copies of 16-bit parameters (mixed precision); empty in an fp32 run.
    master: MasterWeights<I>,
    /// The state of the parameters the device-resident step updates, in flat buffers (their
    /// entries are then absent from `moments` and `master`); boxed, as most optimizers of a
    /// parallel layout never have one.
    flat: Option<Box<FlatState<I>>>,
    /// Each parameter's data-parallel reduction bucket, which the flat layout keeps in groups
    /// of their own (`crate::step::replicas`); empty: one bucket.
    buckets: HashMap<ParamId, usize>,
    /// The parameters not of the dense family, kept in groups of their own too.
    families: HashMap<ParamId, Family>,
    /// The part of the flat state this rank keeps (the distributed optimizer's).
    sharding: Option<Sharding>,
    /// An asynchronous save still reading the state's device buffers.
    snapshot: Option<SnapshotGate>,
}

/// Where a parameter's fp32 master copy is kept ([`AdamW::master_at`]).
enum MasterAt<'a, I: Backend> {
    Flat(&'a FlatState<I>),
    Own(&'a Tensor<I, 1>),
}

/// Which parameters a step's flat gradient buffers (and so the flat state) hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Laid {
    /// Those with a gradient in the step's first microbatch, laid out anew when that set
    /// changes (the one-rank and replicated steps: a dense model's every parameter).
    FirstMicrobatch,
    /// Every trainable parameter, laid out by [`AdamW::flat_layout_of`] before the step's first
    /// gather; a parameter without a gradient is summed as zero. Ranks whose sets differ (an
    /// expert only some data ranks' tokens reached) so still hold buffers of one layout, which a
    /// collective over them needs, and every parameter is updated, a zero gradient too, as under
    /// Megatron's contiguous buffers.
    Every,
}

/// Suffixes of the two moment tensors in checkpoints (`<param>.exp_avg`), PyTorch's names.
pub(crate) const EXP_AVG: &str = "exp_avg";
pub(crate) const EXP_AVG_SQ: &str = "exp_avg_sq";

/// The parameters exempt from weight decay (Megatron's rule: every 1-D one), for [`AdamW::new`].
pub(crate) fn no_decay(roles: &[ParamRole]) -> HashSet<ParamId> {
    roles
        .iter()
        .filter(|r| r.no_weight_decay)
        .map(|r| r.id)
        .collect()
}

impl<I: Backend> AdamW<I> {
    pub fn new(config: AdamWConfig, no_decay: HashSet<ParamId>) -> Self {
        AdamW {
            config,
            step: 0,
            moments: HashMap::new(),
            no_decay,
            master: MasterWeights::default(),
            flat: None,
            buckets: HashMap::new(),
            families: HashMap::new(),
            sharding: None,
            snapshot: None,
        }
    }

    /// Keep only this rank's part of each group of the flat state from the next step on
    /// (ZeRO-1); the step's gradients are then those parts, and [`AdamW::step_flat`] expands
    /// the new values.
    pub(crate) fn set_sharding(&mut self, sharding: Sharding) {
        self.sharding = Some(sharding);
    }

    /// The flat state whole again (each group all-gathered over its `comm`, collective), for a
    /// checkpoint; the next step keeps its parts only again.
    pub(crate) fn join_shards<'a>(&mut self, comm: impl Fn(&Group) -> &'a Comm)
    where
        I: ParallelOps,
    {
        if let Some(flat) = self.flat.as_mut() {
            flat.join(comm);
        }
    }

    /// Keep each bucket's parameters in flat groups of their own from the next layout on.
    pub(crate) fn set_buckets(&mut self, buckets: HashMap<ParamId, usize>) {
        self.buckets = buckets;
    }

    /// Keep each family's parameters in flat groups of their own from the next layout on
    /// (absent: dense).
    pub(crate) fn set_families(&mut self, families: HashMap<ParamId, Family>) {
        self.families = families;
    }

    /// The flat layout of every parameter of `model` (laid out now unless it already is), for a
    /// step that gathers its gradients bucket by bucket.
    pub(crate) fn flat_layout_of<B, M>(&mut self, model: &M) -> &Layout
    where
        B: AutodiffBackend<InnerBackend = I>,
        M: AutodiffModule<B>,
    {
        self.lay_out(flat_adamw::all_params::<B, M>(model));
        &self.flat.as_ref().expect("laid out above").layout
    }

    /// The flat state laid out for `params` (in visiting order), unless it already is.
    fn lay_out(&mut self, params: Vec<(ParamId, burn::tensor::DType, usize, Tensor<I, 1>)>) {
        let same = self.flat.as_ref().is_some_and(|flat| {
            flat.layout.order.len() == params.len()
                && flat
                    .layout
                    .order
                    .iter()
                    .zip(&params)
                    .all(|(a, b)| *a == b.0)
        });
        if !same {
            self.unflatten();
            self.flatten(params);
        }
    }

    /// The fp32 master copies of the model's 16-bit parameters (see `precision`) updated by the
    /// per-parameter step, [`AdamW::step`] (the flat state's are read through
    /// [`AdamW::master_values`]; [`AdamW::has_master`] asks either form).
    pub fn master_weights(&self) -> &MasterWeights<I> {
        &self.master
    }

    /// Whether parameter `id` has an fp32 master copy apart from its own value, in whichever
    /// form the state is.
    pub fn has_master(&self, id: ParamId) -> bool {
        self.master_at(id).is_some()
    }

    /// Where parameter `id`'s fp32 master copy is kept, if it has one: in the flat state (a
    /// 16-bit parameter's; an fp32 one there is its own master) or per parameter.
    fn master_at(&self, id: ParamId) -> Option<MasterAt<'_, I>> {
        if let Some(flat) = &self.flat
            && let Some(slot) = flat.layout.slots.get(&id)
        {
            let sixteen_bit =
                MasterWeights::<I>::rounded_dtype(flat.layout.groups[slot.group].dtype);
            return sixteen_bit.map(|_| MasterAt::Flat(flat));
        }
        self.master.get(id).map(MasterAt::Own)
    }

    /// Hold the next update until `gate` opens: an asynchronous save is still reading this
    /// optimizer's device buffers ([`SnapshotGate`]).
    /// Bytes of the flat state on the device (see [`FlatState::device_bytes`]); 0 before the
    /// first step lays it out.
    pub(crate) fn device_state_bytes(&self) -> usize {
        self.flat.as_ref().map_or(0, |flat| flat.device_bytes())
    }

    pub(crate) fn hold_until(&mut self, gate: SnapshotGate) {
        self.snapshot = Some(gate);
    }

    /// Wait for a save's snapshot still reading the state, before writing it.
    fn snapshot_read(&mut self) {
        if let Some(gate) = self.snapshot.take() {
            let waited = gate.wait();
            tracing::info!(
                "the optimizer step waited {:.2} s for the checkpoint's snapshot",
                waited.as_secs_f64()
            );
        }
    }

    #[cfg(test)]
    pub(crate) fn flat_state(&self) -> Option<&FlatState<I>> {
        self.flat.as_deref()
    }

    /// Whether part of the state is offloaded, so that every step's update is a host pass: it
    /// reads the step's last gradients down from the device and returns once their pieces are
    /// on the host, so the step's device work is done when its call returns (only the new
    /// weights' uploads remain), and the step needs no later read to be timed.
    pub(crate) fn updates_on_host(&self) -> bool {
        self.flat.as_deref().is_some_and(|flat| {
            flat.master
                .iter()
                .any(|held| matches!(held, crate::optim::offload::Held::Host(_)))
        })
    }

    /// Optimizer steps taken (the `t` of the bias correction).
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// Apply one update to every parameter of `model` that has a gradient: gradients are first
    /// multiplied by `grad_scale` (the clipping coefficient), then
    /// `p ← p·(1 − lr·wd) − lr·m̂/(√v̂ + ε)` with `wd` 0 for the no-decay set, one
    /// [`FusedOps::adamw_step`] per parameter (a single kernel on the GPU).
    pub fn step<B, M>(&mut self, model: M, grads: GradientsParams, lr: f64, grad_scale: f64) -> M
    where
        B: AutodiffBackend<InnerBackend = I>,
        I: FusedOps,
        M: AutodiffModule<B>,
    {
        self.snapshot_read();
        self.apply(model, grads, lr, grad_scale)
    }

    fn apply<B, M>(&mut self, model: M, grads: GradientsParams, lr: f64, grad_scale: f64) -> M
    where
        B: AutodiffBackend<InnerBackend = I>,
        I: FusedOps,
        M: AutodiffModule<B>,
    {
        self.unflatten();
        let (bias_correction1, bias_correction2) = self.next_bias_corrections();
        let mut mapper = UpdateMapper {
            optimizer: self,
            grads,
            lr,
            grad_scale,
            bias_correction1,
            bias_correction2,
        };
        model.map(&mut mapper)
    }

    /// Count the step; `1 − β₁ᵗ` and `1 − β₂ᵗ` of it.
    fn next_bias_corrections(&mut self) -> (f64, f64) {
        self.step += 1;
        let step = i32::try_from(self.step).unwrap_or(i32::MAX);
        (
            1.0 - self.config.beta1.powi(step),
            1.0 - self.config.beta2.powi(step),
        )
    }

    /// Parameter `id`'s fp32 master copy from saved (flattened) values.
    pub(crate) fn restore_master(&mut self, id: ParamId, values: &[f32], device: &I::Device) {
        self.unflatten();
        self.master.insert(id, fp32_tensor(values, device));
    }

    /// Add one microbatch's gradients of `model` to the step's flat buffers `into` (a fresh set
    /// for the step's first microbatch); `complete` may change the flattened gradients first
    /// (tensor-parallel partial ones summed over their group). What the buffers hold is `laid`'s;
    /// `sum` says whether anything will be added to them (see [`flat_adamw::Sum`]).
    pub(crate) fn gather_flat<B, M>(
        &mut self,
        model: &M,
        grads: GradientsParams,
        into: Option<FlatGrads<I>>,
        (laid, sum): (Laid, flat_adamw::Sum),
        complete: impl FnOnce(&mut HashMap<ParamId, Tensor<I, 1>>),
    ) -> Result<FlatGrads<I>, TrainError>
    where
        B: AutodiffBackend<InnerBackend = I>,
        I: FusedOps,
        M: AutodiffModule<B>,
    {
        let mut taken = flat_adamw::take_grads::<B, M>(model, grads);
        if laid == Laid::FirstMicrobatch && into.is_none() {
            self.lay_out(taken.params);
        }
        complete(&mut taken.grads);
        let layout = &self
            .flat
            .as_ref()
            .expect("laid out by the first microbatch or `flat_layout_of`")
            .layout;
        flat_adamw::gather(layout, taken.grads, into, sum)
    }

    /// `Σ x²` of a step's flat gradients (`[1]` f32; `None`: no gradients).
    pub(crate) fn flat_sum_of_squares(
        &self,
        grads: &FlatGrads<I>,
        counted: impl Fn(ParamId) -> bool,
    ) -> Option<Tensor<I, 1>>
    where
        I: FusedOps,
    {
        let layout = &self.flat.as_ref()?.layout;
        flat_adamw::sum_of_squares(layout, grads, self.sharding.is_some(), counted)
    }

    /// [`AdamW::step`] over the flat state and a step's flat gradients (from
    /// [`AdamW::gather_flat`]): one update per group, with the gradient factor on the device
    /// when given; the model's parameters become views of the updated buffers. With a shard
    /// (ZeRO-1) the gradients and the update are this rank's part and `expand` makes each
    /// group's new values whole (the identity otherwise).
    pub(crate) fn step_flat<B, M>(
        &mut self,
        model: M,
        grads: FlatGrads<I>,
        lr: f64,
        device_scale: Option<Tensor<I, 1>>,
        mut expand: impl FnMut(&flat_adamw::Group, Tensor<I, 1>) -> Tensor<I, 1>,
    ) -> M
    where
        B: AutodiffBackend<InnerBackend = I>,
        I: FusedOps,
        M: AutodiffModule<B>,
    {
        self.snapshot_read();
        let (bias_correction1, bias_correction2) = self.next_bias_corrections();
        let config = self.config;
        let Some(flat) = self.flat.as_mut() else {
            return model;
        };
        let step = |group: &flat_adamw::Group| AdamWStep {
            lr,
            beta1: config.beta1,
            beta2: config.beta2,
            eps: config.eps,
            decay: group.decays.then_some(1.0 - lr * config.weight_decay),
            bias_correction1,
            bias_correction2,
            grad_scale: 1.0,
            rounded: MasterWeights::<I>::rounded_dtype(group.dtype),
            moment_dtypes: config.moment_dtypes,
        };
        if self.sharding.is_some() {
            flat.cut();
        }
        let values: Vec<_> = flat_adamw::update(flat, grads, step, device_scale)
            .into_iter()
            .zip(&flat.layout.groups)
            .map(|(values, group)| expand(group, values))
            .collect();
        let mut mapper = ViewMapper {
            slots: &flat.layout.slots,
            values: &values,
        };
        model.map(&mut mapper)
    }

    /// Move the per-parameter state of `params` (`(id, dtype, len, value)` in visiting order)
    /// into flat buffers; a parameter without a master copy starts from its own value widened,
    /// one without moments (when others have them) from zero moments, which the update treats
    /// exactly as a first step (`0·β + x` is `x`), as it keeps the alignment gaps at zero.
    fn flatten(&mut self, params: Vec<(ParamId, burn::tensor::DType, usize, Tensor<I, 1>)>) {
        let lens: Vec<usize> = params.iter().map(|&(_, _, len, _)| len).collect();
        let offloaded = match self.config.offload_fraction {
            Some(fraction) => offload::offloaded(&lens, fraction),
            None => vec![false; lens.len()],
        };
        let facts: Vec<_> = params
            .iter()
            .zip(&offloaded)
            .map(|(&(id, dtype, len, _), &offloaded)| ParamFacts {
                id,
                dtype,
                len,
                decays: self.decays(id),
                bucket: self.buckets.get(&id).copied().unwrap_or(0),
                family: self.families.get(&id).copied().unwrap_or_default(),
                offloaded,
            })
            .collect();
        let layout = Layout::new(&facts, self.sharding, self.config.main_grads_dtype);
        let device = params
            .first()
            .map(|(_, _, _, value)| value.device())
            .unwrap_or_default();
        let mut values: HashMap<ParamId, Tensor<I, 1>> = params
            .into_iter()
            .map(|(id, _, _, value)| (id, value))
            .collect();
        let mut master = Vec::with_capacity(layout.groups.len());
        let mut moments = Vec::with_capacity(layout.groups.len());
        for index in 0..layout.groups.len() {
            let runs = layout.runs(index);
            // An offloaded group is built in host memory from its members one by one: an 8B
            // model's fp32 master would not fit on the device beside its weights.
            let offloaded = layout.groups[index].offloaded;
            let held = |x: Tensor<I, 1>| {
                if offloaded {
                    Held::Host(offload::to_host(x))
                } else {
                    Held::Device(x)
                }
            };
            let zeros = |len, dtype| held(zeros_of::<I>(len, dtype, &device));
            // a restored moment may already be in host memory (`load_state`)
            let place = |x: Held<I>| {
                if offloaded {
                    Held::Host(x.to_host())
                } else {
                    Held::Device(x.on_device(&device))
                }
            };
            let parts: Vec<_> = runs
                .iter()
                .map(|&(id, len)| match id {
                    Some(id) => {
                        let value = values.remove(&id).expect("every member has a value");
                        held(self.master.take(id, value))
                    }
                    None => zeros(len, burn::tensor::DType::F32),
                })
                .collect();
            master.push(cat(parts));
            let saved: Vec<_> = runs
                .iter()
                .map(|&(id, len)| (id.and_then(|id| self.moments.remove(&id)), len))
                .collect();
            moments.push(saved.iter().any(|(m, _)| m.is_some()).then(|| {
                let [m_dtype, v_dtype] = self.config.moment_dtypes;
                let (m, v): (Vec<_>, Vec<_>) = saved
                    .into_iter()
                    .map(|(saved, len)| match saved {
                        Some(Moments {
                            exp_avg,
                            exp_avg_sq,
                        }) => (place(exp_avg), place(exp_avg_sq)),
                        None => (zeros(len, m_dtype), zeros(len, v_dtype)),
                    })
                    .unzip();
                (cat(m), cat(v))
            }));
        }
        let mut flat = FlatState {
            layout,
            master,
            moments,
            cut: false,
            device,
        };
        if self.sharding.is_some() {
            flat.cut();
        }
        self.flat = Some(Box::new(flat));
    }

    /// Move the flat state back into per-parameter entries (slices of the flat buffers).
    fn unflatten(&mut self) {
        let Some(flat) = self.flat.take() else {
            return;
        };
        assert!(
            !flat.cut,
            "the distributed optimizer's flat state is joined (`join_shards`) before it leaves \
             the flat form"
        );
        for (id, slot) in &flat.layout.slots {
            let group = &flat.layout.groups[slot.group];
            if MasterWeights::<I>::rounded_dtype(group.dtype).is_some()
                && let Some(master) = flat.slice(&flat.master, *id)
            {
                self.master.insert(*id, master);
            }
            if let Some((exp_avg, exp_avg_sq)) = flat.moments_of(*id) {
                self.moments.insert(
                    *id,
                    Moments {
                        exp_avg: Held::Device(exp_avg),
                        exp_avg_sq: Held::Device(exp_avg_sq),
                    },
                );
            }
        }
    }

    fn decays(&self, id: ParamId) -> bool {
        self.config.weight_decay > 0.0 && !self.no_decay.contains(&id)
    }

    /// Restore moments saved by [`AdamW::state_tensors`] for the parameters `params` of the
    /// current model, and the step count. Fails with every problem found.
    pub fn load_state(
        &mut self,
        params: &[ParamEntry],
        tensors: &HashMap<String, NamedTensor>,
        step: u64,
        device: &I::Device,
    ) -> Result<(), Vec<String>> {
        self.unflatten();
        let mut problems = Vec::new();
        let mut moments = HashMap::new();
        for entry in params {
            let avg = tensors.get(&format!("{}.{EXP_AVG}", entry.name));
            let avg_sq = tensors.get(&format!("{}.{EXP_AVG_SQ}", entry.name));
            match (avg, avg_sq) {
                // a parameter that never received a gradient (frozen, or unused so far)
                (None, None) => {}
                (Some(avg), Some(avg_sq)) => {
                    let expected: usize = entry.shape.iter().product();
                    if avg.values.len() != expected || avg_sq.values.len() != expected {
                        problems.push(format!(
                            "{}: optimizer moments hold {} values, the parameter {expected}",
                            entry.name,
                            avg.values.len()
                        ));
                        continue;
                    }
                    // stored as trained: a bf16 moment saved widened comes back exactly
                    // and, under the offload, in host memory: an 8B model's moments would not
                    // fit on the device on their way to the host
                    let [m_dtype, v_dtype] = self.config.moment_dtypes;
                    let offloaded = self.config.offload_fraction.is_some();
                    let held = |values: &[f32], dtype| {
                        if offloaded {
                            Held::Host(fp32_tensor::<Flex>(values, &Default::default()).cast(dtype))
                        } else {
                            Held::Device(fp32_tensor(values, device).cast(dtype))
                        }
                    };
                    moments.insert(
                        entry.id,
                        Moments {
                            exp_avg: held(&avg.values, m_dtype),
                            exp_avg_sq: held(&avg_sq.values, v_dtype),
                        },
                    );
                }
                _ => problems.push(format!(
                    "{}: only one of the two optimizer moments is in the checkpoint",
                    entry.name
                )),
            }
        }
        if problems.is_empty() {
            self.moments = moments;
            self.step = step;
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// The buffers end to end, where they are held (a group's are all held in one place).
fn cat<I: Backend>(parts: Vec<Held<I>>) -> Held<I> {
    let mut device = Vec::new();
    let mut host = Vec::new();
    for part in parts {
        match part {
            Held::Device(x) => device.push(x),
            Held::Host(x) => host.push(x),
        }
    }
    match (device.is_empty(), host.is_empty()) {
        (false, true) => Held::Device(Tensor::cat(device, 0)),
        (true, false) => Held::Host(Tensor::cat(host, 0)),
        _ => unreachable!("a group's buffers are held in one place"),
    }
}

fn zeros_of<I: Backend>(
    len: usize,
    dtype: burn::tensor::DType,
    device: &I::Device,
) -> Tensor<I, 1> {
    Tensor::zeros([len], (device, dtype))
}

/// Moments are fp32 whatever the device's default float dtype (mixed precision computes in bf16).
fn fp32_tensor<I: Backend>(values: &[f32], device: &I::Device) -> Tensor<I, 1> {
    let data = burn::tensor::TensorData::new(values.to_vec(), [values.len()]);
    Tensor::from_data(data, (device, burn::tensor::DType::F32))
}

struct UpdateMapper<'a, I: Backend> {
    optimizer: &'a mut AdamW<I>,
    grads: GradientsParams,
    lr: f64,
    grad_scale: f64,
    bias_correction1: f64,
    bias_correction2: f64,
}

impl<B: AutodiffBackend> ModuleMapper<B> for UpdateMapper<'_, B::InnerBackend>
where
    B::InnerBackend: FusedOps,
{
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        let numel: usize = dims.iter().product();
        let config = self.optimizer.config;
        let param_dtype = tensor.dtype();
        let value = self
            .optimizer
            .master
            .take(id, tensor.inner().reshape([numel]));
        let decays = self.optimizer.decays(id);
        let step = AdamWStep {
            lr: self.lr,
            beta1: config.beta1,
            beta2: config.beta2,
            eps: config.eps,
            decay: decays.then_some(1.0 - self.lr * config.weight_decay),
            bias_correction1: self.bias_correction1,
            bias_correction2: self.bias_correction2,
            grad_scale: self.grad_scale,
            rounded: MasterWeights::<B::InnerBackend>::rounded_dtype(param_dtype),
            moment_dtypes: config.moment_dtypes,
        };
        let moments = self.optimizer.moments.remove(&id).map(|m| {
            let device = value.device();
            (
                primitive(m.exp_avg.on_device(&device)),
                primitive(m.exp_avg_sq.on_device(&device)),
            )
        });
        let updated = <B::InnerBackend as FusedOps>::adamw_step(
            primitive(value),
            primitive(grad.reshape([numel])),
            moments,
            step,
            None,
        );
        self.optimizer.moments.insert(
            id,
            Moments {
                exp_avg: Held::Device(from_primitive(updated.exp_avg)),
                exp_avg_sq: Held::Device(from_primitive(updated.exp_avg_sq)),
            },
        );
        let value = self.optimizer.master.keep(
            id,
            from_primitive(updated.value),
            updated.rounded.map(from_primitive),
        );
        let updated = Tensor::<B, D>::from_inner(value.reshape(dims)).require_grad();
        Param::from_mapped_value(id, updated, mapper)
    }
}

fn primitive<I: Backend>(x: Tensor<I, 1>) -> FloatTensor<I> {
    x.into_primitive().tensor()
}

fn from_primitive<I: Backend>(x: FloatTensor<I>) -> Tensor<I, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

impl<I: FusedOps> AdamW<I> {
    /// The moments named `<param>.exp_avg` / `<param>.exp_avg_sq`, shaped like their parameter.
    pub fn state_tensors(&self, params: &[ParamEntry]) -> Vec<NamedTensor> {
        self.state_values(params)
            .into_iter()
            .map(|(entry, name, values)| NamedTensor {
                name,
                shape: entry.shape.clone(),
                values: values.to_vec(),
            })
            .collect()
    }

    /// Parameter `id`'s fp32 master copy, flattened, as f32 values read where the state is (an
    /// offloaded group's master is not copied to the device to be saved); `None` for an fp32
    /// parameter (its own master) or one never updated.
    pub(crate) fn master_values(&self, id: ParamId) -> Option<ShardValues> {
        match self.master_at(id)? {
            MasterAt::Flat(flat) => flat.values(&flat.master, id),
            MasterAt::Own(master) => Some(
                NamedTensor::from_tensor(String::new(), master)
                    .values
                    .into(),
            ),
        }
    }

    /// [`AdamW::state_tensors`]' names and values, an offloaded group's shared rather than read
    /// (see [`ShardValues`]): what a checkpoint's snapshot takes.
    pub(crate) fn state_values<'p>(
        &self,
        params: &'p [ParamEntry],
    ) -> Vec<(&'p ParamEntry, String, ShardValues)> {
        let mut out = Vec::with_capacity(params.len() * 2);
        for entry in params {
            let flat = self
                .flat
                .as_ref()
                .and_then(|flat| flat.moment_values(entry.id));
            let Some((exp_avg, exp_avg_sq)) = flat.or_else(|| {
                let m = self.moments.get(&entry.id)?;
                let len = entry.shape.iter().product();
                Some((
                    m.exp_avg.shard_values(0..len),
                    m.exp_avg_sq.shard_values(0..len),
                ))
            }) else {
                continue;
            };
            for (suffix, values) in [(EXP_AVG, exp_avg), (EXP_AVG_SQ, exp_avg_sq)] {
                out.push((entry, format!("{}.{suffix}", entry.name), values));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::tests::{Cpu, CpuAutodiff, Tiny, tiny};
    use crate::params::{named_tensors, param_entries};

    fn values(model: &Tiny<CpuAutodiff>, name: &str) -> Vec<f32> {
        named_tensors::<CpuAutodiff, _>(model)
            .into_iter()
            .find(|t| t.name == name)
            .expect("parameter exists")
            .values
    }

    /// loss = Σ (c ⊙ scale) with c = [1, −2]: the gradient of `scale` is c at every step.
    fn grads_of(model: &Tiny<CpuAutodiff>) -> GradientsParams {
        let device = Default::default();
        let c = Tensor::<CpuAutodiff, 1>::from_floats([1.0, -2.0], &device);
        let loss = (model.scale.val() * c).sum();
        GradientsParams::from_grads(loss.backward(), model)
    }

    fn config() -> AdamWConfig {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            moment_dtypes: ferrotron_ops::F32_MOMENTS,
            main_grads_dtype: burn::tensor::DType::F32,
            offload_fraction: None,
        }
    }

    #[test]
    fn two_steps_match_hand_computation() {
        let device = Default::default();
        let mut model = tiny::<CpuAutodiff>(&device);
        let mut optimizer = AdamW::<Cpu>::new(config(), HashSet::new());
        let lr = 0.01;
        for _ in 0..2 {
            let grads = grads_of(&model);
            model = optimizer.step(model, grads, lr, 1.0);
        }
        // By hand, for one element with constant gradient g and start p0:
        //   t=1: m = 0.1g, v = 0.05g², m̂ = g, v̂ = g², p1 = p0(1 − lr·wd) − lr·g/(|g| + ε)
        //   t=2: m = 0.19g, v = 0.0975g², m̂ = g, v̂ = g², p2 = p1(1 − lr·wd) − lr·g/(|g| + ε)
        // so with sign(g) = s: p2 = (p0·0.999 − 0.01·s)·0.999 − 0.01·s.
        let expected = |p0: f64, s: f64| ((p0 * 0.999 - 0.01 * s) * 0.999 - 0.01 * s) as f32;
        let got = values(&model, "scale");
        let want = [expected(1.0, 1.0), expected(2.0, -1.0)];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        assert_eq!(optimizer.step_count(), 2);
    }

    #[test]
    fn no_decay_set_is_exempt() {
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        let scale_id = model.scale.id;
        let mut optimizer = AdamW::<Cpu>::new(config(), HashSet::from([scale_id]));
        let grads = grads_of(&model);
        let model = optimizer.step(model, grads, 0.01, 1.0);
        // p1 = p0 − lr·sign(g): no decay factor
        let got = values(&model, "scale");
        assert!(
            (got[0] - 0.99).abs() < 1e-6 && (got[1] - 2.01).abs() < 1e-6,
            "{got:?}"
        );
    }

    #[test]
    fn parameters_without_gradients_are_untouched() {
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        let before = values(&model, "layers.0.weight");
        let mut optimizer = AdamW::<Cpu>::new(config(), HashSet::new());
        let grads = grads_of(&model);
        let model = optimizer.step(model, grads, 0.01, 1.0);
        assert_eq!(values(&model, "layers.0.weight"), before);
    }

    #[test]
    fn grad_scale_equals_prescaled_gradients() {
        // Adam is scale-invariant in g except through ε, so compare the moments instead.
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        let entries = param_entries::<CpuAutodiff, _>(&model);
        let mut optimizer = AdamW::<Cpu>::new(config(), HashSet::new());
        let grads = grads_of(&model);
        let _ = optimizer.step(model, grads, 0.01, 0.5);
        let state = optimizer.state_tensors(&entries);
        let avg = state
            .iter()
            .find(|t| t.name == "scale.exp_avg")
            .expect("scale has moments");
        // m = (1 − β1)·0.5·g = 0.05·[1, −2]
        assert!((avg.values[0] - 0.05).abs() < 1e-7 && (avg.values[1] + 0.1).abs() < 1e-7);
    }

    #[test]
    fn state_round_trips_by_name() {
        let device = Default::default();
        let model = tiny::<CpuAutodiff>(&device);
        let mut optimizer = AdamW::<Cpu>::new(config(), HashSet::new());
        let grads = grads_of(&model);
        let model = optimizer.step(model, grads, 0.01, 1.0);
        let entries = param_entries::<CpuAutodiff, _>(&model);
        let saved: HashMap<String, NamedTensor> = optimizer
            .state_tensors(&entries)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        assert_eq!(saved["scale.exp_avg_sq"].shape, vec![2]);

        // a fresh model (new ParamIds) takes the same state through the names
        let other = tiny::<CpuAutodiff>(&device);
        let other_entries = param_entries::<CpuAutodiff, _>(&other);
        let mut restored = AdamW::<Cpu>::new(config(), HashSet::new());
        restored
            .load_state(&other_entries, &saved, 1, &device)
            .expect("state loads");
        assert_eq!(restored.step_count(), 1);
        let again: HashMap<String, NamedTensor> = restored
            .state_tensors(&other_entries)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        assert_eq!(again, saved);
    }
}
