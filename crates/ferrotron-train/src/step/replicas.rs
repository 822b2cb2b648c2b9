//! Data parallelism with the whole model on every rank (tensor, pipeline, context and expert
//! degrees all 1, the plain optimizer): each rank runs the one-rank device step over its share
//! of the microbatches, and the step's flat gradient buffers are averaged over the
//! data-parallel group before the norm and the update. The buffers are what the optimizer
//! already owns (`flat_adamw.rs`), so the reduction is one collective per buffer on the device
//! (NCCL on a GPU, no host copy) instead of the host exchange the general layouts take, and
//! every rank then computes the same norm, clipping factor and update.
//!
//! With `parallel.overlap_grad_reduce` the last microbatch's backward runs layer by layer
//! (`ferrotron_parallel::recompute`'s kept cuts) and each bucket of layers is reduced as soon
//! as its gradients are final, on the communication stream, while the backward of the layers
//! in front of it is still being queued (Megatron's DDP overlap). The buckets are groups of the
//! flat layout, so the numbers are the same with and without overlap.

use std::collections::HashMap;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{Shape, Tensor, TensorMetadata};
use ferrotron_model::ExpertLoads;
use ferrotron_parallel::{Comm, InFlight, ParallelOps, ReduceOp, prefetch};

use crate::TrainError;
use crate::error::comm_error;
use crate::optim::flat_adamw::{FlatGrads, Group, Layout, from_primitive, gather_group, primitive};
use crate::run::host_read::read_to_host;

/// Elements per gradient bucket (Megatron's `--ddp-bucket-size` default of 40M).
pub(crate) const GRAD_BUCKET_ELEMENTS: usize = 40_000_000;

/// The data-parallel group a replicated rank averages its step over.
#[derive(Clone)]
pub(crate) struct Replicas {
    pub comm: Comm,
    /// Reduce buckets during the last microbatch's backward (`parallel.overlap_grad_reduce`).
    pub overlap: bool,
    /// ZeRO-1 (`parallel.distributed_optimizer`): gradients reduce-scattered, the optimizer
    /// state and update this rank's part of every flat buffer, the new values all-gathered.
    pub shard: bool,
    /// With `shard` and `parallel.overlap_param_gather`: per bucket, the first layer that reads
    /// its parameters (none: read before the layers); the next forward waits for a bucket's
    /// all-gather only there (`ferrotron_parallel::prefetch`).
    pub gather_before: Option<Vec<Option<usize>>>,
    /// The tensor-parallel group and what its ranks hold in common.
    pub tensor: TensorReplicas,
}

/// What a tensor-parallel rank's gradients need before the data-parallel average: the partial
/// ones (sequence parallelism's norms and row-parallel biases, in the model's order) summed over
/// the group, and the parameters every member holds whole counted in the norm once.
#[derive(Clone)]
pub(crate) struct TensorReplicas {
    pub comm: Comm,
    pub partial: Vec<ParamId>,
    pub duplicate: std::collections::HashSet<ParamId>,
}

impl TensorReplicas {
    /// The group `comm` and, from the rank's parameter roles, its partial and its duplicate
    /// parameters.
    pub(crate) fn new(comm: &Comm, roles: &[ferrotron_parallel::ParamRole]) -> Self {
        let ids = |pick: fn(&ferrotron_parallel::ParamRole) -> bool| {
            roles.iter().filter(move |r| pick(r)).map(|r| r.id)
        };
        TensorReplicas {
            comm: comm.clone(),
            partial: ids(|r| r.tp_partial).collect(),
            duplicate: ids(|r| r.tp_duplicate).collect(),
        }
    }

