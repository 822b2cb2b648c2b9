//! The optimizer's state as flat fp32 buffers, one per group of parameters that share an
//! update rule (weight decay or not) and a dtype: master weights, both moments, and the step's
//! gradients gathered into a buffer of the same layout.
//!
//! Kept per parameter, a step on a GPU is ~200 AdamW launches, ~200 norm reductions and, with
//! several microbatches, ~200 casts and adds per microbatch. Over flat buffers it is a few
//! gather launches per microbatch, one norm reduction per group and one AdamW launch per group,
//! and the model's new parameters are views into the update's output (the rounded 16-bit copy,
//! or the fp32 master itself). The same buffers are what a data-parallel reduce would work on.
//!
//! The arithmetic per element is the per-parameter path's (the update is element-wise; the
//! norm's default sums per parameter in the model's order), so on the CPU the two agree to the
//! bit. One difference in meaning: a parameter that gets no gradient in a later microbatch of a
//! step is summed as zero there (exact); the layout is the set of parameters with a gradient in
//! a step's first microbatch, rebuilt when that set changes.

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use ferrotron_ops::{AdamWStep, FlatPiece, FlatSegment, FusedOps};
use ferrotron_parallel::{Comm, ParallelOps};

use crate::TrainError;
use crate::checkpoint::ShardValues;
use crate::optim::offload::{self, Held};

/// Every parameter starts at a multiple of this many elements (128 bytes of bf16), so the
/// views the model computes with are as aligned as their own allocations were (cuBLASLt picks
/// its kernels by pointer alignment). The gaps hold zeros in every buffer.
const ALIGN: usize = 64;

/// An offloaded group is closed once it holds this many elements (256 MiB of fp32): its host
/// buffers are a few hundred MiB each rather than one of tens of GB per kind, so the new buffers
/// an update writes while a save in flight holds the old ones (`offload::Writable`), and the old
/// ones once the writer lets them go, move through the allocator in pieces it can reuse.
const HOST_GROUP_LEN: usize = 1 << 26;

/// Where one parameter lives: its group and its range there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub group: usize,
    pub offset: usize,
    pub len: usize,
}

/// Which ranks share a parameter's gradient, and so which collectives its group takes
/// (`crate::step::per_chunk`): a dense parameter's data-parallel ranks, an expert's
/// expert-data-parallel ones, and the word embedding tied between first and last stage is
/// summed between those stages first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Family {
    #[default]
    Dense,
    Expert,
    TiedEmbedding,
}

/// The parameters of one group in buffer order.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// The data-parallel reduction bucket its members belong to (`crate::step::replicas`; 0
    /// without).
    pub bucket: usize,
    pub family: Family,
    /// The part of it this rank keeps under the distributed optimizer (none: all of it).
    pub shard: Option<Shard>,
    pub decays: bool,
    /// Whether its state lives in host memory and its update runs there (`offload.rs`).
    pub offloaded: bool,
    /// The parameters' own dtype (16-bit ones also get a rounded copy written by the update).
    pub dtype: DType,
    pub members: Vec<ParamId>,
    pub len: usize,
}

/// What the layout needs of one parameter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParamFacts {
    pub id: ParamId,
    pub dtype: DType,
    pub len: usize,
    pub decays: bool,
    pub bucket: usize,
    pub family: Family,
    pub offloaded: bool,
}

/// Which parameters the flat buffers hold, where, and in what order the model visits them.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub groups: Vec<Group>,
    pub slots: HashMap<ParamId, Slot>,
    /// Every parameter in the model's visiting order (the per-parameter norm's order).
    pub order: Vec<ParamId>,
    /// What every group's gradients are summed in over microbatches and replicas
    /// (`main_grads_dtype`, Megatron's `--main-grads-dtype`: f32 unless asked).
    pub sum_dtype: DType,
}

