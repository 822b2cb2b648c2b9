use ferrotron_recipe::Recipe;
use serde_json::{Value, json};

use super::*;

/// Megatron's rates, printed by `tools/megatron_lr_ref.py` from Megatron's own scheduler.
const MEGATRON: &str = include_str!("megatron_lr.json");

/// The recipe of one reference case: its schedule keys as Ferrotron spells them.
fn recipe_of(case: &Value) -> Recipe {
    let mut schedule = json!({"decay": case["decay"], "warmup_iters": case["warmup_iters"]});
    for key in [
        "warmup_init",
        "decay_iters",
        "wsd_decay_iters",
        "wsd_decay_style",
    ] {
        if let Some(value) = case.get(key) {
            schedule[key] = value.clone();
        }
    }
    let mut training = json!({
        "micro_batch_size": 1,
        "global_batch_size": case["global_batch_size"],
        "optimizer": {"lr": case["lr"], "min_lr": case["min_lr"]},
        "schedule": schedule,
    });
    for key in ["train_iters", "train_tokens"] {
        if let Some(value) = case.get(key) {
            training[key] = value.clone();
        }
    }
    serde_json::from_value(json!({
        "version": ferrotron_recipe::FORMAT_VERSION,
        "name": "lr",
        "model": {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                  "seq_length": case["seq_length"]},
        "training": training,
    }))
    .expect("reference case is a recipe")
}

#[test]
fn every_iteration_runs_at_megatrons_rate() {
    let reference: Value = serde_json::from_str(MEGATRON).expect("reference JSON");
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "the reference covers every style");
    for case in cases {
        let recipe = recipe_of(case);
        let seq_length = u64::from(recipe.model.seq_length);
        let train_iters = recipe
            .training
            .iterations(recipe.model.seq_length)
            .expect("iters");
        let schedule = LrSchedule::from_recipe(&recipe, train_iters).expect("schedule");
        let expected = case["rates"].as_array().expect("rates");
        assert_eq!(expected.len() as u64, train_iters, "{case}");
        let per_iteration = u64::from(recipe.training.global_batch_size) * seq_length;
        for (index, megatron) in expected.iter().enumerate() {
            let iteration = index as u64 + 1;
            let megatron = megatron.as_f64().expect("rate");
            let ours = schedule.lr(iteration, index as u64 * per_iteration);
            assert!(
                (ours - megatron).abs() <= 1e-15 * megatron.abs().max(1e-12),
                "iteration {iteration}: {ours} against Megatron's {megatron}\n{}",
                serde_json::to_string(&recipe.training.schedule).expect("json")
            );
        }
    }
}

fn schedule(decay: Decay, warmup: f64, decay_end: f64, wsd_decay: f64) -> LrSchedule {
    LrSchedule {
        decay,
        init_lr: 0.0,
        max_lr: 1.0,
        min_lr: 0.1,
        warmup,
        decay_end,
        wsd_decay,
        wsd_style: WsdDecayStyle::Linear,
        unit: ScheduleUnit::Iterations,
    }
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-12, "{a} != {b}");
}

#[test]
fn the_first_iteration_runs_at_warmup_init_and_warmup_peaks_one_later() {
    let mut s = schedule(Decay::Cosine, 10.0, 110.0, 0.0);
    close(s.lr(1, 0), 0.0);
    close(s.lr(6, 0), 0.5);
    close(s.lr(11, 0), 1.0);
    s.init_lr = 0.2;
    close(s.lr(1, 0), 0.2);
    close(s.lr(6, 0), 0.6);
}

#[test]
fn decay_ends_at_decay_iters_counted_from_the_start() {
    // Megatron's `--lr-decay-iters 30` with warmup 20: min_lr from position 30 on.
    let s = schedule(Decay::Linear, 20.0, 30.0, 0.0);
    close(s.lr_at(25.0), 0.55);
    close(s.lr_at(30.0), 0.1);
    close(s.lr(31, 0), 0.1);
    close(s.lr(32, 0), 0.1);
}

#[test]
fn wsd_styles_cool_down_over_the_final_phase() {
    let mut s = schedule(Decay::Wsd, 10.0, 110.0, 20.0);
    close(s.lr_at(90.0), 1.0);
    close(s.lr_at(100.0), 0.55);
    s.wsd_style = WsdDecayStyle::Exponential;
    // 2·0.5^0.5 − 1 of the way from min to max.
    close(s.lr_at(100.0), 0.1 + 0.9 * (2.0 * 0.5f64.sqrt() - 1.0));
    close(s.lr_at(110.0), 0.1);
}

#[test]
fn token_budgets_count_tokens_consumed_before_the_step() {
    let mut s = schedule(Decay::Linear, 10.0 * 64.0, 110.0 * 64.0, 0.0);
    s.unit = ScheduleUnit::Tokens;
    close(s.lr(6, 5 * 64), 0.5);
    close(s.lr(61, 60 * 64), 0.55);
}

#[test]
fn decay_iters_within_warmup_is_refused() {
    let mut recipe = recipe_of(&json!({
        "decay": "cosine", "warmup_iters": 20, "decay_iters": 20, "lr": 1e-3, "min_lr": 0.0,
        "global_batch_size": 8, "seq_length": 64, "train_iters": 60,
    }));
    let error = LrSchedule::from_recipe(&recipe, 60).expect_err("decay ends with warmup");
    assert!(error.to_string().contains("after warmup"), "{error}");
    recipe.training.schedule.decay_iters = Some(21);
    LrSchedule::from_recipe(&recipe, 60).expect("one iteration of decay");
}
