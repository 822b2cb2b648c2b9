//! Everything the memory and time models read about one fully fixed layout.

use ferrotron_recipe::{Cluster, GpuKind, Recipe};

use crate::hardware::{GpuSpec, HostSpec};
use crate::layout::Layout;
use crate::params::ParameterCount;
use crate::stages::StageInfo;
use crate::term::Term;

#[derive(Clone)]
pub(crate) struct Setup<'a> {
    /// With derived defaults applied.
    pub recipe: &'a Recipe,
    pub cluster: &'a Cluster,
    pub layout: Layout,
    pub spec: GpuSpec,
    /// The node's host side, for the optimizer CPU offload.
    pub host: HostSpec,
    /// Of each rank's optimizer parameters, the share whose state lives in host memory
    /// (`optimizer_offload_fraction` with `optimizer_cpu_offload`, else 0).
    pub offload_fraction: f64,
    pub params: ParameterCount,
    pub padded_vocab: u32,
    pub stages: Vec<StageInfo>,
    pub num_microbatches: u32,
    /// Build the formula strings (for the final plan); the `auto` search skips them.
    pub explain: bool,
}

impl Setup<'_> {
    /// A term whose formula is only formatted when the plan will show it.
    pub(crate) fn term(&self, name: &str, value: f64, formula: impl FnOnce() -> String) -> Term {
        Term::new(
            name,
            value,
            if self.explain {
                formula()
            } else {
                String::new()
            },
        )
    }

    /// Flash attention on GPUs (our CUDA backend's fused kernel); the decomposed softmax on CPU.
    pub(crate) fn flash_attention(&self) -> bool {
        self.cluster.gpu != GpuKind::Cpu
    }

    /// Whether the model runs whole on one rank, one chunk: where the runtime's MoE layers run
    /// their experts locally and can put them in fp8 (a model cut over ranks routes through the
    /// token dispatcher, which keeps them in the model's dtype).
    pub(crate) fn whole_experts(&self) -> bool {
        let d = self.layout.degrees;
        d.world_size() == 1 && d.vpp == 1
    }

    /// Divisor of sequence-sharded activations: tp with sequence parallelism, else 1.
    pub(crate) fn sequence_shards(&self) -> f64 {
        if self.recipe.parallel.sequence_parallel {
            f64::from(self.layout.degrees.tp)
        } else {
            1.0
        }
    }

    /// Tokens of one microbatch on one rank: micro batch × seq / cp.
    pub(crate) fn local_tokens(&self) -> f64 {
        f64::from(self.layout.micro_batch_size) * f64::from(self.recipe.model.seq_length)
            / f64::from(self.layout.degrees.cp)
    }

    /// Bandwidth of a group whose ranks span `extent` consecutive ranks.
    pub(crate) fn bandwidth(&self, extent: u32) -> f64 {
        if extent <= self.cluster.gpus_per_node {
            self.spec.intra_node_bus_bandwidth
        } else {
            self.spec.inter_node_bandwidth
        }
    }
}
