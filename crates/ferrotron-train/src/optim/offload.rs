//! Megatron's optimizer CPU offload (`--optimizer-cpu-offload`, `--optimizer-offload-fraction`).
//!
//! A mixed-precision parameter costs 16 bytes on the device, 12 of them the optimizer's (the
//! fp32 master and both moments), so an 8B model's state alone is 96 GB. Offloaded, a group of
//! the flat state keeps those buffers in host memory and its update runs on the CPU cores: the
//! step's gradients stream down piece by piece, each piece is updated as it arrives, and its new
//! 16-bit weights stream back up (`FusedOps::host_pass`). The host buffers are burn-flex tensors
//! and the update is `HostAdamW` (chunks in parallel, the composed update's
//! arithmetic to the bit), so on the CPU an offloaded run gives the numbers of one that is not,
//! and on a GPU it agrees with the device's AdamW to float rounding.
//!
//! Which parameters go is Megatron's rule (`HybridDeviceOptimizer`): in order, while the
//! offloaded element count is below the fraction of the total.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive, bf16};
use ferrotron_ops::{
    AdamWStep, FusedOps, HostAdamW, HostCopy, HostMoment, HostOldValues, HostPiece, HostRounded,
    HostValues, HostValuesMut, ReadLater,
};

use std::sync::{Arc, Mutex};

use crate::checkpoint::{DeviceShard, ShardValues};
use crate::optim::flat_adamw::Shard;

/// One buffer of a flat group's optimizer state, where the group keeps it.
#[derive(Debug, Clone)]
pub(crate) enum Held<I: Backend> {
    Device(Tensor<I, 1>),
    Host(Tensor<Flex, 1>),
}

impl<I: Backend> Held<I> {
    /// The buffer on the device: itself, or a copy of the host's.
    pub(crate) fn on_device(&self, device: &I::Device) -> Tensor<I, 1> {
        match self {
            Held::Device(x) => x.clone(),
            Held::Host(x) => to_device(x.clone(), device),
        }
    }

    /// Elements `range` on the device (a view, or a copy of the host's).
    pub(crate) fn slice(&self, range: std::ops::Range<usize>, device: &I::Device) -> Tensor<I, 1> {
        match self {
            Held::Device(x) => x.clone().slice(range),
            Held::Host(x) => to_device(x.clone().slice(range), device),
        }
    }

    /// This rank's part of the buffer, in a buffer of its own.
    pub(crate) fn cut(self, shard: Shard) -> Self {
        match self {
            Held::Device(x) => Held::Device(shard.cut(x)),
            Held::Host(x) => Held::Host(shard.cut(x)),
        }
    }

    /// The buffer in host memory: a host buffer shared, a device one copied down.
    pub(crate) fn to_host(&self) -> Tensor<Flex, 1> {
        match self {
            Held::Device(x) => to_host(x.clone()),
            Held::Host(x) => x.clone(),
        }
    }

    /// The same kind of holding for `x`, a buffer on the device.
    pub(crate) fn like(&self, x: Tensor<I, 1>) -> Self {
        match self {
            Held::Device(_) => Held::Device(x),
            Held::Host(_) => Held::Host(to_host(x)),
        }
    }
}

impl<I: FusedOps> Held<I> {
    /// Elements `range` for a checkpoint, read when the values are needed (an asynchronous
    /// save's writer reads them; see [`ShardValues`]): a host buffer's shared as they are, a
    /// device buffer's through [`FusedOps::read_later`], so the read sees the buffer as it is now
    /// and need not wait for the next step's work.
    pub(crate) fn shard_values(&self, range: std::ops::Range<usize>) -> ShardValues {
        match self {
            Held::Device(x) => ShardValues::Device(Arc::new(DeviceRange {
                len: range.len(),
                read: Mutex::new(DeviceRead::Pending(I::read_later(
                    x.clone().slice(range).into_primitive().tensor(),
                ))),
            })),
            Held::Host(x) => ShardValues::Host {
                buffer: x.clone(),
                range,
            },
        }
    }
}

