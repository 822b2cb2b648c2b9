//! fp8 linear layers for [`FusedOps`]: Transformer Engine's recipe (per-tensor scales, fp8
//! GEMMs for the forward, data-gradient and weight-gradient products, everything else in the
//! layer's own dtype) written once on three backend primitives, so the same bookkeeping runs on
//! a GPU's kernels and on a CPU reference that tests it:
//!
//! - [`FusedOps::fp8_quantize`]: a 2-D tensor cast to fp8 *and* transposed in one pass, with
//!   its amax recorded into the layer's scaling state (delayed scaling) or measured first and
//!   used for the scale (current scaling);
//! - [`FusedOps::fp8_matmul`]: `a · bᵀ` of two fp8 operands whose contraction dimension is
//!   contiguous in both (Hopper's fp8 tensor cores take only that "TN" form), dequantised by
//!   the operands' inverse scales, written in a 16-bit or f32 dtype;
//! - [`FusedOps::fp8_update_scaling`]: the step-end update of every layer's scales from its
//!   amax history (`fp8/scaling.rs`).
//!
//! Hence the transposes: `y = x·W` needs `x [M, K]` and `Wᵀ [N, K]`, the data gradient
//! `dx = dy·Wᵀ` needs `dy [M, N]` and `W [K, N]`, the weight gradient `dW = xᵀ·dy` needs
//! `xᵀ [K, M]` and `dyᵀ [N, M]`. The forward keeps only `xᵀ` in fp8 (half of a bf16 `x`) and
//! the weight's casts; the weights are cast once per optimizer step ([`Fp8State`] caches them
//! by step) and reused by every microbatch and by the backward.
//!
//! The reference primitives (the trait's defaults) round on the host with `fp8/scaling.rs`'s
//! grids and keep the fp8 values as f32 numbers on the grid, so a CPU test drives the real
//! autodiff node (`fp8/node.rs`) and sees exactly the products an fp8 GEMM computes. They
//! read tensors to the host and are for tests: a backend without fp8 GEMMs refuses fp8 runs
//! ([`FusedOps::fp8_support`]), it never trains fp8 recipes in bf16 behind the user's back.
//!
//! The scaling state lives outside burn's module tree: burn's `Module` derive cannot carry a
//! backend-typed non-parameter field through `valid()`, and the state is written by the
//! forward and backward passes, which a module cannot do. One [`Fp8State`] per model chunk
//! holds a `[layers, 3 · (3 + history)]` f32 tensor of whichever backend runs the kernels
//! (created on first use, on the device of the first input), shared by the chunk's
//! [`Fp8Linear`] handles.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorData, TensorMetadata};

use crate::FusedOps;
use crate::fp8::norm::Fp8InputNorm;
use crate::fp8::scaling::{
    AMAX, Fp8Format, Fp8Role, Fp8Scaling, Fp8Settings, SCALE, amax, amax_max, current_scale,
    round_to_fp8, update_state,
};
use crate::op::norm::NormStats;
use crate::primitive::{unwrap, wrap};

/// A 2-D tensor in fp8: its values, its transpose, the inverse scale of both.
#[derive(Debug, Clone)]
pub struct Fp8Tensor<B: Backend> {
    /// `[rows, cols]` in the backend's fp8 storage (bytes on a GPU, grid values as f32 in the
    /// reference).
    pub data: FloatTensor<B>,
    /// `[cols, rows]`.
    pub transposed: FloatTensor<B>,
    /// `[1]` f32: the stored values times this are the tensor.
    pub scale_inv: FloatTensor<B>,
    pub format: Fp8Format,
}

/// One operand of [`FusedOps::fp8_matmul`]: `[rows, k]` fp8 values, `k` contiguous.
#[derive(Debug, Clone)]
pub struct Fp8Operand<B: Backend> {
    pub data: FloatTensor<B>,
    pub scale_inv: FloatTensor<B>,
    pub format: Fp8Format,
}

impl<B: Backend> Fp8Tensor<B> {
    /// The tensor as an operand contracting over its columns.
    pub fn rows(&self) -> Fp8Operand<B> {
        Fp8Operand {
            data: self.data.clone(),
            scale_inv: self.scale_inv.clone(),
            format: self.format,
        }
    }

    /// The tensor as an operand contracting over its rows (its transpose's columns).
    pub fn columns(&self) -> Fp8Operand<B> {
        Fp8Operand {
            data: self.transposed.clone(),
            scale_inv: self.scale_inv.clone(),
            format: self.format,
        }
    }
}

type Erased = Box<dyn Any + Send>;