impl Layout {
    /// Group the parameters given in visiting order; under `sharding` (the distributed
    /// optimizer) every group is padded with zeros to equal parts. Every group's gradients are
    /// summed in `main_grads_dtype`.
    pub(crate) fn new(
        params: &[ParamFacts],
        sharding: Option<Sharding>,
        main_grads_dtype: DType,
    ) -> Self {
        let mut groups: Vec<Group> = Vec::new();
        let mut slots = HashMap::with_capacity(params.len());
        for &ParamFacts {
            id,
            dtype,
            len,
            decays,
            bucket,
            family,
            offloaded,
        } in params
        {
            let index = match groups.iter().position(|g| {
                g.decays == decays
                    && g.dtype == dtype
                    && g.bucket == bucket
                    && g.family == family
                    && g.offloaded == offloaded
                    && (!offloaded || g.len < HOST_GROUP_LEN)
            }) {
                Some(index) => index,
                None => {
                    groups.push(Group {
                        bucket,
                        family,
                        shard: sharding.map(|sharding| sharding.of(family)),
                        decays,
                        offloaded,
                        dtype,
                        members: Vec::new(),
                        len: 0,
                    });
                    groups.len() - 1
                }
            };
            let group = &mut groups[index];
            let offset = group.len.next_multiple_of(ALIGN);
            slots.insert(
                id,
                Slot {
                    group: index,
                    offset,
                    len,
                },
            );
            group.members.push(id);
            group.len = offset + len;
        }
        for group in &mut groups {
            if let Some(shard) = group.shard {
                group.len = group.len.next_multiple_of(ALIGN * shard.parts);
            }
        }
        Layout {
            groups,
            slots,
            order: params.iter().map(|p| p.id).collect(),
            sum_dtype: main_grads_dtype,
        }
    }

    /// Group `group` front to back: each member's id and length, and `(None, len)` for the
    /// zero gap before a member that alignment leaves.
    pub(crate) fn runs(&self, group: usize) -> Vec<(Option<ParamId>, usize)> {
        let mut runs = Vec::with_capacity(self.groups[group].members.len() * 2);
        let mut end = 0;
        for id in &self.groups[group].members {
            let slot = self.slots[id];
            if slot.offset > end {
                runs.push((None, slot.offset - end));
            }
            runs.push((Some(*id), slot.len));
            end = slot.offset + slot.len;
        }
        let len = self.groups[group].len;
        if len > end {
            runs.push((None, len - end));
        }
        runs
    }

    /// The segments of the gradient buffers of the parameters `counted` selects, in visiting
    /// order (the gaps, zero, left out).
    pub(crate) fn segments(&self, counted: impl Fn(ParamId) -> bool) -> Vec<FlatSegment> {
        self.order
            .iter()
            .filter(|id| counted(**id))
            .map(|id| {
                let slot = self.slots[id];
                (slot.group, slot.offset, slot.len)
            })
            .collect()
    }

    /// [`Layout::segments`] of this rank's part of every group, offsets within the part.
    pub(crate) fn shard_segments(&self, counted: impl Fn(ParamId) -> bool) -> Vec<FlatSegment> {
        self.order
            .iter()
            .filter(|id| counted(**id))
            .filter_map(|id| {
                let slot = self.slots[id];
                let group = &self.groups[slot.group];
                let part = group
                    .shard
                    .map_or(0..group.len, |shard| shard.range(group.len));
                let start = slot.offset.max(part.start);
                let end = (slot.offset + slot.len).min(part.end);
                (start < end).then(|| (slot.group, start - part.start, end - start))
            })
            .collect()
    }
}

/// The distributed optimizer's parts: each group's by its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sharding {
    /// The part of every group but the experts'.
    pub shard: Shard,
    /// The experts' part, over the expert-data-parallel group (none: `shard`).
    pub expert: Option<Shard>,
}

impl Sharding {
    /// The part of a group of `family`.
    pub(crate) fn of(&self, family: Family) -> Shard {
        match (family, self.expert) {
            (Family::Expert, Some(expert)) => expert,
            _ => self.shard,
        }
    }
}

/// This rank's part of a flat buffer under the distributed optimizer: part `part` of `parts`
/// equal ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shard {
    pub part: usize,
    pub parts: usize,
}

impl Shard {
    /// The part's range of a buffer of `len` elements (a multiple of `parts`).
    pub(crate) fn range(&self, len: usize) -> std::ops::Range<usize> {
        let size = len / self.parts;
        self.part * size..(self.part + 1) * size
    }

    /// The part of `full`, in a buffer of its own (a view would keep the whole alive).
    pub(crate) fn cut<I: Backend>(&self, full: Tensor<I, 1>) -> Tensor<I, 1> {
        let range = self.range(full.dims()[0]);
        full.slice(range).mul_scalar(1.0)
    }
}

/// Master weights and moments of every group, flat fp32 (moments absent before the first step),
/// on the device or, for an offloaded group, in host memory; when `cut`, only this rank's part
/// of each group (the distributed optimizer's).
#[derive(Debug)]
pub(crate) struct FlatState<I: Backend> {
    pub layout: Layout,
    pub master: Vec<Held<I>>,
    pub moments: Vec<Option<(Held<I>, Held<I>)>>,
    pub cut: bool,
    /// Where the model's parameters live (an offloaded group's values are sent there).
    pub device: I::Device,
}

