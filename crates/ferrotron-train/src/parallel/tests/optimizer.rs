//! The sharded AdamW is the one-rank AdamW, bit for bit, however the buffer is cut.

use std::collections::{HashMap, HashSet};

use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use ferrotron_parallel::{ParamRole, ShardSpec};

use crate::parallel::dist_optimizer::{ShardState, ShardedAdamW, Update};
use crate::parallel::flat::FlatLayout;
use crate::parallel::host::{grad_values, param_values};
use crate::params::tests::{Cpu, CpuAutodiff, tiny};
use crate::{AdamW, AdamWConfig, param_entries};

#[test]
fn sharded_adamw_is_bitwise_adamw() {
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let device = Default::default();
    let mut model = tiny::<CpuAutodiff>(&device);
    let entries = param_entries::<CpuAutodiff, _>(&model);
    let no_decay: HashSet<ParamId> = entries
        .iter()
        .filter(|e| e.shape.len() == 1)
        .map(|e| e.id)
        .collect();
    let roles: Vec<(usize, ParamRole, usize)> = entries
        .iter()
        .map(|e| {
            let mut role = ParamRole::new(e.id, ShardSpec::full(e.name.clone(), e.shape.clone()));
            role.no_weight_decay = no_decay.contains(&e.id);
            (0, role, e.shape.iter().product())
        })
        .collect();
    let values = param_values::<CpuAutodiff, _>(&model);
    // three ranks' shards of a buffer cut into small buckets
    let layouts: Vec<FlatLayout> = (0..3)
        .map(|part| FlatLayout::new(roles.clone(), 4, 3, part))
        .collect();
    let full_params = |values: &HashMap<ParamId, Vec<f32>>| {
        super::super::grad_sync::fill(&layouts[0], std::slice::from_ref(values)).values
    };
    let mut states: Vec<ShardState> = layouts
        .iter()
        .map(|layout| ShardState::new(layout, &full_params(&values)))
        .collect();
    let mut sharded = ShardedAdamW::new(config);
    let mut reference = AdamW::<Cpu>::new(config, no_decay);
    for step in 1..=3 {
        let input = Tensor::<CpuAutodiff, 2>::from_floats(
            [[0.5, -1.0, 2.0 * step as f32], [1.5, 0.25, -0.75]],
            &device,
        );
        let mut hidden = input;
        for layer in &model.layers {
            hidden = layer.forward(hidden);
        }
        let loss = (hidden.sum() * model.scale.val().sum()).powi_scalar(2);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grad = full_params(&grad_values::<CpuAutodiff, _>(&model, &grads));
        let has_grad = vec![1.0; layouts[0].slots.len()];
        let update = Update {
            lr: 0.01,
            grad_scale: 0.5,
        };
        sharded.begin_step();
        for (layout, state) in layouts.iter().zip(&mut states) {
            let shard = super::super::dist_optimizer::cut(layout, &grad);
            sharded.update(state, &shard, &has_grad, update);
        }
        model = reference.step(model, grads, update.lr, update.grad_scale);
    }
    let expected = full_params(&param_values::<CpuAutodiff, _>(&model));
    let mut got = vec![0.0; layouts[0].len];
    for (layout, state) in layouts.iter().zip(&states) {
        let mut at = 0;
        for part in layout.shard_ranges() {
            let len = part.len();
            got[part].copy_from_slice(&state.master[at..at + len]);
            at += len;
        }
    }
    let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&expected));
}