/// One model chunk's fp8 scaling state: the recipe, every fp8 layer's state row (a tensor of
/// the backend that runs the kernels), the optimizer step it is at and the weights cast in it.
pub struct Fp8State {
    settings: Fp8Settings,
    /// Each layer's name (its weight's parameter path without `.weight`), by slot.
    names: Vec<String>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// `FloatTensor<K>` `[slots, row_width]` f32, for the backend `K` that created it.
    tensor: Option<Erased>,
    /// Optimizer steps ended so far (cast weights of an earlier step are stale).
    step: u64,
    /// Slot → (step it was cast in, `Fp8Tensor<K>`).
    weights: HashMap<usize, (u64, Erased)>,
    /// Slots whose state holds scales from an amax: every slot once a step has ended, those a
    /// checkpoint restored before that.
    scaled: Vec<bool>,
}

impl fmt::Debug for Fp8State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fp8State")
            .field("settings", &self.settings)
            .field("layers", &self.names.len())
            .finish()
    }
}

fn downcast<K: Backend>(value: &mut Erased) -> &mut FloatTensor<K> {
    value
        .downcast_mut::<FloatTensor<K>>()
        .expect("the fp8 scaling state belongs to the backend that created it")
}

impl Fp8State {
    /// The state of the layers named `names` (slot `i` is `names[i]`), before any step.
    pub fn new(settings: Fp8Settings, names: Vec<String>) -> Arc<Self> {
        let inner = Inner {
            scaled: vec![false; names.len()],
            ..Inner::default()
        };
        Arc::new(Fp8State {
            settings,
            names,
            inner: Mutex::new(inner),
        })
    }

    pub fn settings(&self) -> &Fp8Settings {
        &self.settings
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the state tensor of backend `K`, created on `device` at first use. A
    /// backend may replace the tensor (functional updates) or write it in place.
    pub fn with_tensor<K: Backend, R>(
        &self,
        device: &K::Device,
        f: impl FnOnce(&mut FloatTensor<K>) -> R,
    ) -> R {
        let mut inner = self.lock();
        let tensor = inner.tensor.get_or_insert_with(|| {
            let slots = self.names.len();
            let values = self.settings.initial_state(slots);
            let shape = [slots, self.settings.row_width()];
            Box::new(f32_tensor::<K>(values, shape, device))
        });
        f(downcast::<K>(tensor))
    }

    /// Runs `f` on the state tensor where one exists (nothing was cast yet otherwise).
    pub fn update_tensor<K: Backend>(&self, f: impl FnOnce(&mut FloatTensor<K>)) {
        if let Some(tensor) = self.lock().tensor.as_mut() {
            f(downcast::<K>(tensor));
        }
    }

    /// Each layer's state row by name (none before the first cast): what a checkpoint keeps.
    pub fn rows<K: Backend>(&self) -> Vec<(String, Vec<f32>)> {
        let mut inner = self.lock();
        let Some(tensor) = inner.tensor.as_mut() else {
            return Vec::new();
        };
        let values = host_values::<K>(downcast::<K>(tensor).clone());
        let width = self.settings.row_width();
        self.names
            .iter()
            .cloned()
            .zip(values.chunks_exact(width).map(<[f32]>::to_vec))
            .collect()
    }

    /// Restores the rows a checkpoint kept (by name; layers it lacks start fresh), as at the
    /// start of a step: the weights are cast again.
    pub fn restore<K: Backend>(
        &self,
        rows: &HashMap<String, Vec<f32>>,
        device: &K::Device,
    ) -> Result<(), String> {
        let width = self.settings.row_width();
        let mut values = self.settings.initial_state(self.names.len());
        let mut scaled = vec![false; self.names.len()];
        for (slot, name) in self.names.iter().enumerate() {
            if let Some(row) = rows.get(name) {
                scaled[slot] = true;
                if row.len() != width {
                    return Err(format!(
                        "the checkpoint's fp8 state of {name} has {} numbers, this recipe's {width} \
                         (a different fp8_amax_history_len)",
                        row.len()
                    ));
                }
                values[slot * width..(slot + 1) * width].copy_from_slice(row);
            }
        }
        let mut inner = self.lock();
        let shape = [self.names.len(), width];
        inner.tensor = Some(Box::new(f32_tensor::<K>(values, shape, device)));
        inner.weights.clear();
        inner.step += 1;
        inner.scaled = scaled;
        Ok(())
    }

    /// Whether slot `slot`'s delayed-scaling casts measure their own tensor's amax for their
    /// scale: only while its state holds no scale from an amax yet (a run's first step, or the
    /// first step after a resume from a checkpoint without this layer's state). Starting from
    /// scale 1, as Transformer Engine does, flushes every gradient element below e5m2's
    /// smallest subnormal (2^-16) to zero: with a loss averaged over tens of thousands of
    /// tokens that is most of them, and the step's update of every fp8 layer is lost. The amax
    /// is still recorded, so the next step's scales are the delayed ones. (A rank casts with its
    /// own amax on that step; the amaxes are max-reduced at its end as on every step, so the
    /// states agree from then on.)
    pub fn measures_first_scales(&self, slot: usize) -> bool {
        matches!(self.settings.scaling, Fp8Scaling::Delayed { .. }) && !self.lock().scaled[slot]
    }

    /// Marks the end of an optimizer step: weights cast so far are stale, every scale is from
    /// an amax.
    fn next_step(&self) {
        let mut inner = self.lock();
        inner.step += 1;
        inner.weights.clear();
        inner.scaled.fill(true);
    }

    fn cached_weight<K: Backend>(&self, slot: usize) -> Option<Fp8Tensor<K>> {
        let inner = self.lock();
        let (step, weight) = inner.weights.get(&slot)?;
        (*step == inner.step).then(|| {
            weight
                .downcast_ref::<Fp8Tensor<K>>()
                .expect("cast weights belong to the backend that cast them")
                .clone()
        })
    }

    fn cache_weight<K: Backend>(&self, slot: usize, weight: Fp8Tensor<K>) {
        let mut inner = self.lock();
        let step = inner.step;
        inner.weights.insert(slot, (step, Box::new(weight)));
    }
}

/// One fp8 linear layer: its slot in the chunk's [`Fp8State`].
#[derive(Clone)]
pub struct Fp8Linear {
    state: Arc<Fp8State>,
    slot: usize,
}

impl fmt::Debug for Fp8Linear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fp8Linear({})", self.state.names[self.slot])
    }
}

