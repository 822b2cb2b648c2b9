use super::*;

fn sigmoid_bias_model() -> Model {
    let mut model = moe_model();
    model.moe = Some(Moe {
        score_function: ScoreFunction::Sigmoid,
        expert_bias: true,
        expert_bias_update_rate: 0.5,
        load_balancing: LoadBalancing::None,
        ..moe_section()
    });
    model
}

#[test]
fn dropless_routing_sends_every_token_to_topk_experts() {
    let gpt = build::<Cpu>(&moe_model(), 1);
    let output = gpt.forward(tokens(&[&[1, 2, 3, 4, 5, 6], &[7, 8, 9, 10, 11, 12]]));
    // One MoE layer (layer 0 of 2), 12 tokens × top-2 = 24 assignments.
    assert_eq!(output.expert_loads.summed().len(), 1);
    assert_eq!(output.expert_loads.summed()[0].iter().sum::<u64>(), 24);
    assert!(scalar(output.aux_loss) > 0.0);
}

#[test]
fn capacity_limits_every_expert() {
    let mut model = moe_model();
    model.moe = Some(Moe {
        capacity_factor: Some(0.5),
        ..moe_section()
    });
    let gpt = build::<Cpu>(&model, 1);
    let output = gpt.forward(tokens(&[&[1, 2, 3, 4, 5, 6, 7, 8]]));
    // capacity = ceil(8·2 / 4 · 0.5) = 2 tokens per expert.
    let loads = &output.expert_loads.summed()[0];
    assert!(loads.iter().all(|&l| l <= 2), "{loads:?}");
    assert!(
        loads.iter().sum::<u64>() < 16,
        "some tokens must be dropped: {loads:?}"
    );
}

#[test]
fn every_balancing_option_builds_and_runs() {
    let variants = [
        Moe {
            load_balancing: LoadBalancing::SeqAuxLoss,
            ..moe_section()
        },
        Moe {
            pre_softmax: true,
            router_topk: 1,
            z_loss_coeff: Some(1e-3),
            ..moe_section()
        },
        Moe {
            num_groups: Some(2),
            group_topk: Some(1),
            score_function: ScoreFunction::Sigmoid,
            ..moe_section()
        },
        Moe {
            capacity_factor: Some(1.0),
            token_drop_policy: TokenDropPolicy::Position,
            pad_to_capacity: true,
            ..moe_section()
        },
        Moe {
            load_balancing: LoadBalancing::None,
            shared_expert_ffn_hidden_size: None,
            layer_freq: ferrotron_recipe::LayerFreq::Every(1),
            ..moe_section()
        },
        Moe {
            load_balancing: LoadBalancing::Sinkhorn,
            aux_loss_coeff: 0.0,
            ..moe_section()
        },
    ];
    for moe in variants {
        let model = Model {
            moe: Some(moe.clone()),
            ..llama_model()
        };
        let gpt = build::<Cpu>(&model, 1);
        let output = gpt.loss(tokens(&[&[1, 2, 3, 4]]), tokens(&[&[2, 3, 4, 5]]));
        let loss = scalar(output.loss);
        assert!(loss.is_finite(), "{moe:?}: {loss}");
    }
}

#[test]
fn seq_aux_loss_differs_from_batch_aux_loss() {
    let batch = build::<Cpu>(&moe_model(), 1);
    let mut model = moe_model();
    model.moe = Some(Moe {
        load_balancing: LoadBalancing::SeqAuxLoss,
        ..moe_section()
    });
    let sequence = build::<Cpu>(&model, 1);
    let input = tokens(&[&[1, 2, 3, 4], &[90, 91, 92, 93]]);
    let a = scalar(batch.forward(input.clone()).aux_loss);
    let b = scalar(sequence.forward(input).aux_loss);
    // Per-sequence imbalance is at least the batch imbalance (Jensen), and here strictly more.
    assert!(b > a, "sequence {b} vs batch {a}");
}

#[test]
fn expert_bias_update_follows_the_sign_rule() {
    let gpt = build::<Cpu>(&sigmoid_bias_model(), 1);
    assert_eq!(values(gpt.expert_biases()[0].clone()), vec![0.0; 4]);
    // Mean load 2: under-loaded experts (1, 2) go up by the rate, over-loaded ones (0, 3) down.
    let mut loads = ExpertLoads::from_layers(vec![vec![3, 1, 0, 4]]);
    let gpt = gpt.update_expert_bias(&mut loads).expect("shapes match");
    assert_eq!(
        values(gpt.expert_biases()[0].clone()),
        vec![-0.5, 0.5, 0.5, -0.5]
    );

    let mut wrong = ExpertLoads::from_layers(vec![vec![1, 2]]);
    assert!(gpt.update_expert_bias(&mut wrong).is_err());
}

#[test]
fn expert_bias_steers_routing_towards_underloaded_experts() {
    let gpt = build::<Cpu>(&sigmoid_bias_model(), 1);
    let input = tokens(&[&[1, 2, 3, 4, 5, 6, 7, 8]]);
    let mut loads = gpt.forward(input.clone()).expert_loads;
    let before = loads.summed();
    let starved = before[0]
        .iter()
        .enumerate()
        .min_by_key(|&(_, &load)| load)
        .map(|(expert, _)| expert)
        .unwrap_or(0);
    let gpt = gpt.update_expert_bias(&mut loads).expect("shapes match");
    let after = gpt.forward(input).expert_loads.summed();
    assert!(
        after[0][starved] > before[0][starved],
        "expert {starved}: {:?} → {:?}",
        before[0],
        after[0]
    );
}

#[test]
fn loads_accumulate_over_microbatches() {
    let mut total = ExpertLoads::default();
    total.accumulate(&ExpertLoads::from_layers(vec![vec![1, 2]]));
    total.accumulate(&ExpertLoads::from_layers(vec![vec![3, 0]]));
    assert_eq!(total.summed(), vec![vec![4, 2]]);
}

#[test]
fn sinkhorn_balances_only_while_training() {
    let mut model = moe_model();
    model.moe = Some(Moe {
        load_balancing: LoadBalancing::Sinkhorn,
        aux_loss_coeff: 0.0,
        router_topk: 1,
        ..moe_section()
    });
    let input: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8];
    let training = build::<CpuAutodiff>(&model, 1);
    let inference = build::<Cpu>(&model, 1);
    let balanced = training.forward(tokens(&[input])).expert_loads.summed()[0].clone();
    let plain = inference.forward(tokens(&[input])).expert_loads.summed()[0].clone();
    let spread = |loads: &[u64]| loads.iter().max().copied().unwrap_or(0);
    assert!(
        spread(&balanced) <= spread(&plain),
        "{balanced:?} vs {plain:?}"
    );
    // Sinkhorn needs no auxiliary loss, and training still works through it.
    let output = training.loss(tokens(&[input]), tokens(&[input]));
    assert_eq!(scalar(output.aux_loss), 0.0);
    assert!(scalar(output.loss).is_finite());
}
