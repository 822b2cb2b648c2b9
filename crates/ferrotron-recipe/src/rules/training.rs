//! Training rules: batch arithmetic, the length of the run, the learning-rate schedule,
//! recomputation and precision combinations.

use crate::{
    Decay, Dtype, Finding, Fp8, Fp8AmaxComputeAlgo, Fp8Recipe, Recipe, RecomputeGranularity,
};

pub(super) fn check(recipe: &Recipe, out: &mut Vec<Finding>) {
    let t = &recipe.training;
    if let Some(micro) = t.micro_batch_size.fixed()
        && !t.global_batch_size.is_multiple_of(micro)
    {
        out.push(
            Finding::error(
                "training::global-batch-divisible-by-micro",
                "training.global_batch_size",
                format!(
                    "global_batch_size {} is not a multiple of micro_batch_size {micro}",
                    t.global_batch_size
                ),
            )
            .with_help(format!(
                "use a multiple of {micro} (e.g. {}), or micro_batch_size: auto",
                nearest_multiple(t.global_batch_size, micro)
            )),
        );
    }
    match (t.train_iters, t.train_tokens) {
        (Some(_), Some(_)) => out.push(
            Finding::error(
                "training::one-length",
                "training.train_tokens",
                "both train_iters and train_tokens are set",
            )
            .with_help("keep exactly one of training.train_iters and training.train_tokens"),
        ),
        (None, None) => out.push(
            Finding::error(
                "training::one-length",
                "training.train_iters",
                "the run has no length: neither train_iters nor train_tokens is set",
            )
            .with_help("set training.train_iters (optimizer steps) or training.train_tokens"),
        ),
        _ => {}
    }
    if t.train_iters.is_none()
        && let Some(tokens) = t.train_tokens
    {
        let per_step = u64::from(t.global_batch_size) * u64::from(recipe.model.seq_length);
        if tokens < per_step {
            out.push(
                Finding::error(
                    "training::tokens-below-one-step",
                    "training.train_tokens",
                    format!("train_tokens {tokens} is less than one step ({per_step} tokens)"),
                )
                .with_help(format!("use at least {per_step} tokens")),
            );
        }
    }
    let opt = &t.optimizer;
    if opt.min_lr > opt.lr {
        out.push(
            Finding::error(
                "training::min-lr-above-lr",
                "training.optimizer.min_lr",
                format!("min_lr {} is larger than lr {}", opt.min_lr, opt.lr),
            )
            .with_help(format!("use min_lr ≤ {} (often lr / 10)", opt.lr)),
        );
    }
    check_schedule(recipe, out);
    check_recompute(recipe, out);
    check_precision(recipe, out);
    check_optimizer_states(recipe, out);
}

/// Megatron's precision-aware optimizer: lower-precision states only under it, and it only with
/// the distributed optimizer (`megatron/core/optimizer/optimizer_config.py`, `__init__.py`).
fn check_optimizer_states(recipe: &Recipe, out: &mut Vec<Finding>) {
    let opt = &recipe.training.optimizer;
    for (key, dtype) in [
        ("main_grads_dtype", opt.main_grads_dtype),
        ("exp_avg_dtype", opt.exp_avg_dtype),
        ("exp_avg_sq_dtype", opt.exp_avg_sq_dtype),
    ] {
        if !dtype.is_fp32() && !opt.use_precision_aware_optimizer {
            out.push(
                Finding::error(
                    "training::states-need-precision-aware-optimizer",
                    format!("training.optimizer.{key}"),
                    format!("{key} can only be fp32 when not using the precision-aware optimizer"),
                )
                .with_help(
                    "set training.optimizer.use_precision_aware_optimizer: true (Megatron's \
                     --use-precision-aware-optimizer), or drop the key",
                ),
            );
        }
    }
    if opt.optimizer_cpu_offload && !opt.use_precision_aware_optimizer {
        out.push(
            Finding::error(
                "training::offload-needs-precision-aware-optimizer",
                "training.optimizer.optimizer_cpu_offload",
                "the optimizer CPU offload must be used with the precision-aware optimizer",
            )
            .with_help(
                "set training.optimizer.use_precision_aware_optimizer: true (Megatron asserts \
                 the same: the hybrid device optimizer reuses its code path)",
            ),
        );
    }
    if !opt.optimizer_cpu_offload && opt.optimizer_offload_fraction != 1.0 {
        out.push(
            Finding::error(
                "training::offload-fraction-without-offload",
                "training.optimizer.optimizer_offload_fraction",
                "optimizer_offload_fraction has no effect without optimizer_cpu_offload",
            )
            .with_help("set training.optimizer.optimizer_cpu_offload: true, or drop the key"),
        );
    }
    if opt.use_precision_aware_optimizer && !recipe.parallel.distributed_optimizer {
        out.push(
            Finding::error(
                "training::precision-aware-needs-distributed-optimizer",
                "training.optimizer.use_precision_aware_optimizer",
                "the precision-aware optimizer is only supported with the distributed optimizer",
            )
            .with_help("set parallel.distributed_optimizer: true (it works on one rank too)"),
        );
    }
}

