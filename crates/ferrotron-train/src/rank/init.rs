//! The initial model is a function of the seed alone, whatever the backend: weights are drawn
//! on the CPU backend (burn-flex) and copied to the training device. Each backend has its own
//! random generator (Flex's, Philox on ferrotron-cuda, cubecl's on burn-cuda), so
//! drawing on the device would start every backend from different weights, and comparing a GPU
//! run's loss curve with the CPU's would measure the draw, not the arithmetic. On the CPU
//! backend itself the model is drawn in place, exactly as before. The CPU draw is one core's
//! work (8 B normal draws for an 8B model), so `runtime.use_cpu_initialization: false`
//! (Megatron's default) lets the device draw instead: still a function of the seed on that backend, and the
//! same for every layout, since each rank draws the whole model and keeps its cut.

use std::any::TypeId;
use std::collections::HashMap;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use ferrotron_model::{GptModel, ModelConfig};

use crate::rng::with_process_rng;
use crate::{TrainError, load_named_tensors, named_tensors};

/// The model `config` describes, initialised from `seed`, on `device`: drawn on the CPU and
/// copied when `on_cpu` (or drawn in place on the CPU backend), else by the device.
pub(crate) fn seeded_model<B: Backend>(
    config: &ModelConfig,
    seed: u64,
    on_cpu: bool,
    device: &B::Device,
) -> Result<GptModel<B>, TrainError> {
    if draws_in_place::<B>(on_cpu) {
        return Ok(with_process_rng(|| {
            B::seed(device, seed);
            config.init(device)
        }));
    }
    let host = Default::default();
    let drawn: GptModel<Flex> = with_process_rng(|| {
        Flex::seed(&host, seed);
        config.init(&host)
    });
    let values: HashMap<_, _> = named_tensors::<Flex, _>(&drawn)
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    drop(drawn);
    let shell: GptModel<B> = config.init(device);
    load_named_tensors(shell, &values).map_err(|problems| {
        TrainError::Config(format!(
            "copying the CPU-drawn initial model to the device: {}",
            problems.join("; ")
        ))
    })
}

/// Whether `B` draws the model itself: the CPU backend always (it is the CPU draw), any other
/// backend when the recipe turns CPU initialization off.
fn draws_in_place<B: Backend>(on_cpu: bool) -> bool {
    !on_cpu
        || TypeId::of::<B>() == TypeId::of::<Flex>()
        || TypeId::of::<B>() == TypeId::of::<burn::backend::Autodiff<Flex>>()
}

#[cfg(test)]
mod tests {
    use burn::backend::Autodiff;
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;

    use super::*;

    /// Not the CPU training backend's type, so it takes the draw-on-the-CPU-and-copy path.
    type Other = Autodiff<Flex, BalancedCheckpointing>;

    fn config() -> ModelConfig {
        let recipe: ferrotron_recipe::Model = serde_saphyr::from_str(
            "num_layers: 1\nhidden_size: 8\nnum_attention_heads: 2\nseq_length: 4\n\
             max_position_embeddings: 4\n",
        )
        .expect("model section parses");
        ModelConfig::from_model_with_vocab(&recipe, 32, 32).expect("valid model")
    }

    #[test]
    fn another_backend_starts_from_the_cpu_draw() {
        let device = Default::default();
        let cpu = seeded_model::<Autodiff<Flex>>(&config(), 7, true, &device).expect("cpu");
        let other = seeded_model::<Other>(&config(), 7, true, &device).expect("copied");
        let values = named_tensors::<Other, _>(&other);
        assert_eq!(named_tensors::<Autodiff<Flex>, _>(&cpu), values);
        let reseeded = seeded_model::<Other>(&config(), 8, true, &device).expect("seed 8");
        assert_ne!(values, named_tensors::<Other, _>(&reseeded));
    }

    /// Without CPU initialization a backend draws with its own generator, seeded: the model is
    /// what that backend's seeded `init` makes, the same twice, another for another seed. (This
    /// test backend's generator is burn-flex's, so its own draw equals the CPU's: which path
    /// runs is asserted apart.)
    #[test]
    fn without_cpu_initialization_the_device_draws_from_the_seed() {
        assert!(draws_in_place::<Other>(false));
        assert!(!draws_in_place::<Other>(true));
        assert!(draws_in_place::<Autodiff<Flex>>(true));
        let device = Default::default();
        let own = |seed| {
            let model = seeded_model::<Other>(&config(), seed, false, &device).expect("drawn");
            named_tensors::<Other, _>(&model)
        };
        let expected = with_process_rng(|| {
            Other::seed(&device, 7);
            named_tensors::<Other, _>(&config().init::<Other>(&device))
        });
        assert_eq!(own(7), expected);
        assert_eq!(own(7), own(7));
        assert_ne!(own(7), own(8));
    }
}
