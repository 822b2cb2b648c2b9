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
use ferrotron_parallel::{AdamWStep, AdamWTensors, FusedOps};

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

    /// Elements `range` for a checkpoint: a host buffer's shared as they are (read when the
    /// file is written), a device buffer's read now.
    pub(crate) fn shard_values(&self, range: std::ops::Range<usize>) -> ShardValues {
        match self {
            Held::Device(x) => x
                .clone()
                .slice(range)
                .into_data()
                .convert::<f32>()
                .to_vec::<f32>()
                .expect("a buffer converted to f32 reads back as f32")
                .into(),
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

/// Where an offloaded step's time went on the training thread: what calibrates the planner's
/// transfer and host-AdamW rates (logged at debug level under `ferrotron::offload`). The first
/// group's copy down also waits for the device to finish the backward; `adamw` is only the
/// waiting for host updates that the copies did not hide.
#[derive(Debug, Clone, Copy, Default)]
struct OffloadTimes {
    down: std::time::Duration,
    adamw: std::time::Duration,
    up: std::time::Duration,
    bytes_down: usize,
    bytes_up: usize,
    elements: usize,
}

impl OffloadTimes {
    fn log(&self, total: std::time::Duration) {
        let rate = |bytes: usize, time: std::time::Duration| {
            bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9
        };
        tracing::debug!(
            target: "ferrotron::offload",
            "offloaded update of {} elements in {:.3} s: gradients down {:.3} s ({:.1} GB/s), \
             waiting for AdamW on the host {:.3} s, weights up {:.3} s ({:.1} GB/s)",
            self.elements,
            total.as_secs_f64(),
            self.down.as_secs_f64(),
            rate(self.bytes_down, self.down),
            self.adamw.as_secs_f64(),
            self.up.as_secs_f64(),
            rate(self.bytes_up, self.up),
        );
    }
}

/// The offloaded groups' AdamW updates, in order and pipelined: while the host's cores update
/// one group (burn-flex's kernel, on its own thread), the training thread brings the next
/// group's gradient down and sends the previous group's new values up. The device's gradient
/// factor comes down once. Every group computes what it would alone, so the order of the
/// overlap changes no number.
pub(crate) fn update_on_host<I: FusedOps>(
    jobs: Vec<HostJob<I>>,
    device_scale: Option<Tensor<I, 1>>,
    device: &I::Device,
) -> Vec<HostUpdate<I>> {
    let start = std::time::Instant::now();
    let mut times = OffloadTimes::default();
    let scale = device_scale.map(|s| to_host(s).into_primitive().tensor());
    let mut done = Vec::with_capacity(jobs.len());
    std::thread::scope(|scope| {
        let mut running = None;
        for job in jobs {
            let copied = std::time::Instant::now();
            let grad = to_host(Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(
                job.grad,
            )));
            times.down += copied.elapsed();
            times.bytes_down += grad.shape().num_elements() * grad.dtype().size();
            times.elements += grad.shape().num_elements();
            if let Some(previous) = running.take() {
                done.push(finish(previous, device, &mut times));
            }
            let (group, step, scale) = (job.group, job.step, scale.clone());
            let (master, moments) = (job.master, job.moments);
            running = Some(scope.spawn(move || {
                let out = <Flex as FusedOps>::adamw_step(
                    master.into_primitive().tensor(),
                    grad.into_primitive().tensor(),
                    moments
                        .map(|(m, v)| (m.into_primitive().tensor(), v.into_primitive().tensor())),
                    step,
                    scale,
                );
                (group, out)
            }));
        }
        if let Some(previous) = running {
            done.push(finish(previous, device, &mut times));
        }
    });
    times.log(start.elapsed());
    done
}

/// Wait for a group's host update and send its new values up.
fn finish<I: Backend>(
    running: std::thread::ScopedJoinHandle<'_, (usize, AdamWTensors<Flex>)>,
    device: &I::Device,
    times: &mut OffloadTimes,
) -> HostUpdate<I> {
    let waited = std::time::Instant::now();
    let (group, out) = running
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    times.adamw += waited.elapsed();
    let sent = std::time::Instant::now();
    let flex = |x| Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(x));
    let master = flex(out.value);
    let values = out.rounded.map_or_else(|| master.clone(), flex);
    times.bytes_up += values.shape().num_elements() * values.dtype().size();
    let values = to_device(values, device);
    times.up += sent.elapsed();
    HostUpdate {
        group,
        master,
        moments: (flex(out.exp_avg), flex(out.exp_avg_sq)),
        values,
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
