//! Process groups from a real plan: each group's collectives involve exactly its members.

use std::time::Duration;

use ferrotron_dist::{
    CommError, Communicator, ProcessGroups, RankContext, ReduceOp, ThreadComm, World,
};
use ferrotron_plan::{Plan, PlanOptions, plan};
use ferrotron_recipe::{Cluster, GpuKind, Recipe};
use serde_json::json;

use crate::{TrainError, group_members};

/// Runs `body` on `n` thread ranks; the results in rank order.
fn on_ranks<R: Send>(n: u32, body: impl Fn(RankContext) -> Result<R, CommError> + Sync) -> Vec<R> {
    World::new(n)
        .with_timeout(Duration::from_secs(10))
        .run(body)
        .unwrap_or_else(|err| panic!("{n} ranks: {err}"))
}

/// This rank's groups from `plan`, as the runtime builds them.
fn groups_from_plan(
    plan: &Plan,
    ctx: &RankContext,
) -> Result<ProcessGroups<ThreadComm>, CommError> {
    let members = group_members(plan, ctx.rank(), ctx.world_size() as usize)
        .unwrap_or_else(|e| panic!("rank {}: {e}", ctx.rank()));
    ctx.groups(&members)
}

/// A tiny GPT on 8 CPU ranks with the given `parallel` section.
fn tiny_plan(parallel: serde_json::Value, moe: Option<serde_json::Value>) -> Plan {
    let mut model = json!({"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                           "seq_length": 32, "max_position_embeddings": 32, "vocab_size": 256});
    if let Some(moe) = moe {
        model["moe"] = moe;
    }
    let recipe: Recipe = serde_json::from_value(json!({
        "version": 2,
        "name": "dist-test",
        "model": model,
        "parallel": parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "train_iters": 1},
    }))
    .expect("the test recipe deserializes");
    let options = PlanOptions {
        cluster: Some(Cluster {
            nodes: 1,
            gpus_per_node: 8,
            gpu: GpuKind::Cpu,
        }),
        vocab_size: 256,
    };
    plan(&recipe, &options).unwrap_or_else(|findings| panic!("plans: {findings:?}"))
}

fn named(groups: &ProcessGroups<ThreadComm>) -> Vec<(&'static str, &ThreadComm)> {
    let mut all = vec![
        ("tp", &groups.tp),
        ("pp", &groups.pp),
        ("dp", &groups.dp),
        ("cp", &groups.cp),
        ("dp_cp", &groups.dp_cp),
        ("ep", &groups.ep),
        ("etp", &groups.etp),
        ("edp", &groups.edp),
    ];
    if let Some(embedding) = &groups.embedding {
        all.push(("embedding", embedding));
    }
    all
}

/// On every rank, all-gathers and all-reduces the global rank over each of its groups.
fn exercise(plan: &Plan) -> Vec<Vec<(&'static str, Vec<u32>, u32)>> {
    on_ranks(plan.world_size, |ctx| {
        let groups = groups_from_plan(plan, &ctx)?;
        let mut seen = Vec::new();
        for (name, comm) in named(&groups) {
            let mut gathered = vec![0u32; comm.size()];
            comm.all_gather(&[ctx.rank()], &mut gathered)?;
            let mut sum = [ctx.rank()];
            comm.all_reduce(&mut sum, ReduceOp::Sum)?;
            seen.push((name, gathered, sum[0]));
        }
        Ok(seen)
    })
}

fn assert_groups_match_the_plan(plan: &Plan) {
    let results = exercise(plan);
    for (rank, seen) in results.iter().enumerate() {
        let mine = plan.groups_of(rank as u32).expect("rank in plan");
        let mut expected = vec![
            ("tp", mine.tp),
            ("pp", mine.pp),
            ("dp", mine.dp),
            ("cp", mine.cp),
            ("dp_cp", mine.dp_cp),
            ("ep", mine.ep),
            ("etp", mine.etp),
            ("edp", mine.edp),
        ];
        expected.extend(mine.embedding.map(|ranks| ("embedding", ranks)));
        assert_eq!(seen.len(), expected.len(), "rank {rank}");
        for ((name, gathered, sum), (expected_name, members)) in seen.iter().zip(expected) {
            assert_eq!(*name, expected_name);
            assert_eq!(gathered, members, "rank {rank}, group {name}");
            assert_eq!(
                *sum,
                members.iter().sum::<u32>(),
                "rank {rank}, group {name}"
            );
        }
    }
}

#[test]
fn tp2_pp2_dp2_groups_talk_only_to_their_members() {
    let plan = tiny_plan(json!({"tensor": 2, "pipeline": 2}), None);
    assert_eq!(plan.degrees.dp, 2);
    // Megatron's order tp-cp-ep-dp-pp: rank = tp + 2·dp + 4·pp.
    let five = plan.groups_of(5).expect("rank 5");
    assert_eq!(
        (five.tp, five.dp, five.pp),
        (&[4, 5][..], &[5, 7][..], &[1, 5][..])
    );
    assert_groups_match_the_plan(&plan);
}

#[test]
fn expert_groups_of_a_moe_plan_talk_only_to_their_members() {
    let plan = tiny_plan(
        json!({"tensor": 2, "pipeline": 2, "expert": 2, "expert_tensor": 1,
               "sequence_parallel": true}),
        Some(json!({"num_experts": 4, "router_topk": 2})),
    );
    assert_eq!((plan.degrees.ep, plan.degrees.edp), (2, 2));
    assert_groups_match_the_plan(&plan);
}

#[test]
fn a_plan_for_another_world_size_is_rejected() {
    let plan = tiny_plan(json!({"tensor": 2, "pipeline": 2}), None);
    let err = group_members(&plan, 0, 4).expect_err("8-rank plan on 4 ranks");
    assert!(
        matches!(&err, TrainError::Config(message)
            if message.ends_with("the plan does not match this world: the plan has 8 ranks, the world 4")),
        "{err}"
    );
}
