//! Megatron's optimizer CPU offload (`--optimizer-cpu-offload`, `--optimizer-offload-fraction`).
//!
//! A mixed-precision parameter costs 16 bytes on the device, 12 of them the optimizer's (the
//! fp32 master and both moments), so an 8B model's state alone is 96 GB. Offloaded, a group of
//! the flat state keeps those buffers in host memory and its update runs on the CPU cores: the
//! step's gradients come down once per group, the new 16-bit weights go back up. The host
//! buffers are burn-flex tensors and the update is burn-flex's AdamW kernel (chunks in parallel,
//! the composed update's arithmetic to the bit), so on the CPU an offloaded run gives the numbers
//! of one that is not, and on a GPU it agrees with the device's AdamW to float rounding.
//!
//! Which parameters go is Megatron's rule (`HybridDeviceOptimizer`): in order, while the
//! offloaded element count is below the fraction of the total.

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use ferrotron_parallel::{AdamWStep, FusedOps};

use crate::checkpoint::ShardValues;
use crate::flat_adamw::Shard;

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

    /// Elements `range` widened to f32, read where they are (a host buffer is not copied to the
    /// device first).
    pub(crate) fn values(&self, range: std::ops::Range<usize>) -> Vec<f32> {
        let data = match self {
            Held::Device(x) => x.clone().slice(range).into_data(),
            Held::Host(x) => x.clone().slice(range).into_data(),
        };
        data.convert::<f32>()
            .to_vec()
            .expect("a buffer converted to f32 reads back as f32")
    }

    /// Elements `range` for a checkpoint: a host buffer's shared as they are (read when the
    /// file is written), a device buffer's read now.
    pub(crate) fn shard_values(&self, range: std::ops::Range<usize>) -> ShardValues {
        match self {
            Held::Device(_) => self.values(range).into(),
            Held::Host(x) => ShardValues::Host {
                buffer: x.clone(),
                range,
            },
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

/// An offloaded group's new state and the model's new values on the device.
pub(crate) struct HostUpdate<I: Backend> {
    pub master: Tensor<Flex, 1>,
    pub moments: (Tensor<Flex, 1>, Tensor<Flex, 1>),
    /// The 16-bit copy of a 16-bit group, the master of an fp32 one, on the device.
    pub values: Tensor<I, 1>,
    pub times: OffloadTimes,
}

/// Where an offloaded update's time went, summed over groups: what calibrates the planner's
/// transfer and host-AdamW rates (logged at debug level under `ferrotron::offload`). The first
/// group's copy down also waits for the device to finish the backward.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OffloadTimes {
    pub down: std::time::Duration,
    pub adamw: std::time::Duration,
    pub up: std::time::Duration,
    pub bytes_down: usize,
    pub bytes_up: usize,
    pub elements: usize,
}

impl OffloadTimes {
    pub(crate) fn add(&mut self, other: OffloadTimes) {
        self.down += other.down;
        self.adamw += other.adamw;
        self.up += other.up;
        self.bytes_down += other.bytes_down;
        self.bytes_up += other.bytes_up;
        self.elements += other.elements;
    }

    pub(crate) fn log(&self) {
        let rate = |bytes: usize, time: std::time::Duration| {
            bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9
        };
        tracing::debug!(
            target: "ferrotron::offload",
            "offloaded update of {} elements: gradients down {:.3} s ({:.1} GB/s), AdamW on the \
             host {:.3} s, weights up {:.3} s ({:.1} GB/s)",
            self.elements,
            self.down.as_secs_f64(),
            rate(self.bytes_down, self.down),
            self.adamw.as_secs_f64(),
            self.up.as_secs_f64(),
            rate(self.bytes_up, self.up),
        );
    }
}

/// One AdamW update of an offloaded group: its gradient (and the device's gradient factor)
/// brought to the host, burn-flex's update there, the new values sent up.
pub(crate) fn update_on_host<I: FusedOps>(
    master: Tensor<Flex, 1>,
    moments: Option<(Tensor<Flex, 1>, Tensor<Flex, 1>)>,
    grad: FloatTensor<I>,
    step: AdamWStep,
    device_scale: Option<Tensor<I, 1>>,
    device: &I::Device,
) -> HostUpdate<I> {
    let start = std::time::Instant::now();
    let host = |x: Tensor<I, 1>| to_host(x).into_primitive().tensor();
    let grad = host(Tensor::from_primitive(TensorPrimitive::Float(grad)));
    let bytes_down = grad.bytes().len();
    let elements = burn::tensor::TensorMetadata::shape(&grad).num_elements();
    let down = start.elapsed();
    let out = <Flex as FusedOps>::adamw_step(
        master.into_primitive().tensor(),
        grad,
        moments.map(|(m, v)| (m.into_primitive().tensor(), v.into_primitive().tensor())),
        step,
        device_scale.map(host),
    );
    let adamw = start.elapsed() - down;
    let flex = |x| Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(x));
    let master = flex(out.value);
    let values = out.rounded.map_or_else(|| master.clone(), flex);
    let bytes_up = values.shape().num_elements() * values.dtype().size();
    let values = to_device(values, device);
    HostUpdate {
        master,
        moments: (flex(out.exp_avg), flex(out.exp_avg_sq)),
        values,
        times: OffloadTimes {
            down,
            adamw,
            up: start.elapsed() - down - adamw,
            bytes_down,
            bytes_up,
            elements,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::offloaded;

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
}
