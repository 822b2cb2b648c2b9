//! Learning-rate schedules, exactly as Megatron-LM's `OptimizerParamScheduler` computes them.
//!
//! Megatron constructs its scheduler with `step(0)` and steps it only after each
//! `optimizer.step()`, so iteration `k` (1-based) runs at the rate of position `k − 1`: the first
//! iteration at `warmup_init`, warmup reaching `lr` at iteration `warmup_iters + 1`. Megatron
//! counts positions in samples (iterations × global batch); every ratio it forms is a quotient
//! of two whole sample counts, so counting in iterations (or, with a token budget, in tokens)
//! gives the same f64 rates bit for bit. `tools/megatron_lr_ref.py` runs Megatron's own
//! scheduler and the tests below compare against what it printed.
//!
//! The rate is a pure function of progress, never of hidden state, so a resumed run gets the
//! same rate at the same iteration without saving anything but the iteration.

use ferrotron_recipe::{Decay, Recipe, WsdDecayStyle};

use crate::TrainError;

/// What the schedule's positions count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ScheduleUnit {
    /// Optimizer steps.
    Iterations,
    /// Tokens consumed (Megatron's sample-based schedule, in tokens).
    Tokens,
}

/// A resolved schedule: warmup, then constant / linear / cosine / WSD decay to `min_lr`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LrSchedule {
    pub decay: Decay,
    /// Megatron's `init_lr` (`--lr-warmup-init`): the rate at position 0.
    pub init_lr: f64,
    pub max_lr: f64,
    pub min_lr: f64,
    /// End of warmup, in the schedule's unit.
    pub warmup: f64,
    /// End of decay, counted from the start (Megatron's `lr_decay_steps`), in the schedule's unit.
    pub decay_end: f64,
    /// WSD: length of the final decay phase, in the schedule's unit.
    pub wsd_decay: f64,
    pub wsd_style: WsdDecayStyle,
    pub unit: ScheduleUnit,
}

impl LrSchedule {
    /// The schedule a recipe asks for over `train_iters` optimizer steps, as Megatron's
    /// `get_optimizer_param_scheduler` builds it.
    pub(crate) fn from_recipe(recipe: &Recipe, train_iters: u64) -> Result<Self, TrainError> {
        let optimizer = &recipe.training.optimizer;
        let schedule = &recipe.training.schedule;
        let per_iteration =
            u64::from(recipe.training.global_batch_size) * u64::from(recipe.model.seq_length);
        // A token budget is Megatron's sample-based training over `train_tokens / seq_length`
        // whole samples: decay ends by default at that budget (`lr_decay_samples =
        // train_samples`), not at the whole iterations in it.
        let seq_length = u64::from(recipe.model.seq_length);
        let (unit, scale, default_end) = match recipe.training.train_tokens {
            Some(tokens) => (
                ScheduleUnit::Tokens,
                per_iteration as f64,
                (tokens / seq_length * seq_length) as f64,
            ),
            None => (ScheduleUnit::Iterations, 1.0, train_iters as f64),
        };
        let warmup = schedule.warmup_iters as f64 * scale;
        let decay_end = schedule
            .decay_iters
            .map_or(default_end, |iters| iters as f64 * scale);
        let wsd_decay = match (schedule.decay, schedule.wsd_decay_iters) {
            (Decay::Wsd, None) => {
                return Err(TrainError::Config(
                    "training.schedule.decay: wsd needs training.schedule.wsd_decay_iters".into(),
                ));
            }
            (_, iters) => iters.unwrap_or(0) as f64 * scale,
        };
        // Megatron asserts `lr_warmup_steps < lr_decay_steps`. A run that ends inside its warmup
        // (a smoke test of a real recipe, decay unset) is let through: it never reaches decay.
        if let Some(decay_iters) = schedule.decay_iters
            && decay_iters <= schedule.warmup_iters
        {
            return Err(TrainError::Config(format!(
                "training.schedule.decay_iters ({decay_iters}) must be after warmup ({} iterations)",
                schedule.warmup_iters
            )));
        }
        Ok(LrSchedule {
            decay: schedule.decay,
            init_lr: schedule.warmup_init,
            max_lr: optimizer.lr,
            min_lr: optimizer.min_lr,
            warmup,
            decay_end,
            wsd_decay,
            wsd_style: schedule.wsd_decay_style.unwrap_or_default(),
            unit,
        })
    }

    /// The rate optimizer step `iteration` (1-based) runs at, `consumed_tokens` having been
    /// consumed before it: Megatron's rate at position `iteration − 1`.
    pub(crate) fn lr(&self, iteration: u64, consumed_tokens: u64) -> f64 {
        let position = match self.unit {
            ScheduleUnit::Iterations => iteration.saturating_sub(1) as f64,
            ScheduleUnit::Tokens => consumed_tokens as f64,
        };
        self.lr_at(position)
    }

    /// The rate at `position` in the schedule's unit (Megatron's `get_lr` at `num_steps`).
    pub(crate) fn lr_at(&self, position: f64) -> f64 {
        if self.warmup > 0.0 && position <= self.warmup {
            return self.init_lr + (self.max_lr - self.init_lr) * position / self.warmup;
        }
        if self.decay == Decay::Constant {
            return self.max_lr;
        }
        if position > self.decay_end {
            return self.min_lr;
        }
        let ratio = (position - self.warmup) / (self.decay_end - self.warmup);
        let coefficient = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => 1.0 - ratio,
            Decay::Cosine => 0.5 * ((std::f64::consts::PI * ratio).cos() + 1.0),
            Decay::Wsd => {
                let anneal_start = self.decay_end - self.wsd_decay;
                if position <= anneal_start {
                    1.0
                } else {
                    let ratio = (position - anneal_start) / self.wsd_decay;
                    match self.wsd_style {
                        WsdDecayStyle::Linear => 1.0 - ratio,
                        WsdDecayStyle::Cosine => 0.5 * ((std::f64::consts::PI * ratio).cos() + 1.0),
                        WsdDecayStyle::Exponential => 2.0 * 0.5f64.powf(ratio) - 1.0,
                        WsdDecayStyle::MinusSqrt => 1.0 - ratio.sqrt(),
                    }
                }
            }
        };
        self.min_lr + coefficient * (self.max_lr - self.min_lr)
    }
}

#[cfg(test)]
mod tests;
