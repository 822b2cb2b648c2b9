//! The optimizer CPU offload (issue 49) on Llama 3.1 8B (`recipes/llama3.1-8b.yaml`) alone on
//! one GPU with its full recomputation: 8.03 B parameters take 16 GB of bf16 weights (32 GB
//! with the update's new copy), 32 GB of fp32 gradient sum (128 microbatches) and 96 GB of fp32
//! master and moments, which do not fit an 80 GiB H100; moved to the host's 128 GiB they do.

mod support;

use ferrotron_plan::{Plan, PlanOptions, plan, render_human};
use ferrotron_recipe::{Cluster, Degree, Finding, GpuKind, Recipe, StateDtype};
use support::load_preset;

const GIB: f64 = (1u64 << 30) as f64;

/// The preset for one GPU (data parallel 1), with the precision-aware optimizer.
fn llama_8b() -> Recipe {
    let mut recipe = load_preset("llama3.1-8b");
    recipe.parallel.data = Degree::Fixed(1);
    recipe.training.optimizer.use_precision_aware_optimizer = true;
    recipe
}

fn offloading(mut recipe: Recipe, fraction: f64) -> Recipe {
    recipe.training.optimizer.optimizer_cpu_offload = true;
    recipe.training.optimizer.optimizer_offload_fraction = fraction;
    recipe
}

fn plan_on(recipe: &Recipe, gpu: GpuKind) -> Result<Plan, Vec<Finding>> {
    let opts = PlanOptions {
        cluster: Some(Cluster {
            nodes: 1,
            gpus_per_node: 1,
            gpu,
        }),
        vocab_size: 128256,
    };
    plan(recipe, &opts)
}

fn planned(recipe: &Recipe, gpu: GpuKind) -> Plan {
    plan_on(recipe, gpu).unwrap_or_else(|findings| panic!("{findings:#?}"))
}

fn near(bytes: u64, expected: f64) -> bool {
    (bytes as f64 - expected).abs() < 1e3
}