fn check_schedule(recipe: &Recipe, out: &mut Vec<Finding>) {
    let t = &recipe.training;
    let s = &t.schedule;
    // A run shorter than one step is already reported; its schedule has nothing to check.
    let Some(iterations) = t.iterations(recipe.model.seq_length).filter(|&i| i > 0) else {
        return;
    };
    // A run that ends inside its warmup is what a short smoke test of a real recipe looks
    // like (`--set training.train_iters=8`); Megatron trains it, so it is a warning.
    if s.warmup_iters >= iterations {
        out.push(
            Finding::warning(
                "schedule::warmup-too-long",
                "training.schedule.warmup_iters",
                format!(
                    "warmup_iters {} is not less than the {iterations} training iterations: \
                     the run ends during warmup, below the peak learning rate",
                    s.warmup_iters
                ),
            )
            .with_help(format!(
                "fine for a smoke test; for a real run use warmup_iters < {iterations} (a few \
                 percent of the run)"
            )),
        );
    }
    if let Some(decay) = s.decay_iters
        && decay <= s.warmup_iters
    {
        out.push(
            Finding::error(
                "schedule::decay-within-warmup",
                "training.schedule.decay_iters",
                format!(
                    "decay_iters {decay} ends before warmup ({} iterations) does",
                    s.warmup_iters
                ),
            )
            .with_help(format!(
                "decay_iters is where decay ends, counted from the start of training as                  Megatron's --lr-decay-iters (warmup included): use decay_iters > {}",
                s.warmup_iters
            )),
        );
    }
    if s.warmup_init > t.optimizer.lr {
        out.push(
            Finding::error(
                "schedule::warmup-init-above-lr",
                "training.schedule.warmup_init",
                format!(
                    "warmup_init {} is larger than lr {}: warmup would lower the rate",
                    s.warmup_init, t.optimizer.lr
                ),
            )
            .with_help(format!(
                "use warmup_init ≤ {} (Megatron's default is 0)",
                t.optimizer.lr
            )),
        );
    }
    let decay_end = s.decay_iters.unwrap_or(iterations);
    match (s.decay, s.wsd_decay_iters) {
        (Decay::Wsd, None) => out.push(
            Finding::error(
                "schedule::wsd-needs-decay-iters",
                "training.schedule.decay",
                "the WSD schedule needs the length of its final decay phase",
            )
            .with_help("set training.schedule.wsd_decay_iters"),
        ),
        (Decay::Wsd, Some(wsd)) if wsd + s.warmup_iters > decay_end => out.push(
            Finding::error(
                "schedule::wsd-too-long",
                "training.schedule.wsd_decay_iters",
                format!(
                    "warmup ({}) plus wsd_decay_iters ({wsd}) exceed the {decay_end} iterations \
                     where decay ends",
                    s.warmup_iters
                ),
            )
            .with_help(format!(
                "use wsd_decay_iters ≤ {}",
                decay_end.saturating_sub(s.warmup_iters)
            )),
        ),
        (decay, Some(_)) if decay != Decay::Wsd => out.push(
            Finding::error(
                "schedule::wsd-iters-without-wsd",
                "training.schedule.wsd_decay_iters",
                "wsd_decay_iters only applies to the WSD schedule",
            )
            .with_help("remove wsd_decay_iters or set training.schedule.decay: wsd"),
        ),
        _ => {}
    }
    if s.wsd_decay_style.is_some() && s.decay != Decay::Wsd {
        out.push(
            Finding::error(
                "schedule::wsd-style-without-wsd",
                "training.schedule.wsd_decay_style",
                "wsd_decay_style only applies to the WSD schedule",
            )
            .with_help("remove wsd_decay_style or set training.schedule.decay: wsd"),
        );
    }
}