/// A range of a device buffer a checkpoint reads once, later: off the device first
/// ([`DeviceShard::fetch`]), into host values after.
struct DeviceRange {
    len: usize,
    read: Mutex<DeviceRead>,
}

/// Where a [`DeviceRange`]'s one read stands.
enum DeviceRead {
    Pending(ReadLater),
    Fetched(HostCopy),
    Done,
}

impl std::fmt::Debug for DeviceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRange")
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceShard for DeviceRange {
    fn len(&self) -> usize {
        self.len
    }

    fn fetch(&self) {
        let mut read = self
            .read
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *read = match std::mem::replace(&mut *read, DeviceRead::Done) {
            DeviceRead::Pending(pending) => DeviceRead::Fetched(pending()),
            done_or_fetched => done_or_fetched,
        };
    }

    fn read(&self) -> Vec<f32> {
        self.fetch();
        let copy = match std::mem::replace(
            &mut *self
                .read
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            DeviceRead::Done,
        ) {
            DeviceRead::Fetched(copy) => copy,
            DeviceRead::Pending(_) | DeviceRead::Done => {
                panic!("a snapshot's device values are read once")
            }
        };
        copy()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("a buffer converted to f32 reads back as f32")
    }
}

/// `x` copied to host memory, in its dtype.
pub(crate) fn to_host<I: Backend>(x: Tensor<I, 1>) -> Tensor<Flex, 1> {
    let dtype = x.dtype();
    Tensor::from_data(x.into_data(), (&Default::default(), dtype))
}

/// `x` copied to `device`, in its dtype.
pub(crate) fn to_device<I: Backend>(x: Tensor<Flex, 1>, device: &I::Device) -> Tensor<I, 1> {
    let dtype = x.dtype();
    Tensor::from_data(x.into_data(), (device, dtype))
}

/// Whether each parameter of `lens` (element counts in visiting order) is offloaded:
/// Megatron's `_get_sub_optimizer_param_groups`, which offloads a parameter while the count
/// offloaded before it is below `fraction` of the total.
pub(crate) fn offloaded(lens: &[usize], fraction: f64) -> Vec<bool> {
    let total: usize = lens.iter().sum();
    let threshold = total as f64 * fraction;
    let mut offloaded = 0usize;
    lens.iter()
        .map(|&len| {
            let goes = (offloaded as f64) < threshold;
            if goes {
                offloaded += len;
            }
            goes
        })
        .collect()
}

/// One offloaded group's update to run: its state (moments `None` before the first step), the
/// step's gradient on the device and the update's scalars.
pub(crate) struct HostJob<I: Backend> {
    pub group: usize,
    pub master: Tensor<Flex, 1>,
    pub moments: Option<(Tensor<Flex, 1>, Tensor<Flex, 1>)>,
    pub grad: FloatTensor<I>,
    pub step: AdamWStep,
}

/// An offloaded group's new state and the model's new values on the device.
pub(crate) struct HostUpdate<I: Backend> {
    pub group: usize,
    pub master: Tensor<Flex, 1>,
    pub moments: (Tensor<Flex, 1>, Tensor<Flex, 1>),
    /// The 16-bit copy of a 16-bit group, the master of an fp32 one, on the device.
    pub values: Tensor<I, 1>,
}