impl<I: Backend> FlatState<I> {
    /// Bytes of the master weights and moments this rank holds on the device: what a checkpoint
    /// snapshot reads off it at least (a save joins the distributed optimizer's parts first,
    /// whose rest it reads too).
    pub(crate) fn device_bytes(&self) -> usize {
        let bytes = |held: &Held<I>| match held {
            Held::Device(x) => x.dims()[0] * x.dtype().size(),
            Held::Host(_) => 0,
        };
        let moments = self.moments.iter().flatten();
        self.master.iter().map(bytes).sum::<usize>()
            + moments.map(|(m, v)| bytes(m) + bytes(v)).sum::<usize>()
    }

    /// Keep only this rank's part of every buffer (a no-op when that is what it holds).
    pub(crate) fn cut(&mut self) {
        if self.cut {
            return;
        }
        for (index, group) in self.layout.groups.iter().enumerate() {
            let Some(shard) = group.shard else { continue };
            self.master[index] = self.master[index].clone().cut(shard);
            if let Some((m, v)) = self.moments[index].as_mut() {
                *m = m.clone().cut(shard);
                *v = v.clone().cut(shard);
            }
        }
        self.cut = true;
    }

    /// Every buffer whole again, its parts all-gathered over the group's `comm` (collective).
    pub(crate) fn join<'a>(&mut self, comm: impl Fn(&Group) -> &'a Comm)
    where
        I: ParallelOps,
    {
        if !std::mem::take(&mut self.cut) {
            return;
        }
        for (index, group) in self.layout.groups.iter().enumerate() {
            if group.shard.is_none() {
                continue;
            }
            let comm = comm(group);
            let device = &self.device;
            // an offloaded part goes through the device, which the collective runs on
            let gather = |x: &Held<I>| {
                let part = primitive(x.on_device(device));
                x.like(from_primitive(I::all_gather_started(part, comm).finish()))
            };
            self.master[index] = gather(&self.master[index]);
            if let Some((m, v)) = self.moments[index].as_mut() {
                *m = gather(m);
                *v = gather(v);
            }
        }
    }
}

impl<I: Backend> FlatState<I> {
    /// Parameter `id`'s range of a group buffer, flattened, on the device.
    pub(crate) fn slice(&self, buffers: &[Held<I>], id: ParamId) -> Option<Tensor<I, 1>> {
        let slot = self.layout.slots.get(&id)?;
        Some(buffers[slot.group].slice(slot.offset..slot.offset + slot.len, &self.device))
    }

    /// Parameter `id`'s two moments, flattened, on the device.
    pub(crate) fn moments_of(&self, id: ParamId) -> Option<(Tensor<I, 1>, Tensor<I, 1>)> {
        let slot = self.layout.slots.get(&id)?;
        let (m, v) = self.moments[slot.group].as_ref()?;
        let range = slot.offset..slot.offset + slot.len;
        Some((
            m.slice(range.clone(), &self.device),
            v.slice(range, &self.device),
        ))
    }
}

/// A step's gradients, one flat buffer per group (the layout's sum dtype), summed over the
/// microbatches so far.
#[derive(Debug)]
pub(crate) struct FlatGrads<I: Backend> {
    pub buffers: Vec<FloatTensor<I>>,
}

/// The gradients of a microbatch by parameter, flattened; the parameters' facts in visiting
/// order.
pub(crate) struct TakenGrads<I: Backend> {
    pub grads: HashMap<ParamId, Tensor<I, 1>>,
    /// `(id, dtype, len, value)` of every parameter with a gradient, in visiting order.
    pub params: Vec<(ParamId, DType, usize, Tensor<I, 1>)>,
}

/// Take every gradient of `model` out of `grads`, flattened.
pub(crate) fn take_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    mut grads: GradientsParams,
) -> TakenGrads<B::InnerBackend> {
    let mut visitor = TakeGrads::<B::InnerBackend> {
        grads: &mut grads,
        taken: TakenGrads {
            grads: HashMap::new(),
            params: Vec::new(),
        },
    };
    model.visit(&mut visitor);
    visitor.taken
}

struct TakeGrads<'a, I: Backend> {
    grads: &'a mut GradientsParams,
    taken: TakenGrads<I>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeGrads<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let value = param.val().inner();
        let len = value.shape().num_elements();
        self.taken
            .params
            .push((param.id, value.dtype(), len, value.reshape([len])));
        self.taken.grads.insert(param.id, grad.reshape([len]));
    }
}