fn check_recompute(recipe: &Recipe, out: &mut Vec<Finding>) {
    let r = &recipe.recompute;
    if !r.modules.is_empty() && r.granularity != RecomputeGranularity::Selective {
        // Megatron: "--recompute-modules is only applicable when --recompute-granularity is
        // selective"; `auto` picks its own modules.
        out.push(
            Finding::error(
                "recompute::modules-only-with-selective",
                "recompute.modules",
                "recompute.modules only applies to granularity `selective`",
            )
            .with_help("remove recompute.modules or set recompute.granularity: selective"),
        );
    }
    let full = r.granularity == RecomputeGranularity::Full;
    if !full {
        for (set, key) in [
            (r.method.is_some(), "method"),
            (r.num_layers.is_some(), "num_layers"),
        ] {
            if set {
                out.push(
                    Finding::error(
                        "recompute::only-with-full",
                        format!("recompute.{key}"),
                        format!("recompute.{key} only applies to granularity `full`"),
                    )
                    .with_help(format!(
                        "remove recompute.{key} or set recompute.granularity: full"
                    )),
                );
            }
        }
        return;
    }
    if r.method.is_none() {
        out.push(
            Finding::error(
                "recompute::full-needs-method",
                "recompute.granularity",
                "full recomputation needs a method",
            )
            .with_help("set recompute.method: uniform (or block) and recompute.num_layers"),
        );
    }
    if let Some(layers) = r.num_layers
        && layers > recipe.model.num_layers
    {
        out.push(
            Finding::error(
                "recompute::too-many-layers",
                "recompute.num_layers",
                format!(
                    "recompute.num_layers {layers} exceeds the model's {} layers",
                    recipe.model.num_layers
                ),
            )
            .with_help(format!("use at most {}", recipe.model.num_layers)),
        );
    }
}

fn check_precision(recipe: &Recipe, out: &mut Vec<Finding>) {
    let p = &recipe.precision;
    if p.fp8 != Fp8::None && p.dtype == Dtype::Fp32 {
        out.push(
            Finding::error(
                "precision::fp8-needs-half",
                "precision.fp8",
                "fp8 runs its GEMMs on top of bf16 or fp16 training, not fp32",
            )
            .with_help("set precision.dtype: bf16 or precision.fp8: none"),
        );
    }
    check_fp8_scaling(recipe, out);
    check_fp8_experts(recipe, out);
    if p.loss_scale.is_some() && p.dtype != Dtype::Fp16 {
        out.push(
            Finding::warning(
                "precision::loss-scale-unused",
                "precision.loss_scale",
                "loss_scale only applies to fp16 training and is ignored",
            )
            .with_help("remove precision.loss_scale or set precision.dtype: fp16"),
        );
    }
}

/// The fp8 scaling knobs: the bf16 layer counts must leave a layer in fp8, and the amax
/// history only means something to delayed scaling (tensorwise scales every tensor from its own
/// amax, as Transformer Engine's current scaling does).
fn check_fp8_scaling(recipe: &Recipe, out: &mut Vec<Finding>) {
    let p = &recipe.precision;
    if p.fp8 == Fp8::None {
        return;
    }
    let layers = u64::from(recipe.model.num_layers);
    let kept = u64::from(p.num_layers_at_start_in_bf16) + u64::from(p.num_layers_at_end_in_bf16);
    if p.first_last_layers_bf16 && kept >= layers {
        out.push(
            Finding::error(
                "precision::no-fp8-layer-left",
                "precision.num_layers_at_start_in_bf16",
                format!(
                    "num_layers_at_start_in_bf16 {} + num_layers_at_end_in_bf16 {} keep all {layers} \
                     layers in bf16: no GEMM would run in fp8",
                    p.num_layers_at_start_in_bf16, p.num_layers_at_end_in_bf16
                ),
            )
            .with_help(format!(
                "keep fewer than {layers} layers in bf16 in all, or set precision.fp8: none"
            )),
        );
    }
    if p.fp8_recipe == Fp8Recipe::Tensorwise {
        let history = [
            (
                p.fp8_amax_history_len != 1,
                "precision.fp8_amax_history_len",
                "fp8_amax_history_len",
            ),
            (
                p.fp8_amax_compute_algo != Fp8AmaxComputeAlgo::MostRecent,
                "precision.fp8_amax_compute_algo",
                "fp8_amax_compute_algo",
            ),
        ];
        for (set, path, key) in history {
            if set {
                out.push(
                    Finding::warning(
                        "precision::amax-history-unused",
                        path,
                        format!(
                            "{key} is ignored with fp8_recipe tensorwise: each tensor is scaled \
                             from its own amax"
                        ),
                    )
                    .with_help(format!("remove {key}, or use fp8_recipe: delayed")),
                );
            }
        }
    }
}