    /// Sums the partial gradients present in `grads` over the group (one all-reduce).
    pub(crate) fn complete<I: ParallelOps>(&self, grads: &mut HashMap<ParamId, Tensor<I, 1>>) {
        if self.comm.size() == 1 {
            return;
        }
        let present: Vec<ParamId> = self
            .partial
            .iter()
            .copied()
            .filter(|id| grads.contains_key(id))
            .collect();
        if present.is_empty() {
            return;
        }
        let parts: Vec<Tensor<I, 1>> = present.iter().map(|id| grads[id].clone()).collect();
        let lens: Vec<usize> = parts.iter().map(|p| p.dims()[0]).collect();
        let summed =
            I::all_reduce_detached(primitive(Tensor::cat(parts, 0)), ReduceOp::Sum, &self.comm);
        let summed = from_primitive::<I>(summed);
        let mut at = 0;
        for (id, len) in present.into_iter().zip(lens) {
            grads.insert(id, summed.clone().slice(at..at + len));
            at += len;
        }
    }

    /// Whether this rank counts `id`'s gradient in the norm.
    pub(crate) fn counts(&self, id: ParamId) -> bool {
        self.comm.rank() == 0 || !self.duplicate.contains(&id)
    }
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Replicas({}, overlap {})",
            self.comm.label(),
            self.overlap
        )
    }
}

impl Replicas {
    /// The group mean of `x` (every rank ends with the same values): summed over the group in
    /// rank order, then multiplied by `1/size` in f32, as the host exchange averages.
    pub(crate) fn mean<I: ParallelOps>(&self, x: FloatTensor<I>) -> FloatTensor<I> {
        let size = self.comm.size();
        if size == 1 {
            return x;
        }
        divided::<I>(I::all_reduce_detached(x, ReduceOp::Sum, &self.comm), size)
    }

    /// Starts the reduction of one flat gradient buffer over the group: an all-reduce, or with
    /// `shard` a reduce-scatter to this rank's part.
    pub(crate) fn start<I: ParallelOps>(&self, buffer: FloatTensor<I>) -> InFlight<I> {
        if self.shard {
            I::reduce_scatter_started(buffer, &self.comm)
        } else {
            I::all_reduce_started(buffer, &self.comm)
        }
    }

    /// A started reduction's sum divided by the group size (in f32, as the host exchange does).
    pub(crate) fn average<I: ParallelOps>(&self, started: InFlight<I>) -> FloatTensor<I> {
        divided::<I>(started.finish(), self.comm.size())
    }

    /// The world's Σg² from this rank's `part` (none: it counts no gradient): summed over the
    /// tensor-parallel group, and over the data-parallel one with ZeRO-1's parts.
    pub(crate) fn total_squares<I: ParallelOps>(
        &self,
        part: Option<Tensor<I, 1>>,
        device: &I::Device,
    ) -> Option<Tensor<I, 1>> {
        if self.tensor.comm.size() == 1 && !self.shard {
            return part;
        }
        let data = self.shard.then_some(&self.comm);
        Some(summed_over(
            part,
            [Some(&self.tensor.comm), data].into_iter().flatten(),
            device,
        ))
    }

    /// With `shard`: `part` (a group's new values, this rank's part) all-gathered whole, the
    /// compute stream ordered after the gather now, or (with `gather_before`) when the next
    /// forward reaches the first layer reading it. Without: `part` itself.
    pub(crate) fn expand<I: ParallelOps>(&self, group: &Group, part: Tensor<I, 1>) -> Tensor<I, 1> {
        if !self.shard {
            return part;
        }
        let before = self
            .gather_before
            .as_ref()
            .and_then(|first| first.get(group.bucket).copied().flatten());
        gathered_whole(part, &self.comm, before)
    }

    /// The group mean of a 1-D tensor.
    pub(crate) fn mean_tensor<I: ParallelOps>(&self, x: Tensor<I, 1>) -> Tensor<I, 1> {
        from_primitive(self.mean::<I>(primitive(x)))
    }

    /// Every rank's expert loads summed (exact, u64), for the bias update every rank applies.
    pub(crate) fn sum_loads(&self, loads: &mut ExpertLoads) -> Result<(), TrainError> {
        sum_loads(&self.comm, loads)
    }
}