/// `into + this microbatch's gradients` in `layout` (a fresh buffer set without `into`); fails
/// for a gradient of a parameter outside the layout. The buffers are the layout's sum dtype,
/// or with `Sum::Alone` (the step's only microbatch, nothing added to it later) each group's
/// own dtype.
pub(crate) fn gather<I: FusedOps>(
    layout: &Layout,
    mut taken: HashMap<ParamId, Tensor<I, 1>>,
    into: Option<FlatGrads<I>>,
    sum: Sum,
) -> Result<FlatGrads<I>, TrainError> {
    let mut into = into.map(|g| g.buffers.into_iter().map(Some).collect::<Vec<_>>());
    let mut buffers = Vec::with_capacity(layout.groups.len());
    for index in 0..layout.groups.len() {
        let previous = into.as_mut().and_then(|buffers| buffers[index].take());
        let dtype = match sum {
            Sum::Alone if previous.is_none() => layout.groups[index].dtype,
            _ => layout.sum_dtype,
        };
        buffers.push(gather_group(
            layout,
            index,
            |id| taken.remove(&id),
            previous,
            dtype,
        ));
    }
    if !taken.is_empty() {
        return Err(TrainError::Config(format!(
            "{} parameters received a gradient in a later microbatch but none in the step's \
             first; the flat optimizer state is laid out from the first",
            taken.len()
        )));
    }
    Ok(FlatGrads { buffers })
}

/// `previous + this microbatch's gradients` of group `index` (zeros without `previous`) as a
/// `dtype` buffer, each member's flattened gradient taken from `grad` (none: zero).
pub(crate) fn gather_group<I: FusedOps>(
    layout: &Layout,
    index: usize,
    mut grad: impl FnMut(ParamId) -> Option<Tensor<I, 1>>,
    previous: Option<FloatTensor<I>>,
    dtype: DType,
) -> FloatTensor<I> {
    let pieces = layout
        .runs(index)
        .into_iter()
        .map(|(id, len)| FlatPiece {
            len,
            grad: id.and_then(&mut grad).map(primitive),
        })
        .collect();
    I::gather_flat(pieces, previous, dtype)
}

/// Whether a step's flat gradients are a sum (in the layout's sum dtype: microbatches or
/// data-parallel replicas are added into them) or one microbatch's gradients alone, which may
/// keep their own dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sum {
    Summed,
    Alone,
}

/// Every trainable parameter of `model` (not the MoE expert bias, moved by its own rule) as
/// [`TakenGrads::params`] lists those with a gradient: `(id, dtype, len, value)` in visiting
/// order.
pub(crate) fn all_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
) -> Vec<(ParamId, DType, usize, Tensor<B::InnerBackend, 1>)> {
    struct Collect<I: Backend> {
        params: Vec<(ParamId, DType, usize, Tensor<I, 1>)>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<B::InnerBackend> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if !value.is_require_grad() {
                return;
            }
            let value = value.inner();
            let len = value.shape().num_elements();
            self.params
                .push((param.id, value.dtype(), len, value.reshape([len])));
        }
    }
    let mut collect = Collect { params: Vec::new() };
    model.visit(&mut collect);
    collect.params
}

/// `Σ x²` of a step's gradients as `[1]` f32, the norm's sum in the model's order (of this
/// rank's parts only, when the gradients are those, `parts`), over the parameters `counted`
/// selects.
pub(crate) fn sum_of_squares<I: FusedOps>(
    layout: &Layout,
    grads: &FlatGrads<I>,
    parts: bool,
    counted: impl Fn(ParamId) -> bool,
) -> Option<Tensor<I, 1>> {
    let segments = if parts {
        layout.shard_segments(counted)
    } else {
        layout.segments(counted)
    };
    I::segment_sum_of_squares(&grads.buffers, &segments).map(from_primitive)
}

