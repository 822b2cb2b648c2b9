//! Which CUDA device a rank opens, from its local rank and `CUDA_VISIBLE_DEVICES`.
//!
//! A rank numbers its GPU by its local rank when it sees every GPU of the node (torchrun,
//! `--nproc-per-node`, a plain `srun --ntasks-per-node`). Slurm's `--gpus-per-task` and
//! `--gpu-bind` instead hand each task its own GPU and hide the others: `CUDA_VISIBLE_DEVICES`
//! lists one device, which CUDA numbers 0 whatever the task's local rank, so asking for ordinal
//! N > 0 fails with "invalid device ordinal" on every rank but the first. The decision is a pure
//! function of the variable so it can be tested without a GPU.

use crate::LaunchError;

/// The variable CUDA reads to hide and renumber devices.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// Why a rank uses the device it does, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuChoice {
    /// `CUDA_VISIBLE_DEVICES` is unset: every GPU is visible, numbered by local rank.
    AllVisible { ordinal: usize },
    /// The launcher bound one GPU to this task (`--gpus-per-task`, `--gpu-bind`): ordinal 0.
    Bound,
    /// `CUDA_VISIBLE_DEVICES` lists at least one device per local rank: the local rank's.
    Listed { ordinal: usize, visible: usize },
}

impl GpuChoice {
    /// The CUDA ordinal to open.
    pub fn ordinal(self) -> usize {
        match self {
            GpuChoice::AllVisible { ordinal } | GpuChoice::Listed { ordinal, .. } => ordinal,
            GpuChoice::Bound => 0,
        }
    }
}

/// The device of local rank `local_rank` of `local_ranks` on this node, given the value of
/// `CUDA_VISIBLE_DEVICES` (`None` when unset): ordinal 0 when it lists exactly one device (the
/// launcher bound one to this task), the local rank when it lists at least one per local rank,
/// and an error naming the variable otherwise (too few devices to share out one each).
pub fn gpu_ordinal(
    local_rank: u32,
    local_ranks: u32,
    visible: Option<&str>,
) -> Result<GpuChoice, LaunchError> {
    let Some(value) = visible else {
        return Ok(GpuChoice::AllVisible {
            ordinal: local_rank as usize,
        });
    };
    // CUDA takes the list up to its first invalid entry; an empty one hides every device.
    let listed = value
        .split(',')
        .map(str::trim)
        .take_while(|device| !device.is_empty() && !device.starts_with('-'))
        .count();
    match listed {
        1 => Ok(GpuChoice::Bound),
        n if n >= local_ranks as usize && n > local_rank as usize => Ok(GpuChoice::Listed {
            ordinal: local_rank as usize,
            visible: n,
        }),
        n => Err(LaunchError::Invalid {
            var: CUDA_VISIBLE_DEVICES,
            value: value.to_owned(),
            why: format!(
                "{n} visible device(s) for local rank {local_rank} of {local_ranks} on this \
                 node; list one device per task (--gpus-per-task=1) or at least one per local \
                 rank"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_means_every_gpu_numbered_by_local_rank() {
        assert_eq!(
            gpu_ordinal(3, 8, None),
            Ok(GpuChoice::AllVisible { ordinal: 3 }),
            "torchrun and --nproc-per-node leave the variable alone"
        );
    }

    #[test]
    fn one_bound_gpu_is_ordinal_zero_for_every_local_rank() {
        for local_rank in 0..4 {
            assert_eq!(gpu_ordinal(local_rank, 4, Some("5")), Ok(GpuChoice::Bound));
        }
        let uuid = Some("GPU-8a2c7e1f-0b3d-4e5f-9a6b-7c8d9e0f1a2b");
        assert_eq!(gpu_ordinal(2, 4, uuid).map(GpuChoice::ordinal), Ok(0));
    }

    #[test]
    fn a_list_of_one_per_local_rank_is_indexed_by_local_rank() {
        assert_eq!(
            gpu_ordinal(2, 4, Some("0,1,2,3")),
            Ok(GpuChoice::Listed {
                ordinal: 2,
                visible: 4
            })
        );
        assert_eq!(
            gpu_ordinal(1, 2, Some("4, 5, 6")).map(GpuChoice::ordinal),
            Ok(1)
        );
    }

    #[test]
    fn too_few_devices_name_the_variable_its_value_and_the_rank() {
        let err = gpu_ordinal(3, 4, Some("0,1")).expect_err("two GPUs for four ranks");
        assert_eq!(
            err.to_string(),
            "CUDA_VISIBLE_DEVICES=\"0,1\": 2 visible device(s) for local rank 3 of 4 on this \
             node; list one device per task (--gpus-per-task=1) or at least one per local rank"
        );
        for hidden in ["", "-1"] {
            assert!(
                gpu_ordinal(0, 2, Some(hidden)).is_err(),
                "{hidden:?} hides every GPU"
            );
        }
    }
}