/// How a step's flat groups are summed over the ranks holding their parameters: the replicated
/// step's (every group over its data-parallel group) and the per-chunk exchange's
/// (`per_chunk.rs`: by the group's family).
pub(crate) trait GroupReduction<I: Backend> {
    /// A group's reduction under way.
    type Pending;
    /// Sums the partial gradients present in `grads` over the tensor-parallel group.
    fn complete(&self, grads: &mut HashMap<ParamId, Tensor<I, 1>>);
    /// Starts the reduction of a group's gradient sum.
    fn begin(&self, group: &Group, sum: FloatTensor<I>) -> Self::Pending;
    /// The group's average (this rank's part of it under ZeRO-1).
    fn end(&self, group: &Group, pending: Self::Pending) -> FloatTensor<I>;
}

impl<I: ParallelOps> GroupReduction<I> for Replicas {
    type Pending = InFlight<I>;

    fn complete(&self, grads: &mut HashMap<ParamId, Tensor<I, 1>>) {
        self.tensor.complete(grads);
    }

    fn begin(&self, _group: &Group, sum: FloatTensor<I>) -> InFlight<I> {
        self.start(sum)
    }

    fn end(&self, _group: &Group, pending: InFlight<I>) -> FloatTensor<I> {
        self.average(pending)
    }
}

/// One step's overlapped reduction: the flat groups of each bucket gathered and their
/// reduction started as soon as every member's gradient is final, in bucket order (the same on
/// every rank, as NCCL needs), then all finished and averaged before the norm.
pub(crate) struct BucketReduction<'a, B: AutodiffBackend, R: GroupReduction<B::InnerBackend>> {
    reduction: &'a R,
    layout: Layout,
    params: HashMap<ParamId, FloatTensor<B>>,
    /// Group indices of each bucket, in bucket order.
    buckets: Vec<Vec<usize>>,
    next: usize,
    /// Per group: the sum of the step's earlier microbatches, until gathered.
    earlier: Vec<Option<FloatTensor<B::InnerBackend>>>,
    started: Vec<Option<R::Pending>>,
}