/// One AdamW update of every group; returns each group's new parameter values (the rounded
/// copy of a 16-bit group, the master of an fp32 one).
pub(crate) fn update<I: FusedOps>(
    state: &mut FlatState<I>,
    grads: FlatGrads<I>,
    step: impl Fn(&Group) -> AdamWStep,
    device_scale: Option<Tensor<I, 1>>,
) -> Vec<Tensor<I, 1>> {
    let mut values: Vec<Option<Tensor<I, 1>>> = vec![None; state.layout.groups.len()];
    let mut host_jobs = Vec::new();
    for (index, grad) in grads.buffers.into_iter().enumerate() {
        let group = &state.layout.groups[index];
        // The state is given up to the update (a GPU writes it in place where nothing else
        // holds it): no handle stays behind here.
        let master = std::mem::replace(
            &mut state.master[index],
            Held::Device(Tensor::empty([0], (&state.device, DType::F32))),
        );
        let moments = state.moments[index].take();
        match master {
            Held::Device(master) => {
                let device_moments = |held: Held<I>| match held {
                    Held::Device(x) => primitive(x),
                    Held::Host(_) => unreachable!("a group's buffers are held in one place"),
                };
                let out = I::adamw_step(
                    primitive(master),
                    grad,
                    moments.map(|(m, v)| (device_moments(m), device_moments(v))),
                    step(group),
                    device_scale.clone().map(primitive),
                );
                state.master[index] = Held::Device(from_primitive(out.value));
                state.moments[index] = Some((
                    Held::Device(from_primitive(out.exp_avg)),
                    Held::Device(from_primitive(out.exp_avg_sq)),
                ));
                values[index] = Some(match out.rounded {
                    Some(rounded) => from_primitive(rounded),
                    None => state.master[index].on_device(&state.device),
                });
            }
            Held::Host(master) => {
                let host_moments = |held: Held<I>| match held {
                    Held::Host(x) => x,
                    Held::Device(_) => unreachable!("a group's buffers are held in one place"),
                };
                host_jobs.push(offload::HostJob {
                    group: index,
                    master,
                    moments: moments.map(|(m, v)| (host_moments(m), host_moments(v))),
                    grad,
                    step: step(group),
                });
            }
        }
    }
    if !host_jobs.is_empty() {
        for out in offload::update_on_host(host_jobs, device_scale) {
            state.master[out.group] = Held::Host(out.master);
            state.moments[out.group] = Some((Held::Host(out.moments.0), Held::Host(out.moments.1)));
            values[out.group] = Some(out.values);
        }
    }
    values
        .into_iter()
        .map(|values| values.expect("every group is updated"))
        .collect()
}

/// Gives every parameter in `slots` its new value: a view of its group's buffer.
pub(crate) struct ViewMapper<'a, I: Backend> {
    pub slots: &'a HashMap<ParamId, Slot>,
    pub values: &'a [Tensor<I, 1>],
}

impl<B: AutodiffBackend> ModuleMapper<B> for ViewMapper<'_, B::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some(slot) = self.slots.get(&param.id).copied() else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        let view = self.values[slot.group]
            .clone()
            .slice(slot.offset..slot.offset + slot.len)
            .reshape(dims);
        Param::from_mapped_value(id, Tensor::from_inner(view).require_grad(), mapper)
    }
}

pub(crate) fn primitive<I: Backend>(x: Tensor<I, 1>) -> FloatTensor<I> {
    x.into_primitive().tensor()
}

pub(crate) fn from_primitive<I: Backend>(x: FloatTensor<I>) -> Tensor<I, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

impl<I: FusedOps> FlatState<I> {
    /// Parameter `id`'s range of a group buffer for a checkpoint (see [`Held::shard_values`]).
    pub(crate) fn values(&self, buffers: &[Held<I>], id: ParamId) -> Option<ShardValues> {
        let slot = self.layout.slots.get(&id)?;
        Some(buffers[slot.group].shard_values(slot.offset..slot.offset + slot.len))
    }

