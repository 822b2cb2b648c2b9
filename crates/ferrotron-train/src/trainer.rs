//! The training run of one rank: its model, optimizer and resume on the shared set-up
//! ([`crate::setup`]), then the shared loop ([`crate::run_loop::run_rank_loop`]) with the
//! one-rank step. It takes a [`Plan`], never YAML, and reports
//! through telemetry and its return value; printing is the progress display's. Parallel layouts
//! run the same loop with their own step (`crate::parallel`).

use std::path::PathBuf;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_model::GptModel;
use ferrotron_parallel::ParallelOps;
use ferrotron_plan::Plan;

use crate::checkpoint::{CheckpointInfo, CheckpointStore};
use crate::params::NamedTensor;
use crate::resume::{ResumeState, resume_from, save_checkpoint};
use crate::run_loop::{Lead, RankStep, RunOptions, RunSummary, run_rank_loop};
use crate::setup::{RunSetup, use_cpu_threads};
use crate::step::{Microbatch, PendingStats, StepContext, evaluate, train_step_deferred};
use crate::{AdamW, AdamWConfig, TrainError, named_tensors};

/// Train `plan` on this process (one rank) on `device`.
pub fn train<B>(
    plan: &Plan,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunSummary, TrainError>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    train_one_rank::<B>(plan, options, device).map(|(summary, _)| summary)
}

/// [`train`], also returning the final parameters (named by module path).
pub(crate) fn train_one_rank<B>(
    plan: &Plan,
    options: &RunOptions,
    device: &B::Device,
) -> Result<(RunSummary, Vec<NamedTensor>), TrainError>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    if plan.world_size != 1 {
        return Err(TrainError::Config(format!(
            "`train` runs one rank; the plan has {} ranks: use `train_threads` (thread ranks) or \
             `train_rank` (one rank of a process world)",
            plan.world_size
        )));
    }
    use_cpu_threads(plan);
    let setup = RunSetup::new(plan)?;
    let recipe = &setup.recipe;
    let mut model: GptModel<B> =
        crate::init::seeded_model(&setup.model_config(plan)?, recipe.training.seed, device)?;
    let mut optimizer = AdamW::<B::InnerBackend>::new(
        AdamWConfig::from_recipe(&recipe.training.optimizer),
        model.no_weight_decay_params(),
    );
    let mut state = ResumeState::fresh();
    let resumed = setup.resume_source()?;
    if let Some(checkpoint) = &resumed {
        let (loaded, resumed) = resume_from::<B>(
            checkpoint,
            model,
            &mut optimizer,
            &setup.shape,
            recipe,
            device,
        )?;
        model = loaded;
        state = resumed;
    }
    let resumed_from = resumed.as_ref().map(|c| c.dir().to_path_buf());
    let mut rank = SingleRank {
        model: Some(model),
        optimizer,
        device: device.clone(),
    };
    let summary = run_rank_loop(
        plan,
        &setup,
        options,
        state,
        resumed_from.as_deref(),
        Lead::Yes,
        (0, 1),
        &mut rank,
    )?;
    let params = rank
        .model
        .as_ref()
        .map(named_tensors::<B, _>)
        .unwrap_or_default();
    Ok((summary, params))
}

/// The whole model on one rank: the step is [`train_step`].
struct SingleRank<B: AutodiffBackend> {
    /// Taken by value through each step (burn modules are moved through updates).
    model: Option<GptModel<B>>,
    optimizer: AdamW<B::InnerBackend>,
    device: B::Device,
}

impl<B: AutodiffBackend> SingleRank<B> {
    fn model(&self) -> Result<&GptModel<B>, TrainError> {
        self.model
            .as_ref()
            .ok_or_else(|| TrainError::Config("the model was lost in a failed step".into()))
    }
}

impl<B> RankStep for SingleRank<B>
where
    B: AutodiffBackend + ParallelOps,
    B::InnerBackend: ParallelOps,
{
    fn step(
        &mut self,
        microbatches: &[Microbatch],
        context: StepContext,
    ) -> Result<PendingStats, TrainError> {
        let model = self
            .model
            .take()
            .ok_or_else(|| TrainError::Config("the model was lost in a failed step".into()))?;
        let (next, stats) = train_step_deferred(
            model,
            &mut self.optimizer,
            microbatches,
            context,
            &self.device,
        )?;
        self.model = Some(next);
        Ok(stats)
    }

    fn evaluate(&mut self, microbatches: &[Microbatch]) -> Result<f64, TrainError> {
        Ok(evaluate(&self.model()?.valid(), microbatches, &self.device))
    }

    fn save(
        &mut self,
        store: &CheckpointStore,
        info: &CheckpointInfo<'_>,
    ) -> Result<PathBuf, TrainError> {
        save_checkpoint(
            store,
            self.model()?,
            &self.optimizer,
            &info.state,
            info.plan,
            info.recipe,
            info.shape,
        )
    }

    fn any_rank(&self, local: bool) -> Result<bool, TrainError> {
        Ok(local)
    }
}