impl Fp8Linear {
    pub fn new(state: &Arc<Fp8State>, slot: usize) -> Self {
        assert!(slot < state.names.len(), "fp8 slot {slot} out of range");
        Fp8Linear {
            state: state.clone(),
            slot,
        }
    }

    pub fn slot(&self) -> usize {
        self.slot
    }

    pub fn state(&self) -> &Fp8State {
        &self.state
    }

    /// [`Fp8State::measures_first_scales`] of this layer.
    pub fn measures_first_scales(&self) -> bool {
        self.state.measures_first_scales(self.slot)
    }

    pub fn settings(&self) -> &Fp8Settings {
        &self.state.settings
    }

    /// Where `role`'s block of this layer's row starts in the flat state tensor.
    pub fn block_offset(&self, role: Fp8Role) -> usize {
        self.slot * self.settings().row_width() + self.settings().block_offset(role)
    }

    /// The weight `[in, out]` in fp8, cast at most once per optimizer step. A cast that does
    /// not record its amax (inference) is not kept: the step's own cast must record it.
    pub fn weight<B: FusedOps>(&self, weight: FloatTensor<B>, record: bool) -> Fp8Tensor<B> {
        if let Some(cast) = self.state.cached_weight::<B>(self.slot) {
            return cast;
        }
        let cast = B::fp8_quantize(weight, self, Fp8Role::Weight, record);
        if record {
            self.state.cache_weight::<B>(self.slot, cast.clone());
        }
        cast
    }
}

/// What an fp8 linear's forward leaves for its backward.
pub(crate) struct Fp8Forward<B: Backend> {
    pub output: FloatTensor<B>,
    /// `xᵀ [in, tokens]` (of the normalised `x` with an input norm).
    pub input_t: Fp8Operand<B>,
    pub weight: Fp8Tensor<B>,
    /// The input norm's row statistics, with one.
    pub norm_stats: Option<NormStats<B>>,
}

/// `norm(x) [.., in] · weight [in, out] + bias` through the fp8 primitives (`x` itself without
/// a norm), recording amaxes when `record` (training).
pub(crate) fn fp8_forward<B: FusedOps>(
    x: FloatTensor<B>,
    norm: Option<Fp8InputNorm<B>>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    fp8: &Fp8Linear,
    record: bool,
) -> Fp8Forward<B> {
    let mut shape = x.shape().to_vec();
    let dtype = x.dtype();
    let [k, n] = weight.shape().dims::<2>();
    let m = shape.iter().product::<usize>() / k.max(1);
    let rows = B::float_reshape(x, Shape::new([m, k]));
    let (input, norm_stats) = match norm {
        Some(norm) => {
            let (input, stats) = B::fp8_quantize_norm(rows, norm, fp8, record);
            (input, Some(stats))
        }
        None => (B::fp8_quantize(rows, fp8, Fp8Role::Input, record), None),
    };
    let weight = fp8.weight::<B>(weight, record);
    // The forward is the one product Transformer Engine accumulates fast (fp8 partial sums
    // promoted less often); the gradients take the split accumulation.
    let output = B::fp8_matmul(input.rows(), weight.columns(), bias, dtype, true);
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    Fp8Forward {
        output: B::float_reshape(output, Shape::from(shape)),
        input_t: input.columns(),
        weight,
        norm_stats,
    }
}

