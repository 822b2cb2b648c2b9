//! The two communication streams of a GPU rank, by group: the one place that says which groups'
//! collectives run apart from the others (the CUDA backend's streams follow it, and
//! [`crate::replay`] models it).
//!
//! On one stream for every group, a deferred gradient all-reduce of a whole bucket (issued to
//! overlap the backward) would hold back the next layer's tensor-parallel collective and a
//! stage's pipeline send queued after it, so the overlap would lengthen the critical path.
//! Megatron gives data-parallel traffic its own stream for this reason; so does Ferrotron.

/// A communication stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Tensor, sequence, context, pipeline and expert groups (and the world): collectives that
    /// sit inside the forward and backward.
    Model,
    /// Data-parallel traffic: gradient reductions and ZeRO's parameter gathers.
    Data,
}

impl Lane {
    /// The lane of a process group by its name ([`crate::ProcessGroups`]'s names): `dp`,
    /// `dp_cp` and the experts' `edp` carry data-parallel traffic.
    pub fn of_group(name: &str) -> Lane {
        match name {
            "dp" | "dp_cp" | "edp" => Lane::Data,
            _ => Lane::Model,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_parallel_groups_take_the_data_lane_and_the_rest_the_model_lane() {
        for name in ["dp", "dp_cp", "edp"] {
            assert_eq!(Lane::of_group(name), Lane::Data, "{name}");
        }
        for name in ["world", "tp", "pp", "cp", "ep", "etp", "embedding"] {
            assert_eq!(Lane::of_group(name), Lane::Model, "{name}");
        }
    }
}