/// `fp8_experts` says something only with fp8 on, an MoE model, and experts whole on one rank
/// (a layout that cuts them keeps them in the model's dtype).
fn check_fp8_experts(recipe: &Recipe, out: &mut Vec<Finding>) {
    if !recipe.precision.fp8_experts {
        return;
    }
    let parallel = &recipe.parallel;
    let degrees = [
        Some(parallel.tensor),
        Some(parallel.pipeline),
        Some(parallel.context),
        Some(parallel.data),
        Some(parallel.expert),
        parallel.expert_tensor,
    ];
    // Degrees resolved from the cluster (`auto`) are known at launch, which says so then.
    let cut = degrees
        .into_iter()
        .flatten()
        .any(|degree| degree.fixed().is_some_and(|d| d > 1));
    let why = if recipe.precision.fp8 == Fp8::None {
        Some(("precision.fp8 is none", "set precision.fp8: hybrid"))
    } else if recipe.model.moe.is_none() {
        Some((
            "the model has no MoE layers",
            "remove precision.fp8_experts",
        ))
    } else if cut {
        Some((
            "fp8 experts run on one rank only (a model cut over ranks routes through the token \
             dispatcher, which keeps the experts in the model's dtype)",
            "run on one GPU (every parallel degree 1), or remove precision.fp8_experts",
        ))
    } else {
        None
    };
    if let Some((why, help)) = why {
        out.push(
            Finding::warning(
                "precision::fp8-experts-unused",
                "precision.fp8_experts",
                format!("fp8_experts is ignored: {why}"),
            )
            .with_help(help),
        );
        return;
    }
    let experts = recipe.model.moe.as_ref().map_or(0, |moe| moe.num_experts);
    if experts > FP8_MAX_EXPERTS {
        out.push(
            Finding::error(
                "precision::fp8-experts-too-many",
                "precision.fp8_experts",
                format!(
                    "fp8 experts run at most {FP8_MAX_EXPERTS} experts on a rank (a tensor map \
                     each among the grouped GEMM's 32 KiB of parameters), this model has \
                     {experts}"
                ),
            )
            .with_help("remove precision.fp8_experts: the experts then run in the model's dtype"),
        );
    }
}

/// The experts one fp8 grouped GEMM takes (`ferrotron-cuda`'s TMA kernels, `grouped_gemm/tma.rs`
/// `MAX_GROUPS`, which the CUDA crate checks again at launch).
const FP8_MAX_EXPERTS: u32 = 252;