/// The inference forward (no autodiff): casts that record nothing.
pub fn fp8_linear_inference<B: FusedOps>(
    x: FloatTensor<B>,
    norm: Option<Fp8InputNorm<B>>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    fp8: &Fp8Linear,
) -> FloatTensor<B> {
    fp8_forward::<B>(x, norm, weight, bias, fp8, false).output
}

/// Ends an optimizer step on this rank: the delayed update, the step's weight casts dropped. `B`
/// runs the kernels (the inner backend). Ranks that share a state first max-reduce its amaxes
/// over their groups (`ferrotron_parallel::end_fp8_step`, which then calls this), so that every
/// rank casts with the same scales.
pub fn end_local_fp8_step<B: FusedOps>(state: &Fp8State) {
    if matches!(state.settings.scaling, Fp8Scaling::Delayed { .. }) {
        B::fp8_update_scaling(state);
    }
    state.next_step();
}

fn f32_tensor<K: Backend>(
    values: Vec<f32>,
    shape: [usize; 2],
    device: &K::Device,
) -> FloatTensor<K> {
    let tensor = K::float_from_data(TensorData::new(values, shape), device);
    if tensor.dtype() == DType::F32 {
        tensor
    } else {
        K::float_cast(tensor, DType::F32.into())
    }
}

fn host_values<K: Backend>(tensor: FloatTensor<K>) -> Vec<f32> {
    wrap::<K, 2>(tensor)
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 values")
}

/// Reference of [`FusedOps::fp8_quantize`]: on the host, with `fp8/scaling.rs`'s grids.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn fp8_quantize_reference<B: Backend>(
    x: FloatTensor<B>,
    fp8: &Fp8Linear,
    role: Fp8Role,
    record: bool,
) -> Fp8Tensor<B> {
    let [rows, cols] = x.shape().dims::<2>();
    let device = B::float_device(&x);
    let values = host_values::<B>(x);
    let settings = *fp8.settings();
    let format = settings.format(role);
    let seen = amax(&values);
    let at = fp8.block_offset(role);
    let measured = current_scale(seen, settings.scaled_max(role));
    let first = fp8.measures_first_scales();
    let scale = match settings.scaling {
        Fp8Scaling::Current => measured,
        Fp8Scaling::Delayed { .. } => fp8.state.with_tensor::<B, _>(&device, |state| {
            let mut host = host_values::<B>(state.clone());
            if record {
                host[at + AMAX] = amax_max(host[at + AMAX], seen);
                let shape = state.shape().dims::<2>();
                *state = f32_tensor::<B>(host.clone(), shape, &device);
            }
            if first { measured } else { host[at + SCALE] }
        }),
    };
    let cast: Vec<f32> = values
        .iter()
        .map(|v| round_to_fp8(v * scale, format))
        .collect();
    let transposed = (0..cols)
        .flat_map(|c| {
            cast.iter()
                .skip(c)
                .step_by(cols)
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    Fp8Tensor {
        data: f32_tensor::<B>(cast, [rows, cols], &device),
        transposed: f32_tensor::<B>(transposed, [cols, rows], &device),
        scale_inv: B::float_reshape(
            f32_tensor::<B>(vec![1.0 / scale], [1, 1], &device),
            Shape::new([1]),
        ),
        format,
    }
}

/// Reference of [`FusedOps::fp8_matmul`]: `a · bᵀ · (a_scale_inv · b_scale_inv) + bias` in
/// f32 on the grid values, rounded once to `dtype`.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn fp8_matmul_reference<B: Backend>(
    a: Fp8Operand<B>,
    b: Fp8Operand<B>,
    bias: Option<FloatTensor<B>>,
    dtype: DType,
) -> FloatTensor<B> {
    let scale =
        wrap::<B, 1>(a.scale_inv).cast(DType::F32) * wrap::<B, 1>(b.scale_inv).cast(DType::F32);
    let a: Tensor<B, 2> = wrap::<B, 2>(a.data).cast(DType::F32);
    let b_t = wrap::<B, 2>(b.data).cast(DType::F32).transpose();
    let product = a.matmul(b_t) * scale.unsqueeze::<2>();
    let product = match bias {
        Some(bias) => product + wrap::<B, 1>(bias).cast(DType::F32).unsqueeze(),
        None => product,
    };
    unwrap(product.cast(dtype))
}

/// Reference of [`FusedOps::fp8_update_scaling`]: [`update_state`] on the host.
#[cfg_attr(not(feature = "reference"), allow(unreachable_pub))]
pub fn fp8_update_reference<B: Backend>(state: &Fp8State) {
    let settings = state.settings;
    state.update_tensor::<B>(|tensor| {
        let device = B::float_device(tensor);
        let shape = tensor.shape().dims::<2>();
        let mut host = host_values::<B>(tensor.clone());
        update_state(&mut host, &settings);
        *tensor = f32_tensor::<B>(host, shape, &device);
    });
}