/// The offloaded groups' AdamW updates in one host pass ([`FusedOps::host_pass`]): each
/// group's gradient streams down piece by piece, [`HostAdamW`] updates the piece's
/// master and moments in host memory on every core, and the piece's new 16-bit values (the
/// master itself for an fp32 group) stream back up. The device's gradient factor comes down
/// once. Each element's update is the whole-buffer update's, so the pieces change no number.
pub(crate) fn update_on_host<I: FusedOps>(
    jobs: Vec<HostJob<I>>,
    device_scale: Option<Tensor<I, 1>>,
) -> Vec<HostUpdate<I>> {
    let start = std::time::Instant::now();
    let device_scale = device_scale.map(|s| {
        s.into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("the device gradient factor reads back as f32")[0]
    });
    let mut inputs = Vec::with_capacity(jobs.len());
    let mut states = Vec::with_capacity(jobs.len());
    for job in jobs {
        let first = job.moments.is_none();
        let len = job.master.shape().num_elements();
        let [m_dtype, v_dtype] = job.step.moment_dtypes;
        let (m, v) = job.moments.unwrap_or_else(|| {
            let zeros = |dtype| Tensor::<Flex, 1>::zeros([len], (&Default::default(), dtype));
            (zeros(m_dtype), zeros(v_dtype))
        });
        inputs.push((job.grad, job.step.rounded.unwrap_or(DType::F32)));
        states.push(HostState {
            group: job.group,
            adamw: HostAdamW::new(&job.step, device_scale, first),
            master: Writable::new(job.master),
            exp_avg: Writable::new(m),
            exp_avg_sq: Writable::new(v),
        });
    }
    let mut times = PassTimes::default();
    let values = I::host_pass(inputs, &mut |piece| {
        let started = std::time::Instant::now();
        times.first_piece.get_or_insert(started - start);
        times.bytes_down += piece.out.len() * dtype_of(&piece.values).size();
        times.bytes_up += piece.out.len() * dtype_of_mut(&piece.out).size();
        states[piece.input].update(piece);
        times.host += started.elapsed();
    });
    times.elements = states
        .iter()
        .map(|s| s.master.buffer.shape().num_elements())
        .sum();
    times.log(start.elapsed());
    states
        .into_iter()
        .zip(values)
        .map(|(state, values)| HostUpdate {
            group: state.group,
            master: state.master.into_tensor(),
            moments: (state.exp_avg.into_tensor(), state.exp_avg_sq.into_tensor()),
            values: Tensor::from_primitive(TensorPrimitive::Float(values)),
        })
        .collect()
}

/// One offloaded group's state during its update.
struct HostState {
    group: usize,
    adamw: HostAdamW,
    master: Writable,
    exp_avg: Writable,
    exp_avg_sq: Writable,
}

impl HostState {
    /// Updates the piece's elements and fills its output: the rounded copy, or the new master
    /// of an fp32 group.
    fn update(&mut self, piece: HostPiece<'_>) {
        let range = piece.offset..piece.offset + piece.out.len();
        let old = HostOldValues {
            master: self
                .master
                .old
                .as_ref()
                .map(|o| &o.storage::<f32>()[range.clone()]),
            exp_avg: old_values(self.exp_avg.old.as_ref(), range.clone()),
            exp_avg_sq: old_values(self.exp_avg_sq.old.as_ref(), range.clone()),
        };
        let master = &mut self.master.buffer.storage_mut::<f32>()[range.clone()];
        let (rounded, master_out) = match piece.out {
            HostValuesMut::Bf16(out) => (Some(HostRounded::Bf16(out)), None),
            HostValuesMut::F16(out) => (Some(HostRounded::F16(out)), None),
            HostValuesMut::F32(out) => (None, Some(out)),
        };
        self.adamw.update(
            master,
            moment(&mut self.exp_avg.buffer, range.clone()),
            moment(&mut self.exp_avg_sq.buffer, range),
            piece.values,
            old,
            rounded,
        );
        if let Some(out) = master_out {
            out.copy_from_slice(master);
        }
    }
}

/// A host buffer the update writes: the state's own when nothing else holds it, else a new one
/// that the update fills from the old (`old`), which a checkpoint's snapshot still reads. The
/// state buffers are written in place every step; only a save in flight makes them move.
struct Writable {
    buffer: FlexTensor,
    old: Option<FlexTensor>,
}

impl Writable {
    fn new(x: Tensor<Flex, 1>) -> Self {
        let x: FlexTensor = x.into_primitive().tensor();
        let len = x.shape().num_elements();
        let whole = x.layout().contiguous_offsets() == Some((0, len))
            && x.bytes().len() == len * x.dtype().size();
        if !whole {
            Self {
                buffer: x.to_contiguous(),
                old: None,
            }
        } else if x.is_unique() {
            Self {
                buffer: x,
                old: None,
            }
        } else {
            Self {
                buffer: FlexTensor::zeros(x.shape(), x.dtype()),
                old: Some(x),
            }
        }
    }