impl<'a, B, R> BucketReduction<'a, B, R>
where
    B: crate::TrainBackend,
    R: GroupReduction<B::InnerBackend>,
{
    /// For `model`'s last microbatch, on top of the earlier microbatches' sums `earlier`.
    pub(crate) fn new<M: Module<B>>(
        reduction: &'a R,
        layout: &Layout,
        model: &M,
        earlier: Option<FlatGrads<B::InnerBackend>>,
    ) -> Self {
        let groups = layout.groups.len();
        let count = layout
            .groups
            .iter()
            .map(|g| g.bucket + 1)
            .max()
            .unwrap_or(0);
        let mut buckets = vec![Vec::new(); count];
        for (index, group) in layout.groups.iter().enumerate() {
            buckets[group.bucket].push(index);
        }
        let earlier = match earlier {
            Some(sums) => sums.buffers.into_iter().map(Some).collect(),
            None => (0..groups).map(|_| None).collect(),
        };
        BucketReduction {
            reduction,
            layout: layout.clone(),
            params: param_tensors(model).into_iter().collect(),
            buckets,
            next: 0,
            earlier,
            started: (0..groups).map(|_| None).collect(),
        }
    }

    /// After a range of the backward: start every bucket, in order, whose members all have
    /// their gradient in `grads` (a layer's parameters get theirs only from its own range, so
    /// present means final; the last bucket, used outside the layers, waits for [`Self::finish`]).
    pub(crate) fn range_done(&mut self, grads: &mut B::Gradients) {
        while self.next + 1 < self.buckets.len() {
            let members = self.buckets[self.next]
                .iter()
                .flat_map(|&group| &self.layout.groups[group].members);
            let ready = members
                .clone()
                .all(|id| B::grad(&self.params[id], grads).is_some());
            if !ready {
                return;
            }
            let params = std::mem::take(&mut self.params);
            self.start(self.next, |id| {
                B::grad_remove(&params[&id], grads).map(|g| {
                    let len = g.shape().num_elements();
                    from_primitive(B::InnerBackend::float_reshape(g, Shape::new([len])))
                })
            });
            self.params = params;
            self.next += 1;
        }
    }

    /// The step's reduced buffers: the buckets not started yet gathered from `rest` (the
    /// backward's remaining gradients, flattened) and started, then all of them finished and
    /// averaged.
    pub(crate) fn finish(
        self,
        rest: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
    ) -> FlatGrads<B::InnerBackend> {
        self.launch(rest).finish()
    }

    /// [`Self::finish`]'s first half: every bucket started, none waited for.
    pub(crate) fn launch(
        mut self,
        mut rest: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
    ) -> Launched<'a, B::InnerBackend, R> {
        while self.next < self.buckets.len() {
            self.start(self.next, |id| rest.remove(&id));
            self.next += 1;
        }
        Launched {
            reduction: self.reduction,
            layout: self.layout,
            started: self
                .started
                .into_iter()
                .map(|started| started.expect("every bucket was started"))
                .collect(),
        }
    }

    fn start(
        &mut self,
        bucket: usize,
        mut grad: impl FnMut(ParamId) -> Option<Tensor<B::InnerBackend, 1>>,
    ) {
        let mut grads: HashMap<ParamId, Tensor<B::InnerBackend, 1>> = self.buckets[bucket]
            .iter()
            .flat_map(|&group| &self.layout.groups[group].members)
            .filter_map(|&id| grad(id).map(|g| (id, g)))
            .collect();
        self.reduction.complete(&mut grads);
        for &group in &self.buckets[bucket] {
            let previous = self.earlier[group].take();
            let sum = gather_group(
                &self.layout,
                group,
                |id| grads.remove(&id),
                previous,
                self.layout.sum_dtype,
            );
            self.started[group] = Some(self.reduction.begin(&self.layout.groups[group], sum));
        }
    }
}

/// A step's reductions, every group started.
pub(crate) struct Launched<'a, I: Backend, R: GroupReduction<I>> {
    reduction: &'a R,
    layout: Layout,
    started: Vec<R::Pending>,
}

impl<I: Backend, R: GroupReduction<I>> Launched<'_, I, R> {
    /// Every group's reduction finished: the step's averaged buffers.
    pub(crate) fn finish(self) -> FlatGrads<I> {
        let buffers = self
            .started
            .into_iter()
            .zip(&self.layout.groups)
            .map(|(pending, group)| self.reduction.end(group, pending))
            .collect();
        FlatGrads { buffers }
    }
}

/// Parameters in buckets for an overlapped reduction: the transformer layers' parameters (found
/// by their `layers.<n>.` names) in buckets of consecutive layers of about `bucket_elements`
/// each, counted from the last layer (backward produces those first); every other parameter
/// (embeddings, final norm, output layer: used outside the layers, the tied embedding twice) in
/// the last bucket, reduced after the backward.
pub(crate) struct Buckets {
    pub of_param: Vec<(ParamId, usize)>,
    /// Per bucket, its first layer (none: the last bucket's parameters, read before the layers).
    pub first_layer: Vec<Option<usize>>,
}