/// The multiple of `of` at or above `value` (for a suggestion); saturates instead of wrapping.
fn nearest_multiple(value: u32, of: u32) -> u32 {
    let of = of.max(1);
    value.div_ceil(of).saturating_mul(of).max(of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fixture::{codes, recipe};
    use crate::{Degree, RecomputeMethod, Schedule, WsdDecayStyle};

    fn run(recipe: &Recipe) -> Vec<Finding> {
        crate::rules::fixture::run(check, recipe)
    }

    #[test]
    fn valid_fixture_has_no_findings() {
        assert!(run(&recipe()).is_empty());
    }

    #[test]
    fn batch_and_length() {
        let mut r = recipe();
        r.training.micro_batch_size = Degree::Fixed(3);
        r.training.train_tokens = Some(10);
        assert_eq!(
            codes(&run(&r)),
            [
                "training::global-batch-divisible-by-micro",
                "training::one-length"
            ]
        );
        assert_eq!(
            run(&r)[0].help.as_deref(),
            Some("use a multiple of 3 (e.g. 9), or micro_batch_size: auto")
        );
        r.training.micro_batch_size = Degree::AUTO;
        r.training.train_iters = None;
        assert_eq!(codes(&run(&r)), ["training::tokens-below-one-step"]);
    }

    #[test]
    fn schedule_rules_use_iterations_derived_from_tokens() {
        let mut r = recipe();
        r.training.train_iters = None;
        r.training.train_tokens = Some(8 * 32 * 50);
        r.training.schedule.warmup_iters = 50;
        r.training.optimizer.min_lr = 1.0;
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            ["training::min-lr-above-lr", "schedule::warmup-too-long"]
        );
        assert!(findings[0].is_error());
        assert!(!findings[1].is_error(), "a run ending in warmup only warns");
    }

    #[test]
    fn lower_precision_states_need_the_precision_aware_optimizer_and_it_the_distributed_one() {
        let mut r = recipe();
        r.training.optimizer.exp_avg_sq_dtype = crate::StateDtype::Bf16;
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            ["training::states-need-precision-aware-optimizer"]
        );
        assert_eq!(findings[0].path, "training.optimizer.exp_avg_sq_dtype");
        r.training.optimizer.main_grads_dtype = crate::StateDtype::Bf16;
        let findings = run(&r);
        assert_eq!(
            findings.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            [
                "training.optimizer.main_grads_dtype",
                "training.optimizer.exp_avg_sq_dtype"
            ]
        );
        r.training.optimizer.use_precision_aware_optimizer = true;
        assert_eq!(
            codes(&run(&r)),
            ["training::precision-aware-needs-distributed-optimizer"]
        );
        r.parallel.distributed_optimizer = true;
        assert!(run(&r).is_empty());
    }

    #[test]
    fn the_cpu_offload_needs_the_precision_aware_optimizer_and_the_fraction_the_offload() {
        let mut r = recipe();
        r.training.optimizer.optimizer_offload_fraction = 0.5;
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            ["training::offload-fraction-without-offload"]
        );
        assert_eq!(
            findings[0].path,
            "training.optimizer.optimizer_offload_fraction"
        );
        r.training.optimizer.optimizer_cpu_offload = true;
        assert_eq!(
            codes(&run(&r)),
            ["training::offload-needs-precision-aware-optimizer"]
        );
        r.training.optimizer.use_precision_aware_optimizer = true;
        r.parallel.distributed_optimizer = true;
        assert!(run(&r).is_empty());
    }

    #[test]
    fn recompute_method_only_with_full() {
        let mut r = recipe();
        r.recompute.method = Some(RecomputeMethod::Uniform);
        assert_eq!(codes(&run(&r)), ["recompute::only-with-full"]);
        r.recompute.granularity = RecomputeGranularity::Full;
        r.recompute.num_layers = Some(3);
        assert_eq!(codes(&run(&r)), ["recompute::too-many-layers"]);
        r.recompute.method = None;
        r.recompute.num_layers = None;
        assert_eq!(codes(&run(&r)), ["recompute::full-needs-method"]);
    }

    #[test]
    fn recompute_modules_only_with_selective() {
        let mut r = recipe();
        r.recompute.modules = vec![crate::RecomputeModule::Mlp];
        assert_eq!(codes(&run(&r)), ["recompute::modules-only-with-selective"]);
        r.recompute.granularity = RecomputeGranularity::Selective;
        assert!(run(&r).is_empty());
        assert!(r.recompute.recomputes_mlp());
    }

    #[test]
    fn fp8_layer_counts_must_leave_an_fp8_layer() {
        let mut r = recipe();
        r.precision.fp8 = Fp8::Hybrid;
        r.precision.first_last_layers_bf16 = true;
        // two layers, one at each end in bf16: none left
        let findings = run(&r);
        assert_eq!(codes(&findings), ["precision::no-fp8-layer-left"]);
        assert!(findings[0].is_error());
        r.model.num_layers = 3;
        assert!(run(&r).is_empty());
        assert!(!r.precision.fp8_layer(0, 3) && r.precision.fp8_layer(1, 3));
        assert!(!r.precision.fp8_layer(2, 3));
        // the counts only matter with the switch on, and not at all without fp8
        r.model.num_layers = 2;
        r.precision.first_last_layers_bf16 = false;
        assert!(run(&r).is_empty() && r.precision.fp8_layer(0, 2));
        r.precision.fp8 = Fp8::None;
        r.precision.first_last_layers_bf16 = true;
        assert!(run(&r).is_empty() && !r.precision.fp8_layer(1, 3));
    }

    #[test]
    fn fp8_experts_needs_fp8_an_moe_model_and_whole_experts() {
        let mut r = recipe();
        r.precision.fp8_experts = true;
        let findings = run(&r);
        assert_eq!(codes(&findings), ["precision::fp8-experts-unused"]);
        assert!(findings[0].message.contains("precision.fp8 is none"));
        r.precision.fp8 = Fp8::Hybrid;
        assert!(run(&r)[0].message.contains("no MoE layers"));
        r.model.moe =
            Some(serde_json::from_value(serde_json::json!({"num_experts": 4})).expect("moe"));
        assert!(run(&r).is_empty(), "{:?}", run(&r));
        r.model.moe.as_mut().expect("moe").num_experts = 256;
        let too_many = run(&r);
        assert_eq!(codes(&too_many), ["precision::fp8-experts-too-many"]);
        assert!(too_many[0].is_error());
        r.parallel.expert = Degree::Fixed(2);
        assert!(run(&r)[0].message.contains("one rank only"));
        r.parallel.expert = Degree::Fixed(1);
        r.parallel.pipeline = Degree::Fixed(2);
        assert!(run(&r)[0].message.contains("one rank only"));
        r.precision.fp8_experts = false;
        assert!(run(&r).is_empty());
    }

    #[test]
    fn amax_history_is_a_delayed_scaling_knob() {
        let mut r = recipe();
        r.precision.fp8 = Fp8::E4m3;
        r.precision.fp8_amax_history_len = 16;
        r.precision.fp8_amax_compute_algo = Fp8AmaxComputeAlgo::Max;
        assert!(run(&r).is_empty(), "delayed scaling reads both");
        r.precision.fp8_recipe = Fp8Recipe::Tensorwise;
        let findings = run(&r);
        assert_eq!(
            codes(&findings),
            [
                "precision::amax-history-unused",
                "precision::amax-history-unused"
            ]
        );
        assert_eq!(findings[0].path, "precision.fp8_amax_history_len");
        assert_eq!(findings[1].path, "precision.fp8_amax_compute_algo");
        assert!(!findings[0].is_error());
    }

    #[test]
    fn wsd_needs_its_decay_length() {
        let mut r = recipe();
        r.training.schedule.decay = Decay::Wsd;
        assert_eq!(codes(&run(&r)), ["schedule::wsd-needs-decay-iters"]);
        r.training.schedule.wsd_decay_iters = Some(200);
        assert_eq!(codes(&run(&r)), ["schedule::wsd-too-long"]);
    }

    /// `decay_iters` is Megatron's `--lr-decay-iters`: where decay ends, warmup included, so the
    /// WSD phase must fit between warmup and it, and it must come after warmup.
    #[test]
    fn the_schedule_follows_megatrons_lengths() {
        let mut r = recipe();
        let iterations = r.training.train_iters.expect("iterations");
        r.training.schedule.decay = Decay::Wsd;
        r.training.schedule.warmup_iters = 2;
        r.training.schedule.decay_iters = Some(6);
        r.training.schedule.wsd_decay_iters = Some(4);
        assert!(iterations > 6 && run(&r).is_empty(), "{:?}", run(&r));
        r.training.schedule.wsd_decay_iters = Some(5);
        assert_eq!(codes(&run(&r)), ["schedule::wsd-too-long"]);
        r.training.schedule.wsd_decay_iters = Some(4);
        r.training.schedule.decay_iters = Some(2);
        assert_eq!(
            codes(&run(&r)),
            ["schedule::decay-within-warmup", "schedule::wsd-too-long"]
        );
        r.training.schedule = Schedule {
            warmup_init: r.training.optimizer.lr * 2.0,
            wsd_decay_style: Some(WsdDecayStyle::Linear),
            ..Schedule::default()
        };
        assert_eq!(
            codes(&run(&r)),
            [
                "schedule::warmup-init-above-lr",
                "schedule::wsd-style-without-wsd"
            ]
        );
    }
}