    fn into_tensor(self) -> Tensor<Flex, 1> {
        Tensor::from_primitive(TensorPrimitive::Float(self.buffer))
    }
}

/// The old values of elements `range` of a buffer updated out of place.
fn old_values(old: Option<&FlexTensor>, range: std::ops::Range<usize>) -> Option<HostValues<'_>> {
    old.map(|old| match old.dtype() {
        DType::F32 => HostValues::F32(&old.storage::<f32>()[range]),
        DType::BF16 => HostValues::Bf16(&old.storage::<bf16>()[range]),
        dtype => unreachable!("optimizer state stored as {dtype:?}"),
    })
}

/// Elements `range` of a moment, to update in place.
fn moment(buffer: &mut FlexTensor, range: std::ops::Range<usize>) -> HostMoment<'_> {
    match buffer.dtype() {
        DType::F32 => HostMoment::F32(&mut buffer.storage_mut::<f32>()[range]),
        DType::BF16 => HostMoment::Bf16(&mut buffer.storage_mut::<bf16>()[range]),
        dtype => unreachable!("moments stored as {dtype:?}"),
    }
}

fn dtype_of(values: &HostValues<'_>) -> DType {
    match values {
        HostValues::F32(_) => DType::F32,
        HostValues::Bf16(_) => DType::BF16,
        HostValues::F16(_) => DType::F16,
    }
}

fn dtype_of_mut(values: &HostValuesMut<'_>) -> DType {
    match values {
        HostValuesMut::F32(_) => DType::F32,
        HostValuesMut::Bf16(_) => DType::BF16,
        HostValuesMut::F16(_) => DType::F16,
    }
}

/// Where an offloaded step's time went: what calibrates the planner's transfer and host-AdamW
/// rates (logged at debug level under `ferrotron::offload`). `total` includes the wait for the
/// step's backward behind the first piece's copy down; `host` is the AdamW kernel's time on the
/// pieces, the rest the copies it did not hide.
#[derive(Debug, Clone, Copy, Default)]
struct PassTimes {
    /// From the update's start to its first piece on the host: the device finishing the work
    /// queued before the gradients' first copy (the step's backward), and the first copy.
    first_piece: Option<std::time::Duration>,
    host: std::time::Duration,
    bytes_down: usize,
    bytes_up: usize,
    elements: usize,
}

