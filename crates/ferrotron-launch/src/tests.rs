//! Scripts rendered from real plans, as snapshots: what a user would submit.

use std::path::PathBuf;

use ferrotron_plan::{Plan, PlanOptions, plan};
use ferrotron_recipe::{Cluster, GpuKind, Recipe};
use serde_json::json;

use crate::{ArrayTask, JobShape, SbatchScript, SlurmOptions, TaskCommand};

fn gpt_plan(name: &str, parallel: serde_json::Value, cluster: Cluster) -> Plan {
    let recipe: Recipe = serde_json::from_value(json!({
        "version": 2,
        "name": name,
        "model": {"num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
                  "seq_length": 128, "max_position_embeddings": 128, "vocab_size": 1024},
        "parallel": parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": 16, "train_iters": 10},
    }))
    .expect("the test recipe deserializes");
    let options = PlanOptions {
        cluster: Some(cluster),
        vocab_size: 1024,
    };
    plan(&recipe, &options).unwrap_or_else(|findings| panic!("plans: {findings:?}"))
}

/// The plan hash changes with every planner release; the snapshot is about the script.
fn without_hash(text: &str, plan: &Plan) -> String {
    let short = &plan.plan_hash[..12];
    assert!(text.contains(short), "the script names its plan");
    text.replace(short, "<plan hash>")
}

fn run_command(recipe: &str) -> TaskCommand {
    TaskCommand {
        program: PathBuf::from("/opt/ferrotron/bin/recipe"),
        args: vec!["run".into(), recipe.into()],
    }
}

#[test]
fn a_gpu_run_asks_for_the_plans_cluster() {
    let plan = gpt_plan(
        "gpt-2n",
        json!({"tensor": 2, "pipeline": 2}),
        Cluster {
            nodes: 2,
            gpus_per_node: 8,
            gpu: GpuKind::H100,
        },
    );
    let options = SlurmOptions {
        partition: Some("gpu".into()),
        time: Some("2-00:00:00".into()),
        account: Some("proj42".into()),
        cpus_per_task: Some(12),
        extra: vec!["--constraint=h100".into(), "--exclusive".into()],
        ..SlurmOptions::default()
    };
    let script = SbatchScript::for_run(&plan, &run_command("recipes/gpt 2n.yaml"), &options);
    assert_eq!(script.job_name, "gpt-2n");
    insta::assert_snapshot!("gpu_run", without_hash(script.text(), &plan));
}

#[test]
fn a_cpu_run_has_no_gpus_and_default_options() {
    let plan = gpt_plan(
        "tiny-dp2",
        json!({"data": 2}),
        Cluster {
            nodes: 1,
            gpus_per_node: 2,
            gpu: GpuKind::Cpu,
        },
    );
    let script = SbatchScript::for_run(
        &plan,
        &run_command("tests/fixtures/slurm/dp2.yaml"),
        &SlurmOptions::default(),
    );
    let text = script.text();
    assert!(!text.contains("--gpus-per-node"));
    assert!(text.contains("#SBATCH --ntasks-per-node=2\n"));
    insta::assert_snapshot!("cpu_run", without_hash(text, &plan));
}

#[test]
fn a_sweep_is_one_array_over_its_members() {
    let cpu = |nodes, per_node| JobShape {
        nodes,
        tasks_per_node: per_node,
        gpus_per_node: 0,
        cpus_per_task: None,
    };
    let shape = JobShape::covering([cpu(1, 1), cpu(1, 2)]).expect("two shapes");
    let tasks: Vec<ArrayTask> = [("lr-scan-000-lr3e-4-tp1", 1), ("lr-scan-001-lr1e-3-tp2", 2)]
        .into_iter()
        .map(|(name, tasks)| ArrayTask {
            name: name.to_owned(),
            tasks,
            command: TaskCommand {
                program: PathBuf::from("/opt/ferrotron/bin/recipe"),
                args: vec![
                    "run".into(),
                    format!("runs/lr-scan/{name}/member.yaml"),
                    "--run-dir".into(),
                    format!("runs/lr-scan/{name}"),
                ],
            },
        })
        .collect();
    let options = SlurmOptions {
        partition: Some("cpu".into()),
        array_parallel: Some(4),
        log_dir: PathBuf::from("runs/lr-scan/logs"),
        ..SlurmOptions::default()
    };
    let script = SbatchScript::for_array("lr-scan", &tasks, shape, &options);
    assert_eq!(script.array_len, Some(2));
    insta::assert_snapshot!("sweep_array", script.text());
}
