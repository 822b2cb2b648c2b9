//! One parameter's AdamW update on burn-flex in a single pass.
//!
//! Composed, an update is about fifteen single-threaded passes over parameter-sized buffers,
//! each allocating its result; for the quick start's tied 50,304 × 64 embedding that is a
//! quarter of a gigabyte of memory traffic a step. Here each chunk of the parameter, its
//! gradient and its moments is read once and written once, chunks in parallel, in place where
//! nothing else holds the buffers.
//!
//! The arithmetic is the composed update's, operation for operation, with every scalar rounded
//! to f32 first as burn-flex rounds a scalar operand: the results are bit-identical to
//! [`composed_adamw`] and do not depend on the thread count.
//!
//! It also takes what a mixed-precision step hands it (a 16-bit gradient, bf16 moments under the
//! precision-aware optimizer, the 16-bit copy of the new value): the CPU rarely trains in those,
//! but the offloaded optimizer (`optimizer_cpu_offload`) runs every update of a GPU run here,
//! where the composed update's single-threaded passes would cost an 8B model minutes a step.
//!
//! [`composed_adamw`]: crate::composed_adamw

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape, TensorMetadata, bf16, f16};
use rayon::prelude::*;

use crate::fused_adamw::{AdamWStep, AdamWTensors};

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// Whether the kernel takes these tensors: an f32 value and device factor, a gradient of any
/// float dtype the model trains in, moments stored as the step says (f32 or bf16), and a
/// 16-bit rounded copy or none.
pub(super) fn supports(
    value: &FlexTensor,
    grad: &FlexTensor,
    moments: Option<&(FlexTensor, FlexTensor)>,
    step: &AdamWStep,
    device_scale: Option<&FlexTensor>,
) -> bool {
    let f32s = |t: &FlexTensor| t.dtype() == DType::F32;
    let [m_dtype, v_dtype] = step.moment_dtypes;
    let stored = |dtype: DType| matches!(dtype, DType::F32 | DType::BF16);
    f32s(value)
        && matches!(grad.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && stored(m_dtype)
        && stored(v_dtype)
        && moments.is_none_or(|(m, v)| m.dtype() == m_dtype && v.dtype() == v_dtype)
        && matches!(step.rounded, None | Some(DType::BF16 | DType::F16))
        && device_scale.is_none_or(f32s)
}

/// The update (see [`supports`] for what it takes). A 16-bit gradient or moment is widened to
/// f32 a chunk at a time and a stored moment narrowed back as the composed update's casts do;
/// the new value is computed from the unrounded moments and rounded last.
pub(super) fn step(
    value: FlexTensor,
    grad: FlexTensor,
    moments: Option<(FlexTensor, FlexTensor)>,
    step: AdamWStep,
    device_scale: Option<FlexTensor>,
) -> AdamWTensors<burn::backend::Flex> {
    let len = value.shape().num_elements();
    let device_scale = device_scale.map(|s| {
        s.into_data()
            .to_vec::<f32>()
            .expect("the device gradient factor is f32")[0]
    });
    let k = Constants::new(&step, device_scale);
    let grad = grad.to_contiguous();
    assert_eq!(
        grad.shape().num_elements(),
        len,
        "AdamW: gradient and parameter differ in size"
    );
    let (mut value, value_from) = writable(value);
    let first = moments.is_none();
    let [m_dtype, v_dtype] = step.moment_dtypes;
    let ((mut exp_avg, m_from), (mut exp_avg_sq, v_from)) = match moments {
        Some((m, v)) => (writable(m), writable(v)),
        None => ((zeros(len, m_dtype), None), (zeros(len, v_dtype), None)),
    };
    let mut rounded = step.rounded.map(|dtype| zeros(len, dtype));
    let tasks: Vec<_> = value
        .storage_mut::<f32>()
        .chunks_mut(CHUNK)
        .zip(sources(value_from.as_ref(), len))
        .map(|(p, from)| (Stored::F32(p), from))
        .zip(
            Stored::chunks(&mut exp_avg)
                .into_iter()
                .zip(sources(m_from.as_ref(), len)),
        )
        .zip(
            Stored::chunks(&mut exp_avg_sq)
                .into_iter()
                .zip(sources(v_from.as_ref(), len)),
        )
        .zip(Widened::chunks(&grad))
        .zip(Rounded::chunks(rounded.as_mut(), len))
        .collect();
    tasks
        .into_par_iter()
        .for_each(|((((p, m), v), g), r)| chunk_update(p, m, v, g, r, &k, first));
    AdamWTensors {
        value,
        exp_avg,
        exp_avg_sq,
        rounded,
    }
}

/// A buffer and the chunk of the buffer its old values are read from, when not itself.
type Operand<'a> = (Stored<'a>, Option<Widened<'a>>);

/// One task: the old values of a buffer updated out of place copied in, the chunk's 16-bit
/// operands widened into scratch, the f32 update, the stored results narrowed back.
fn chunk_update(
    p: Operand<'_>,
    m: Operand<'_>,
    v: Operand<'_>,
    g: Widened<'_>,
    r: Option<Rounded<'_>>,
    k: &Constants,
    first: bool,
) {
    let [mut p, mut m, mut v] = [p, m, v].map(|(mut to, from)| {
        if let Some(from) = from {
            to.copy_from(&from);
        }
        to
    });
    let g = g.to_f32();
    let (mut p_scratch, mut m_scratch, mut v_scratch) = (Vec::new(), Vec::new(), Vec::new());
    let p = p.as_f32(&mut p_scratch);
    update(
        p,
        m.as_f32(&mut m_scratch),
        v.as_f32(&mut v_scratch),
        &g,
        k,
        first,
    );
    m.store(&m_scratch);
    v.store(&v_scratch);
    if let Some(r) = r {
        r.write(p);
    }
}

// Narrowing goes through f64 as burn-flex's cast does (`from_f64`): half's `from_f32` rounds
// some values to the other neighbour, and the update must give the composed casts' bits.

/// A chunk of a moment as stored.
enum Stored<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

impl<'a> Stored<'a> {
    fn chunks(tensor: &'a mut FlexTensor) -> Vec<Self> {
        match tensor.dtype() {
            DType::F32 => tensor
                .storage_mut::<f32>()
                .chunks_mut(CHUNK)
                .map(Stored::F32)
                .collect(),
            DType::BF16 => tensor
                .storage_mut::<bf16>()
                .chunks_mut(CHUNK)
                .map(Stored::Bf16)
                .collect(),
            dtype => unreachable!("moments stored as {dtype:?} are not supported"),
        }
    }

    /// The chunk as f32 to update in place: itself, or its values widened into `scratch`.
    fn as_f32<'s>(&'s mut self, scratch: &'s mut Vec<f32>) -> &'s mut [f32] {
        match self {
            Stored::F32(values) => values,
            Stored::Bf16(values) => {
                scratch.extend(values.iter().map(|x| x.to_f32()));
                scratch
            }
        }
    }

    /// Copy `from`'s values (of the same dtype) in.
    fn copy_from(&mut self, from: &Widened<'_>) {
        match (self, from) {
            (Stored::F32(to), Widened::F32(from)) => to.copy_from_slice(from),
            (Stored::Bf16(to), Widened::Bf16(from)) => to.copy_from_slice(from),
            _ => unreachable!("a buffer is updated from one of its own dtype"),
        }
    }

    /// Narrow the updated `scratch` back (nothing to do for an f32 chunk, updated in place).
    fn store(&mut self, scratch: &[f32]) {
        if let Stored::Bf16(values) = self {
            for (stored, &x) in values.iter_mut().zip(scratch) {
                *stored = bf16::from_f64(f64::from(x));
            }
        }
    }
}

/// A chunk of the gradient in its own dtype.
enum Widened<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Widened<'a> {
    fn chunks(tensor: &'a FlexTensor) -> Vec<Self> {
        match tensor.dtype() {
            DType::F32 => tensor
                .storage::<f32>()
                .chunks(CHUNK)
                .map(Widened::F32)
                .collect(),
            DType::BF16 => tensor
                .storage::<bf16>()
                .chunks(CHUNK)
                .map(Widened::Bf16)
                .collect(),
            DType::F16 => tensor
                .storage::<f16>()
                .chunks(CHUNK)
                .map(Widened::F16)
                .collect(),
            dtype => unreachable!("a gradient of {dtype:?} is not supported"),
        }
    }

    fn to_f32(&self) -> std::borrow::Cow<'a, [f32]> {
        match *self {
            Widened::F32(values) => values.into(),
            Widened::Bf16(values) => values.iter().map(|x| x.to_f32()).collect(),
            Widened::F16(values) => values.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// A chunk of the 16-bit copy of the new value.
enum Rounded<'a> {
    Bf16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

impl<'a> Rounded<'a> {
    /// The chunks of `tensor`, or `len`'s worth of `None` without one.
    fn chunks(tensor: Option<&'a mut FlexTensor>, len: usize) -> Vec<Option<Self>> {
        let Some(tensor) = tensor else {
            return (0..len.div_ceil(CHUNK)).map(|_| None).collect();
        };
        match tensor.dtype() {
            DType::BF16 => tensor
                .storage_mut::<bf16>()
                .chunks_mut(CHUNK)
                .map(|c| Some(Rounded::Bf16(c)))
                .collect(),
            DType::F16 => tensor
                .storage_mut::<f16>()
                .chunks_mut(CHUNK)
                .map(|c| Some(Rounded::F16(c)))
                .collect(),
            dtype => unreachable!("a rounded copy in {dtype:?} is not supported"),
        }
    }

    fn write(self, values: &[f32]) {
        match self {
            Rounded::Bf16(out) => out
                .iter_mut()
                .zip(values)
                .for_each(|(o, &x)| *o = bf16::from_f64(f64::from(x))),
            Rounded::F16(out) => out
                .iter_mut()
                .zip(values)
                .for_each(|(o, &x)| *o = f16::from_f64(f64::from(x))),
        }
    }
}

/// The composed update's arithmetic on one chunk.
fn update(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Constants, first: bool) {
    for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
        let mut g = g;
        if let Some(s) = k.grad_scale {
            g *= s;
        }
        if let Some(s) = k.device_scale {
            g *= s;
        }
        if first {
            *m = g * k.one_minus_beta1;
            *v = (g * g) * k.one_minus_beta2;
        } else {
            *m = *m * k.beta1 + g * k.one_minus_beta1;
            *v = *v * k.beta2 + (g * g) * k.one_minus_beta2;
        }
        if let Some(decay) = k.decay {
            *p *= decay;
        }
        let m_hat = *m / k.bias_correction1;
        let v_hat = *v / k.bias_correction2;
        *p -= (m_hat / (v_hat.sqrt() + k.eps)) * k.lr;
    }
}

/// The scalars of one update, rounded to f32.
struct Constants {
    grad_scale: Option<f32>,
    device_scale: Option<f32>,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: Option<f32>,
    bias_correction1: f32,
    bias_correction2: f32,
    eps: f32,
    lr: f32,
}

impl Constants {
    fn new(step: &AdamWStep, device_scale: Option<f32>) -> Self {
        Self {
            grad_scale: (step.grad_scale != 1.0).then_some(step.grad_scale as f32),
            device_scale,
            beta1: step.beta1 as f32,
            one_minus_beta1: (1.0 - step.beta1) as f32,
            beta2: step.beta2 as f32,
            one_minus_beta2: (1.0 - step.beta2) as f32,
            decay: step.decay.map(|d| d as f32),
            bias_correction1: step.bias_correction1 as f32,
            bias_correction2: step.bias_correction2 as f32,
            eps: step.eps as f32,
            lr: step.lr as f32,
        }
    }
}

/// A flat buffer this call may write, and the buffer to read the old values from when that is
/// another: the tensor itself when it is whole, contiguous and held nowhere else; a new buffer
/// read from the tensor chunk by chunk when it is shared (a checkpoint's snapshot holds it:
/// copying it first, as copy-on-write would, is one more pass over the state on the update's
/// thread); else a contiguous copy.
fn writable(tensor: FlexTensor) -> (FlexTensor, Option<FlexTensor>) {
    let len = tensor.shape().num_elements();
    let whole = tensor.layout().contiguous_offsets() == Some((0, len))
        && tensor.bytes().len() == len * tensor.dtype().size();
    if !whole {
        (tensor.to_contiguous(), None)
    } else if tensor.is_unique() {
        (tensor, None)
    } else {
        (zeros(len, tensor.dtype()), Some(tensor))
    }
}

/// The chunks of `from` (none: `len`'s worth of `None`).
fn sources(from: Option<&FlexTensor>, len: usize) -> Vec<Option<Widened<'_>>> {
    match from {
        Some(from) => Widened::chunks(from).into_iter().map(Some).collect(),
        None => (0..len.div_ceil(CHUNK)).map(|_| None).collect(),
    }
}

fn zeros(len: usize, dtype: DType) -> FlexTensor {
    FlexTensor::zeros(Shape::new([len]), dtype)
}