impl PassTimes {
    /// The rates are over the pass from its first piece on, so a step whose backward the
    /// device is still running when the update starts does not read as a slow link.
    fn log(&self, total: std::time::Duration) {
        let waited = self.first_piece.unwrap_or_default();
        let streaming = total.saturating_sub(waited).as_secs_f64().max(1e-9);
        let rate = |bytes: usize| bytes as f64 / streaming / 1e9;
        tracing::debug!(
            target: "ferrotron::offload",
            "offloaded update of {} elements in {:.3} s: the first piece after {:.3} s, then \
             {:.1} GB/s of gradients down, {:.1} GB/s of weights up; AdamW on the host {:.3} s \
             ({:.2} G elements/s)",
            self.elements,
            total.as_secs_f64(),
            waited.as_secs_f64(),
            rate(self.bytes_down),
            rate(self.bytes_up),
            self.host.as_secs_f64(),
            self.elements as f64 / self.host.as_secs_f64().max(1e-9) / 1e9,
        );
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{DType, Distribution, Tensor, TensorData};
    use ferrotron_ops::{AdamWStep, FusedOps};

    use super::{Held, HostJob, offloaded, update_on_host};
    use crate::checkpoint::ShardValues;

    /// A device range for a checkpoint is read once, fetched off the device first or not: the
    /// values are the buffer's range, and a second read is refused.
    #[test]
    fn a_device_range_is_fetched_then_read_once() {
        let values: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let held = Held::<Flex>::Device(Tensor::from_data(
            TensorData::new(values, [10]),
            &Default::default(),
        ));
        for fetch_first in [true, false] {
            let ShardValues::Device(range) = held.shard_values(2..6) else {
                panic!("a device buffer's range is read later");
            };
            if fetch_first {
                range.fetch();
                range.fetch();
            }
            assert_eq!(range.read(), [2.0, 3.0, 4.0, 5.0]);
            let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| range.read()));
            assert!(again.is_err(), "a second read must be refused");
        }
    }

    /// Megatron offloads a parameter while the count before it is below the threshold, so the
    /// one that crosses it goes too.
    #[test]
    fn parameters_go_in_order_while_the_offloaded_count_is_below_the_fraction() {
        let lens = [40, 30, 20, 10];
        assert_eq!(offloaded(&lens, 1.0), [true; 4]);
        assert_eq!(offloaded(&lens, 0.0), [false; 4]);
        assert_eq!(offloaded(&lens, 0.5), [true, true, false, false]);
        assert_eq!(offloaded(&lens, 0.4), [true, false, false, false]);
        assert_eq!(offloaded(&lens, 0.41), [true, true, false, false]);
    }

    fn bits(x: Tensor<Flex, 1>) -> Vec<u32> {
        let data: TensorData = x.into_data().convert::<f32>();
        data.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// Groups longer than a host-pass piece, bf16 and fp32, fp32 and bf16 moments, a first and
    /// a later step, state shared with a snapshot (updated out of place, the snapshot left as
    /// it was), a device gradient factor: every bit is the whole-buffer kernel's.
    #[test]
    fn a_host_pass_in_pieces_gives_the_whole_buffer_kernels_bits() {
        let device = Default::default();
        let len = 150_001;
        let step = |rounded, moment_dtypes| AdamWStep {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            decay: Some(1.0 - 3e-4 * 0.1),
            bias_correction1: 1.0 - 0.9f64.powi(2),
            bias_correction2: 1.0 - 0.95f64.powi(2),
            grad_scale: 0.5,
            rounded,
            moment_dtypes,
        };
        let normal =
            |scale| Tensor::<Flex, 1>::random([len], Distribution::Normal(0.0, scale), &device);
        let cases = [
            (Some(DType::BF16), [DType::F32, DType::F32], false),
            (Some(DType::BF16), [DType::BF16, DType::BF16], true),
            (None, [DType::F32, DType::BF16], true),
        ];
        for (rounded, moment_dtypes, later) in cases {
            let step = step(rounded, moment_dtypes);
            let master = normal(1.0);
            let grad = normal(1e-2).cast(rounded.unwrap_or(DType::F32));
            let moments = later.then(|| {
                let [m, v] = moment_dtypes;
                (normal(1e-3).cast(m), normal(1e-5).abs().cast(v))
            });
            let scale = Tensor::<Flex, 1>::from_floats([0.75], &device);
            let expected = Flex::adamw_step(
                master.clone().into_primitive().tensor(),
                grad.clone().into_primitive().tensor(),
                moments
                    .clone()
                    .map(|(m, v)| (m.into_primitive().tensor(), v.into_primitive().tensor())),
                step,
                Some(scale.clone().into_primitive().tensor()),
            );
            let snapshot = (master.clone(), moments.clone());
            let snapshot_bits = bits(master.clone());
            let out = update_on_host::<Flex>(
                vec![HostJob {
                    group: 3,
                    master,
                    moments,
                    grad: grad.into_primitive().tensor(),
                    step,
                }],
                Some(scale),
            );
            let [out] = <[_; 1]>::try_from(out).ok().expect("one group");
            let flex =
                |x| Tensor::<Flex, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(x));
            assert_eq!(out.group, 3);
            assert_eq!(bits(out.master.clone()), bits(flex(expected.value.clone())));
            assert_eq!(bits(out.moments.0), bits(flex(expected.exp_avg)));
            assert_eq!(bits(out.moments.1), bits(flex(expected.exp_avg_sq)));
            let values = expected.rounded.map_or_else(|| flex(expected.value), flex);
            assert_eq!(out.values.dtype(), values.dtype());
            assert_eq!(bits(out.values), bits(values));
            assert_eq!(
                bits(snapshot.0),
                snapshot_bits,
                "the snapshot keeps the old values"
            );
        }
    }
}
