//! Learning-rate schedules, as Megatron-Core's `OptimizerParamScheduler` computes them.
//!
//! The rate is a pure function of progress (iterations, or tokens when the recipe budgets
//! tokens), never of hidden state, so a resumed run gets the same rate at the same iteration
//! without saving anything but the iteration.

use ferrotron_recipe::{Decay, Recipe};

use crate::TrainError;

/// What the schedule's positions count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ScheduleUnit {
    /// Optimizer steps.
    Iterations,
    /// Tokens consumed; positions are converted from iterations at this many tokens per step.
    Tokens { per_iteration: u64 },
}

/// A resolved schedule: warmup, then constant / linear / cosine / WSD decay to `min_lr`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LrSchedule {
    pub decay: Decay,
    pub max_lr: f64,
    pub min_lr: f64,
    /// End of warmup, in the schedule's unit.
    pub warmup: f64,
    /// End of decay (warmup included, as Megatron's `lr_decay_steps`), in the schedule's unit.
    pub decay_end: f64,
    /// WSD: length of the final decay phase, in the schedule's unit.
    pub wsd_decay: f64,
    pub unit: ScheduleUnit,
}

impl LrSchedule {
    /// The schedule a recipe asks for over `train_iters` optimizer steps.
    pub(crate) fn from_recipe(recipe: &Recipe, train_iters: u64) -> Result<Self, TrainError> {
        let optimizer = &recipe.training.optimizer;
        let schedule = &recipe.training.schedule;
        let unit = match recipe.training.train_tokens {
            Some(_) => ScheduleUnit::Tokens {
                per_iteration: u64::from(recipe.training.global_batch_size)
                    * u64::from(recipe.model.seq_length),
            },
            None => ScheduleUnit::Iterations,
        };
        let warmup_iters = schedule.warmup_iters;
        let decay_iters = schedule
            .decay_iters
            .unwrap_or_else(|| train_iters.saturating_sub(warmup_iters).max(1));
        let wsd_decay_iters = match (recipe.training.schedule.decay, schedule.wsd_decay_iters) {
            (Decay::Wsd, None) => {
                return Err(TrainError::Config(
                    "training.schedule.decay: wsd needs training.schedule.wsd_decay_iters".into(),
                ));
            }
            (_, iters) => iters.unwrap_or(0),
        };
        if wsd_decay_iters > decay_iters {
            return Err(TrainError::Config(format!(
                "training.schedule.wsd_decay_iters ({wsd_decay_iters}) exceeds the decay length ({decay_iters})"
            )));
        }
        let scale = match unit {
            ScheduleUnit::Iterations => 1.0,
            ScheduleUnit::Tokens { per_iteration } => per_iteration as f64,
        };
        Ok(LrSchedule {
            decay: schedule.decay,
            max_lr: optimizer.lr,
            min_lr: optimizer.min_lr,
            warmup: warmup_iters as f64 * scale,
            decay_end: (warmup_iters + decay_iters) as f64 * scale,
            wsd_decay: wsd_decay_iters as f64 * scale,
            unit,
        })
    }

    /// The rate for optimizer step `iteration` (1-based: the first step is iteration 1), when
    /// `tokens` tokens will have been consumed after it.
    pub(crate) fn lr(&self, iteration: u64, tokens: u64) -> f64 {
        let position = match self.unit {
            ScheduleUnit::Iterations => iteration as f64,
            ScheduleUnit::Tokens { .. } => tokens as f64,
        };
        self.lr_at(position)
    }

    /// The rate at `position` in the schedule's unit.
    pub(crate) fn lr_at(&self, position: f64) -> f64 {
        if self.warmup > 0.0 && position <= self.warmup {
            return self.max_lr * position / self.warmup;
        }
        if self.decay == Decay::Constant {
            return self.max_lr;
        }
        if position > self.decay_end {
            return self.min_lr;
        }
        let span = (self.decay_end - self.warmup).max(f64::MIN_POSITIVE);
        let ratio = ((position - self.warmup) / span).clamp(0.0, 1.0);
        let coefficient = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => 1.0 - ratio,
            Decay::Cosine => 0.5 * ((std::f64::consts::PI * ratio).cos() + 1.0),
            Decay::Wsd => {
                let stable_end = self.decay_end - self.wsd_decay;
                if position <= stable_end || self.wsd_decay <= 0.0 {
                    1.0
                } else {
                    // Linear cool-down over the final phase (Megatron's `--lr-wsd-decay-style linear`).
                    1.0 - (position - stable_end) / self.wsd_decay
                }
            }
        };
        self.min_lr + coefficient * (self.max_lr - self.min_lr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: Decay, warmup: f64, decay_end: f64, wsd_decay: f64) -> LrSchedule {
        LrSchedule {
            decay,
            max_lr: 1.0,
            min_lr: 0.1,
            warmup,
            decay_end,
            wsd_decay,
            unit: ScheduleUnit::Iterations,
        }
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} != {b}");
    }

    #[test]
    fn warmup_is_linear_from_zero() {
        let s = schedule(Decay::Cosine, 10.0, 110.0, 0.0);
        close(s.lr_at(1.0), 0.1);
        close(s.lr_at(5.0), 0.5);
        close(s.lr_at(10.0), 1.0);
    }

    #[test]
    fn constant_stays_at_max_after_warmup() {
        let s = schedule(Decay::Constant, 10.0, 110.0, 0.0);
        close(s.lr_at(11.0), 1.0);
        close(s.lr_at(1000.0), 1.0);
    }

    #[test]
    fn linear_decays_to_min() {
        let s = schedule(Decay::Linear, 10.0, 110.0, 0.0);
        // halfway through the 100-step decay: min + 0.5·(max − min) = 0.1 + 0.45
        close(s.lr_at(60.0), 0.55);
        close(s.lr_at(110.0), 0.1);
        close(s.lr_at(500.0), 0.1);
    }

    #[test]
    fn cosine_matches_closed_form() {
        let s = schedule(Decay::Cosine, 0.0, 100.0, 0.0);
        close(s.lr_at(0.0), 1.0);
        // ratio 0.25: 0.5·(cos(π/4) + 1) = 0.853553…; 0.1 + 0.9·that
        close(
            s.lr_at(25.0),
            0.1 + 0.9 * 0.5 * ((std::f64::consts::PI / 4.0).cos() + 1.0),
        );
        close(s.lr_at(50.0), 0.55);
        close(s.lr_at(100.0), 0.1);
    }

    #[test]
    fn wsd_is_stable_then_cools_down() {
        let s = schedule(Decay::Wsd, 10.0, 110.0, 20.0);
        close(s.lr_at(50.0), 1.0);
        close(s.lr_at(90.0), 1.0);
        close(s.lr_at(100.0), 0.55);
        close(s.lr_at(110.0), 0.1);
    }

    #[test]
    fn token_unit_scales_positions() {
        let mut s = schedule(Decay::Linear, 10.0 * 64.0, 110.0 * 64.0, 0.0);
        s.unit = ScheduleUnit::Tokens { per_iteration: 64 };
        close(s.lr(5, 5 * 64), 0.5);
        close(s.lr(60, 60 * 64), 0.55);
    }
}