    /// Parameter `id`'s two moments for a checkpoint (see [`Held::shard_values`]).
    pub(crate) fn moment_values(&self, id: ParamId) -> Option<(ShardValues, ShardValues)> {
        let slot = self.layout.slots.get(&id)?;
        let (m, v) = self.moments[slot.group].as_ref()?;
        let range = slot.offset..slot.offset + slot.len;
        Some((m.shard_values(range.clone()), v.shard_values(range)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::optim::GradientsAccumulator;
    use burn::tensor::TensorData;

    use super::*;
    use crate::optim::adamw::Laid;
    use crate::precision::grads_to_fp32;
    use crate::step::clip::per_tensor::grad_sum_of_squares;
    use crate::{AdamW, AdamWConfig, named_tensors, param_entries};

    type Cpu = Flex;
    type Ad = Autodiff<Flex>;

    /// 16-bit weights in both groups (decay and not) and an fp32 one.
    #[derive(Module, Debug)]
    struct Mixed<B: Backend> {
        weight: Param<Tensor<B, 2>>,
        bias: Param<Tensor<B, 1>>,
        gain: Param<Tensor<B, 1>>,
    }

    fn param<const D: usize>(
        values: Vec<f32>,
        shape: Vec<usize>,
        dtype: DType,
    ) -> Param<Tensor<Ad, D>> {
        let data = TensorData::new(values, shape);
        Param::from_tensor(Tensor::from_data(data, (&Default::default(), dtype)))
    }

    fn mixed() -> Mixed<Ad> {
        Mixed {
            weight: param(
                (0..12).map(|i| (i as f32 - 5.5) / 4.0).collect(),
                vec![3, 4],
                DType::BF16,
            ),
            bias: param(vec![0.5, -0.25, 1.0, 2.0], vec![4], DType::BF16),
            gain: param(vec![1.5, -0.75], vec![2], DType::F32),
        }
    }

    /// A loss whose gradients depend on the values (so every step differs), scaled per
    /// microbatch; `gain` gets no gradient in the second microbatch (its flat share is zero).
    fn grads(model: &Mixed<Ad>, microbatch: usize) -> GradientsParams {
        let k = 1.0 + microbatch as f64;
        let f32 = |t: Tensor<Ad, 1>| t.cast(DType::F32);
        let weight = model.weight.val().powi_scalar(2).reshape([12]);
        let mut loss = f32(weight.mul_scalar(k)).sum() + f32(model.bias.val().mul_scalar(-k)).sum();
        if microbatch == 0 {
            loss = loss + model.gain.val().powi_scalar(3).sum();
        }
        GradientsParams::from_grads(loss.backward(), model)
    }

    fn optimizer(model: &Mixed<Ad>) -> AdamW<Cpu> {
        offloading(model, None)
    }

    fn offloading(model: &Mixed<Ad>, offload_fraction: Option<f64>) -> AdamW<Cpu> {
        let config = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            moment_dtypes: ferrotron_ops::F32_MOMENTS,
            main_grads_dtype: burn::tensor::DType::F32,
            offload_fraction,
        };
        AdamW::new(config, HashSet::from([model.bias.id]))
    }

    /// The per-parameter step: `microbatches` summed in fp32, then one update per parameter.
    fn per_parameter(
        model: Mixed<Ad>,
        optimizer: &mut AdamW<Cpu>,
        microbatches: usize,
    ) -> (Mixed<Ad>, f32) {
        let mut sum = GradientsAccumulator::<Mixed<Ad>>::new();
        for microbatch in 0..microbatches {
            sum.accumulate(&model, grads_to_fp32(&model, grads(&model, microbatch)));
        }
        let grads = sum.grads();
        let squares = grad_sum_of_squares::<Ad, _>(&model, &grads).expect("gradients");
        (
            optimizer.step(model, grads, 1e-2, 1.0),
            squares.into_scalar(),
        )
    }

    /// The flat step over `microbatches`; also the flat gradient buffers' dtypes.
    fn flat(
        model: Mixed<Ad>,
        optimizer: &mut AdamW<Cpu>,
        microbatches: usize,
        summed: Sum,
    ) -> (Mixed<Ad>, f32, Vec<DType>) {
        let mut sum = None;
        for microbatch in 0..microbatches {
            let grads = grads(&model, microbatch);
            sum = Some(
                optimizer
                    .gather_flat(&model, grads, sum, (Laid::FirstMicrobatch, summed), |_| {})
                    .expect("laid out"),
            );
        }
        let sum = sum.expect("a microbatch");
        let dtypes = sum
            .buffers
            .iter()
            .map(burn::tensor::TensorMetadata::dtype)
            .collect();
        let squares = optimizer
            .flat_sum_of_squares(&sum, |_| true)
            .expect("gradients");
        (
            optimizer.step_flat(model, sum, 1e-2, None, |_, values| values),
            squares.into_scalar(),
            dtypes,
        )
    }

    fn snapshot(model: &Mixed<Ad>, optimizer: &AdamW<Cpu>) -> Vec<(String, Vec<f32>)> {
        let entries = param_entries::<Ad, _>(model);
        let mut all: Vec<_> = named_tensors::<Ad, _>(model)
            .into_iter()
            .chain(optimizer.state_tensors(&entries))
            .map(|t| (t.name, t.values))
            .collect();
        for (entry, id) in entries
            .iter()
            .zip([model.weight.id, model.bias.id, model.gain.id])
        {
            let master = optimizer.master_values(id).map(|m| m.to_vec());
            all.push((format!("{}.master", entry.name), master.unwrap_or_default()));
        }
        all
    }

    /// What an asynchronous save page-locks ahead: the flat masters and both f32 moments of
    /// the 18 parameters, 12 bytes each, none before the first step; an offloaded state is in
    /// host memory already.
    #[test]
    fn the_state_on_the_device_is_counted_in_its_dtypes() {
        let model = mixed();
        let mut opt = optimizer(&model);
        assert_eq!(opt.device_state_bytes(), 0);
        let _ = flat(model, &mut opt, 2, Sum::Summed);
        assert_eq!(opt.device_state_bytes(), 18 * 12);
        let model = mixed();
        let mut offloaded = offloading(&model, Some(1.0));
        let _ = flat(model, &mut offloaded, 2, Sum::Summed);
        assert_eq!(offloaded.device_state_bytes(), 0);
    }

    #[test]
    fn flat_steps_give_the_per_parameter_steps_numbers() {
        let mut model = mixed();
        let mut reference = mixed();
        let (mut opt, mut opt_ref) = (optimizer(&model), optimizer(&reference));
        // Flat, flat, back to per parameter (the state unflattens), flat again (it flattens
        // with moments): every step against per-parameter steps, to the bit.
        for step in 0..4 {
            let (next, squares) = if step == 2 {
                per_parameter(model, &mut opt, 2)
            } else {
                let (next, squares, dtypes) = flat(model, &mut opt, 2, Sum::Summed);
                assert!(dtypes.iter().all(|&d| d == DType::F32), "{dtypes:?}");
                (next, squares)
            };
            let (next_ref, squares_ref) = per_parameter(reference, &mut opt_ref, 2);
            assert_eq!(squares, squares_ref, "step {step}: Σ g²");
            assert_eq!(
                snapshot(&next, &opt),
                snapshot(&next_ref, &opt_ref),
                "step {step}"
            );
            assert_eq!(next.weight.val().dtype(), DType::BF16);
            (model, reference) = (next, next_ref);
        }
        assert!(opt.has_master(model.weight.id));
        assert!(!opt.has_master(model.gain.id), "fp32: its own master");
    }

    /// A step of one microbatch keeps its 16-bit gradients 16-bit in the flat buffers (nothing
    /// is added to them) and still gives the per-parameter step's numbers to the bit: the norm
    /// and the update widen each value as the fp32 buffer held it.
    #[test]
    fn one_microbatch_alone_keeps_its_gradients_dtype_and_the_same_numbers() {
        let mut model = mixed();
        let mut reference = mixed();
        let (mut opt, mut opt_ref) = (optimizer(&model), optimizer(&reference));
        for step in 0..3 {
            let (next, squares, dtypes) = flat(model, &mut opt, 1, Sum::Alone);
            // the bf16 groups (weight, decaying; bias, not) and the f32 one (gain)
            assert_eq!(
                dtypes.iter().filter(|&&d| d == DType::BF16).count(),
                2,
                "{dtypes:?}"
            );
            assert_eq!(
                dtypes.iter().filter(|&&d| d == DType::F32).count(),
                1,
                "{dtypes:?}"
            );
            let (next_ref, squares_ref) = per_parameter(reference, &mut opt_ref, 1);
            assert_eq!(squares, squares_ref, "step {step}: Σ g²");
            assert_eq!(
                snapshot(&next, &opt),
                snapshot(&next_ref, &opt_ref),
                "step {step}"
            );
            (model, reference) = (next, next_ref);
        }
    }

    /// Megatron's CPU offload: the groups it takes hold their master and moments in host
    /// memory and step to the in-device numbers to the bit (on the CPU both run one kernel),
    /// the whole optimizer or the part the fraction selects.
    #[test]
    fn offloaded_groups_hold_their_state_in_host_memory_and_step_to_the_same_bits() {
        for (fraction, offloaded) in [
            (1.0, vec![true, true, true]),
            (0.5, vec![true, false, false]),
        ] {
            let mut model = mixed();
            let mut reference = mixed();
            let mut opt = offloading(&model, Some(fraction));
            let mut opt_ref = optimizer(&reference);
            for step in 0..3 {
                let (next, squares, _) = flat(model, &mut opt, 2, Sum::Summed);
                let (next_ref, squares_ref, _) = flat(reference, &mut opt_ref, 2, Sum::Summed);
                assert_eq!(squares, squares_ref, "step {step}: Σ g²");
                assert_eq!(
                    snapshot(&next, &opt),
                    snapshot(&next_ref, &opt_ref),
                    "fraction {fraction}, step {step}"
                );
                (model, reference) = (next, next_ref);
            }
            assert!(opt.updates_on_host(), "fraction {fraction}");
            assert!(!opt_ref.updates_on_host());
            let state = opt.flat_state().expect("flat");
            // groups by (decay, dtype): weight (bf16, decays), bias (bf16), gain (f32, decays)
            let group = |id| state.layout.slots[&id].group;
            for (id, offloaded) in [model.weight.id, model.bias.id, model.gain.id]
                .into_iter()
                .zip(offloaded)
            {
                let index = group(id);
                assert_eq!(state.layout.groups[index].offloaded, offloaded);
                let (m, v) = state.moments[index].as_ref().expect("stepped");
                for held in [&state.master[index], m, v] {
                    assert_eq!(
                        matches!(held, Held::Host(_)),
                        offloaded,
                        "fraction {fraction}"
                    );
                }
            }
        }
    }

    /// ZeRO-1's layout: groups padded to equal parts (aligned), and each part's segments the
    /// pieces of the parameters inside it, in visiting order, offsets within the part.
    #[test]
    fn shard_segments_cover_each_part_of_the_padded_groups() {
        let (a, b, c) = (ParamId::new(), ParamId::new(), ParamId::new());
        let facts = |id, len, decays| ParamFacts {
            id,
            dtype: DType::F32,
            len,
            decays,
            bucket: 0,
            family: Family::Dense,
            offloaded: false,
        };
        let layout = Layout::new(
            &[facts(a, 100, true), facts(b, 30, false), facts(c, 20, true)],
            Some(Sharding {
                shard: Shard { part: 0, parts: 2 },
                expert: None,
            }),
            DType::F32,
        );
        // decay group: a at 0, c at 128 (aligned), padded to 2 × 64 × 2 = 256; no-decay: b
        assert_eq!(layout.groups[0].len, 256);
        assert_eq!(layout.groups[1].len, 128);
        let part = |part| {
            let mut layout = layout.clone();
            for group in &mut layout.groups {
                group.shard = Some(Shard { part, parts: 2 });
            }
            layout.shard_segments(|_| true)
        };
        assert_eq!(part(0), vec![(0, 0, 100), (1, 0, 30)]);
        assert_eq!(part(1), vec![(0, 0, 20)]);
        assert_eq!(
            layout.runs(0),
            vec![(Some(a), 100), (None, 28), (Some(c), 20), (None, 108)]
        );
    }

    #[test]
    fn a_gradient_outside_the_first_microbatchs_set_is_refused() {
        let model = mixed();
        let mut opt = optimizer(&model);
        let f32 = |t: Tensor<Ad, 1>| t.cast(DType::F32);
        let only_bias = f32(model.bias.val()).sum();
        let first = GradientsParams::from_grads(only_bias.backward(), &model);
        let laid = (Laid::FirstMicrobatch, Sum::Summed);
        let sum = opt
            .gather_flat(&model, first, None, laid, |_| {})
            .expect("laid out");
        let err = opt
            .gather_flat(&model, grads(&model, 0), Some(sum), laid, |_| {})
            .expect_err("weight and gain were not in the first microbatch");
        assert!(err.to_string().contains("2 parameters"), "{err}");
    }

    /// Where the flat state's moment buffers' bytes are: the same addresses after a step are
    /// an update in place.
    fn moment_addresses(optimizer: &AdamW<Cpu>) -> Vec<usize> {
        let address = |held: &Held<Cpu>| match held {
            Held::Device(x) => {
                let x: burn::backend::flex::FlexTensor = x.clone().into_primitive().tensor();
                x.bytes().as_ptr() as usize
            }
            Held::Host(_) => unreachable!("nothing is offloaded here"),
        };
        let flat = optimizer.flat_state().expect("a flat state");
        flat.moments
            .iter()
            .flatten()
            .flat_map(|(m, v)| [address(m), address(v)])
            .collect()
    }

    /// An asynchronous save's shards are ranges of the state's buffers; the next update waits
    /// at the save's gate until the writer has read them and let them go, then writes the state
    /// in place (without the gate it would find them shared and write new buffers beside them).
    #[test]
    fn an_update_after_a_snapshot_waits_for_its_reads_and_writes_in_place() {
        let mut model = mixed();
        let mut opt = optimizer(&model);
        model = flat(model, &mut opt, 1, Sum::Summed).0;
        let entries = param_entries::<Ad, _>(&model);
        let mut shards: Vec<ShardValues> = opt
            .state_values(&entries)
            .into_iter()
            .map(|(_, _, values)| values)
            .collect();
        assert!(
            shards.iter().all(|v| matches!(v, ShardValues::Device(_))),
            "the snapshot reads nothing yet"
        );
        let before = moment_addresses(&opt);
        // the same values, read through a snapshot of their own
        let expected: Vec<Vec<f32>> = opt
            .state_tensors(&entries)
            .into_iter()
            .map(|t| t.values)
            .collect();
        let gate = crate::checkpoint::SnapshotGate::default();
        opt.hold_until(gate.clone());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            for shard in &mut shards {
                shard.read_device();
            }
            let read: Vec<Vec<f32>> = shards.iter().map(ShardValues::to_vec).collect();
            drop(shards);
            gate.open();
            read
        });
        let _ = flat(model, &mut opt, 1, Sum::Summed);
        assert_eq!(
            writer.join().unwrap(),
            expected,
            "the writer read the saved step's state"
        );
        assert_eq!(
            before,
            moment_addresses(&opt),
            "the moments were updated in place"
        );
    }
}