#[test]
fn without_the_offload_the_8b_does_not_fit_one_h100() {
    let plan = planned(&llama_8b(), GpuKind::H100);
    let p = plan.parameters.total as f64;
    assert_eq!(p, 8_030_261_248.0);
    let b = plan.memory.per_gpu_bytes;
    assert!(!plan.memory.fits);
    assert!(plan.memory.host.is_none());
    // Its peak is the update: two bf16 copies, the fp32 gradient sum, master and moments.
    assert!(near(b.weights, 4.0 * p), "{b:?}");
    assert!(near(b.gradients, 4.0 * p), "{b:?}");
    assert!(near(b.optimizer, 12.0 * p), "{b:?}");
    assert!(b.total as f64 > 150.0 * GIB, "{b:?}");
    // The warning names the smallest fraction that would fit: (158.6 − 80) / 89.7 → 0.9.
    assert!(
        plan.warnings[0].starts_with("does not fit: 158.6 GiB")
            && plan.warnings[0].contains("optimizer_offload_fraction 0.9 would fit it"),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn offloading_the_whole_optimizer_state_fits_and_the_host_holds_it() {
    let without = planned(&llama_8b(), GpuKind::H100);
    let plan = planned(&offloading(llama_8b(), 1.0), GpuKind::H100);
    let p = plan.parameters.total as f64;
    let b = plan.memory.per_gpu_bytes;
    assert!(plan.memory.fits, "{b:?}");
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    assert_eq!(b.optimizer, 0);
    assert_eq!(b.weights, without.memory.per_gpu_bytes.weights);
    assert_eq!(b.gradients, without.memory.per_gpu_bytes.gradients);
    assert_eq!(
        without.memory.per_gpu_bytes.total - b.total,
        without.memory.per_gpu_bytes.optimizer
    );
    assert!(
        (68.0 * GIB..70.0 * GIB).contains(&(b.total as f64)),
        "{b:?}"
    );
    let host = plan.memory.host.as_ref().expect("host memory");
    assert!(near(host.optimizer_states, 12.0 * p));
    assert_eq!(host.total, host.optimizer_states + (16.125 * GIB) as u64);
    assert_eq!(host.limit_bytes as f64, 128.0 * GIB);
    assert!(host.fits);
    // The step pays the transfers and the host AdamW instead of the GPU's optimizer pass.
    let t = &plan.predicted;
    // the three overlap: the host's AdamW (30 B a parameter at 150 GB/s) is the slowest
    let offload = 30.0 * p / 150e9;
    assert!((t.breakdown.optimizer_offload - offload).abs() < 1e-6);
    assert_eq!(t.breakdown.optimizer, 0.0);
    let expected = without.predicted.step_seconds - without.predicted.breakdown.optimizer + offload;
    assert!((t.step_seconds - expected).abs() < 1e-6);
    let report = render_human(&plan);
    for line in [
        "  total                   68.87 GiB of 80.00 GiB (fits)",
        "host memory per node (optimizer CPU offload of 100% of each rank's optimizer state; most loaded: node 0, 1 rank(s) per node)",
        "  optimizer states        89.75 GiB",
        "  total                  105.87 GiB of 128.00 GiB (fits)",
        "  optimizer offload    1.606 s, 1.4% of the step: the slowest of gradients down 0.595 s, AdamW on the host 1.606 s, weights up 0.297 s (overlapped)",
    ] {
        assert!(report.contains(line), "{line}\n{report}");
    }
}

#[test]
fn auto_turns_the_offload_on_only_when_no_layout_fits_without_it() {
    let mut recipe = llama_8b();
    recipe.training.micro_batch_size = Degree::AUTO;
    let plan = planned(&recipe, GpuKind::H100);
    let optimizer = &plan.recipe.training.optimizer;
    assert!(optimizer.optimizer_cpu_offload);
    // The smallest multiple of 0.05 that fits, at the fastest micro batch.
    assert_eq!(optimizer.optimizer_offload_fraction, 0.9);
    assert!(plan.memory.fits);
    let best = &plan.auto.as_ref().expect("auto report").top[0];
    assert_eq!(best.optimizer_offload_fraction, Some(0.9));
    assert!(
        best.why.contains("optimizer offload 0.9 with"),
        "{}",
        best.why
    );
    assert!(
        plan.warnings[0].contains("turned on with optimizer_offload_fraction 0.9"),
        "{:?}",
        plan.warnings
    );
    // 0.85 would not fit: the plan is at the edge of the GPU, not far inside it.
    let less = planned(&offloading(llama_8b(), 0.85), GpuKind::H100);
    assert!(!less.memory.fits);

    // A GPU that holds everything keeps the optimizer on it: bf16 moments on an H200.
    let mut bf16_moments = recipe.clone();
    let optimizer = &mut bf16_moments.training.optimizer;
    optimizer.exp_avg_dtype = StateDtype::Bf16;
    optimizer.exp_avg_sq_dtype = StateDtype::Bf16;
    let h200 = planned(&bf16_moments, GpuKind::H200);
    assert!(h200.memory.fits);
    assert!(!h200.recipe.training.optimizer.optimizer_cpu_offload);
    assert!(h200.memory.host.is_none());

    // Without the precision-aware optimizer the offload is not Megatron's to take.
    recipe.training.optimizer.use_precision_aware_optimizer = false;
    let findings = plan_on(&recipe, GpuKind::H100).expect_err("nothing fits");
    assert_eq!(findings[0].code, "plan::out-of-memory");
    let help = findings[0].help.as_deref().unwrap_or_default();
    assert!(help.contains("optimizer_cpu_offload"), "{help}");
}

/// The 8B's shape with 44 layers: 10.65 B parameters, 119 GiB of optimizer state.
fn llama_44_layers() -> Recipe {
    let mut recipe = llama_8b();
    recipe.model.num_layers = 44;
    recipe
}

#[test]
fn the_host_can_be_the_limit() {
    // On one H200 the whole offload fits the GPU but not 128 GiB of host memory.
    let plan = planned(&offloading(llama_44_layers(), 1.0), GpuKind::H200);
    let host = plan.memory.host.as_ref().expect("host memory");
    assert!(plan.memory.per_gpu_bytes.total <= plan.memory.limit_bytes);
    assert!(!host.fits && !plan.memory.fits);
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    assert!(
        plan.warnings[0]
            .starts_with("does not fit the host: 135.1 GiB of host memory needed on node 0")
            && plan.warnings[0].contains(
                "128.0 GiB available; lower training.optimizer.optimizer_offload_fraction"
            ),
        "{:?}",
        plan.warnings
    );
    assert!(render_human(&plan).contains("of 128.00 GiB (DOES NOT FIT)"));

    // An `auto` search with that fraction finds nothing and says the host is why.
    let mut recipe = offloading(llama_44_layers(), 1.0);
    recipe.training.micro_batch_size = Degree::AUTO;
    let findings = plan_on(&recipe, GpuKind::H200).expect_err("the host is too small");
    assert_eq!(findings[0].code, "plan::out-of-host-memory");
    assert_eq!(
        findings[0].path,
        "training.optimizer.optimizer_offload_fraction"
    );
    assert!(
        findings[0]
            .message
            .contains("GiB of host memory per node, 128.0 GiB available"),
        "{}",
        findings[0].message
    );

    // Left to choose, it offloads only what the GPU cannot hold, and that the host can.
    let mut recipe = llama_44_layers();
    recipe.training.micro_batch_size = Degree::AUTO;
    let plan = planned(&recipe, GpuKind::H200);
    let fraction = plan.recipe.training.optimizer.optimizer_offload_fraction;
    assert!(plan.recipe.training.optimizer.optimizer_cpu_offload);
    assert!((0.4..1.0).contains(&fraction), "{fraction}");
    assert!(plan.memory.fits);
    let less = planned(
        &offloading(llama_44_layers(), fraction - 0.05),
        GpuKind::H200,
    );
    assert!(less.memory.per_gpu_bytes.total > less.memory.limit_bytes);
}