pub(crate) fn layer_buckets<B: Backend, M: Module<B>>(
    model: &M,
    bucket_elements: usize,
) -> Buckets {
    let params = crate::param_entries::<B, M>(model);
    let layer_of = |name: &str| -> Option<usize> {
        let rest = name.split("layers.").nth(1)?;
        rest.split('.').next()?.parse().ok()
    };
    let mut sizes = std::collections::BTreeMap::<usize, usize>::new();
    for entry in &params {
        if let Some(layer) = layer_of(&entry.name) {
            *sizes.entry(layer).or_default() += entry.shape.iter().product::<usize>();
        }
    }
    // from the last layer down: a bucket closes once it holds `bucket_elements`
    let mut bucket_of_layer = HashMap::new();
    let mut first_layer = Vec::new();
    let mut held = 0;
    for (&layer, &size) in sizes.iter().rev() {
        if first_layer.is_empty() || held > 0 && held + size > bucket_elements {
            first_layer.push(Some(layer));
            held = 0;
        }
        let bucket = first_layer.len() - 1;
        first_layer[bucket] = Some(layer);
        bucket_of_layer.insert(layer, bucket);
        held += size;
    }
    let last = first_layer.len();
    first_layer.push(None);
    let of_param = params
        .iter()
        .map(|entry| {
            let bucket = layer_of(&entry.name).map_or(last, |layer| bucket_of_layer[&layer]);
            (entry.id, bucket)
        })
        .collect();
    Buckets {
        of_param,
        first_layer,
    }
}

/// Every float parameter of `module` by id, as the autodiff graph knows it (to look its
/// gradient up in a backward's container).
pub(crate) fn param_tensors<B: AutodiffBackend, M: Module<B>>(
    module: &M,
) -> Vec<(ParamId, FloatTensor<B>)> {
    struct Collect<B: AutodiffBackend> {
        out: Vec<(ParamId, FloatTensor<B>)>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.out
                .push((param.id, param.val().into_primitive().tensor()));
        }
    }
    let mut collect = Collect { out: Vec::new() };
    module.visit(&mut collect);
    collect.out
}

/// A sum over `ranks` ranks divided by their count, in f32 (as the host exchange averaged).
pub(crate) fn divided<I: Backend>(sum: FloatTensor<I>, ranks: usize) -> FloatTensor<I> {
    if ranks == 1 {
        return sum;
    }
    primitive(from_primitive::<I>(sum).mul_scalar(1.0 / ranks as f32))
}

/// A `[1]` sum (of squares) from this rank's `part` (none: zero) summed over each of `comms`.
pub(crate) fn summed_over<'a, I: ParallelOps>(
    part: Option<Tensor<I, 1>>,
    comms: impl IntoIterator<Item = &'a Comm>,
    device: &I::Device,
) -> Tensor<I, 1> {
    let mut sum = part.unwrap_or_else(|| Tensor::zeros([1], (device, burn::tensor::DType::F32)));
    for comm in comms.into_iter().filter(|comm| comm.size() > 1) {
        sum = from_primitive(I::all_reduce_detached(primitive(sum), ReduceOp::Sum, comm));
    }
    sum
}

/// A ZeRO-1 `part` all-gathered whole over `comm`, the compute stream ordered after the gather
/// now or, with `before`, when the next forward reaches that layer
/// (`ferrotron_parallel::prefetch`).
pub(crate) fn gathered_whole<I: ParallelOps>(
    part: Tensor<I, 1>,
    comm: &Comm,
    before: Option<usize>,
) -> Tensor<I, 1> {
    let (whole, wait) = I::all_gather_started(primitive(part), comm).split();
    if let Some(wait) = wait {
        match before {
            Some(layer) => prefetch::before_layer_run(layer, wait),
            None => wait(),
        }
    }
    from_primitive(whole)
}

/// Sums expert loads over `comm` (u64, exact).
pub(crate) fn sum_loads(comm: &Comm, loads: &mut ExpertLoads) -> Result<(), TrainError> {
    let layers = loads.layers();
    if comm.size() == 1 || layers.is_empty() {
        return Ok(());
    }
    let mut flat: Vec<u64> = layers.iter().flatten().copied().collect();
    read_to_host(|| comm.all_reduce_u64(&mut flat, ReduceOp::Sum))
        .map_err(|e| comm_error("expert-load all-reduce", e))?;
    let mut at = 0;
    for layer in layers.iter_mut() {
        let len = layer.len();
        layer.copy_from_slice(&flat[at..at + len]);
        at += len;
    }
    Ok(())
}
