//! Running members as child processes of the `recipe` executable, N at a time.
//!
//! A child per member (rather than threads) keeps members isolated: one that aborts, leaks or
//! installs signal handlers cannot take the others down, and each run is exactly what a user
//! gets from `recipe run` on the member recipe. The member directory is the unit of resumption:
//! a member whose manifest says it finished with exit status 0 *for the same recipe file* is
//! skipped on the next invocation.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ferrotron_telemetry::{PlanRecord, RunDetails, RunManifest, RunStatus};

use crate::SweepError;
use crate::resolve::{Member, ValidMember, member_recipe};

/// File names inside a member directory.
pub const RECIPE_FILE: &str = "member.yaml";
pub const LOG_FILE: &str = "run.log";

/// How to run a sweep's members.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// The `recipe` executable (normally `std::env::current_exe()`).
    pub program: PathBuf,
    /// The sweep directory; each member gets `<out>/<member name>/`.
    pub out_dir: PathBuf,
    /// Members running at once (at least 1).
    pub parallel: usize,
    /// Extra arguments for `recipe run` (e.g. `--backend cpu`).
    pub run_args: Vec<String>,
}

/// How a member ended in this invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberStatus {
    /// The recipe or plan was refused; nothing ran.
    Invalid,
    /// Finished in an earlier invocation with the same recipe: not run again.
    Skipped,
    Finished,
    /// Stopped cleanly before the end (signal or exit interval); the next invocation resumes it.
    Stopped,
    /// Non-zero exit status, or killed (`None`).
    Failed(Option<i32>),
}

impl MemberStatus {
    /// The word in results tables.
    pub fn label(&self) -> String {
        match self {
            MemberStatus::Invalid => "invalid".to_owned(),
            MemberStatus::Skipped => "finished (earlier)".to_owned(),
            MemberStatus::Finished => "finished".to_owned(),
            MemberStatus::Stopped => "stopped".to_owned(),
            MemberStatus::Failed(Some(code)) => format!("failed (exit {code})"),
            MemberStatus::Failed(None) => "failed (killed)".to_owned(),
        }
    }
}

/// The directory of `member` under `out_dir`.
pub fn member_dir(out_dir: &Path, member: &Member) -> PathBuf {
    out_dir.join(&member.spec.name)
}

/// Runs every valid member not finished before; `progress` hears one line per member event.
/// Returns one status per member, in member order.
pub fn run_members(
    members: &[Member],
    options: &RunnerOptions,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<MemberStatus>, SweepError> {
    let statuses: Mutex<Vec<Option<Result<MemberStatus, SweepError>>>> =
        Mutex::new(members.iter().map(|_| None).collect());
    let next = AtomicUsize::new(0);
    let total = members.len();
    std::thread::scope(|scope| {
        for _ in 0..options.parallel.clamp(1, total.max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(member) = members.get(i) else { break };
                    let status = run_member(member, options, &|line: &str| {
                        progress(&format!("[{}/{total}] {} {line}", i + 1, member.spec.name));
                    });
                    if let Ok(mut all) = statuses.lock() {
                        all[i] = Some(status);
                    }
                }
            });
        }
    });
    statuses
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .map(|s| s.unwrap_or(Ok(MemberStatus::Failed(None))))
        .collect()
}

fn run_member(
    member: &Member,
    options: &RunnerOptions,
    progress: &dyn Fn(&str),
) -> Result<MemberStatus, SweepError> {
    let Ok(valid) = &member.resolution else {
        return Ok(MemberStatus::Invalid);
    };
    // Absolute, because the member recipe is loaded from inside this directory and relative
    // paths in it would resolve against it a second time.
    let relative_dir = member_dir(&options.out_dir, member);
    let dir = std::path::absolute(&relative_dir).map_err(|source| SweepError::Write {
        path: relative_dir,
        source,
    })?;
    let recipe_path = dir.join(RECIPE_FILE);
    let recipe_text = recipe_yaml(member, valid, &dir)?;
    if already_finished(&dir, &recipe_path, &recipe_text) {
        progress("already finished: skipped");
        return Ok(MemberStatus::Skipped);
    }
    fs::create_dir_all(&dir).map_err(|source| SweepError::Write {
        path: dir.clone(),
        source,
    })?;
    fs::write(&recipe_path, &recipe_text).map_err(|source| SweepError::Write {
        path: recipe_path.clone(),
        source,
    })?;
    let recipe_json = to_json("the member recipe", &member_recipe(member, valid, &dir))?;
    let details = RunDetails {
        seed: valid.recipe.training.seed,
        data_cache_keys: None,
        hosts: Vec::new(),
        // the member's own `recipe run` records its environment in its manifest
        environment: Vec::new(),
    };
    let manifest = RunManifest::start(&dir, &recipe_json, PlanRecord::of(&valid.plan)?, details)?;

    let log_path = dir.join(LOG_FILE);
    let log = fs::File::create(&log_path).map_err(|source| SweepError::Write {
        path: log_path.clone(),
        source,
    })?;
    let log_err = log.try_clone().map_err(|source| SweepError::Write {
        path: log_path.clone(),
        source,
    })?;
    progress("running");
    let started = Instant::now();
    let exit = Command::new(&options.program)
        .arg("run")
        .arg(&recipe_path)
        .arg("--run-dir")
        .arg(&dir)
        .args(&options.run_args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .status()
        .map_err(|source| SweepError::Spawn {
            program: options.program.clone(),
            member: member.spec.name.clone(),
            source,
        })?;
    let code = exit.code();

    // The child may have written its own, richer manifest; keep it and add what we saw.
    let mut manifest = RunManifest::read(&dir).unwrap_or(manifest);
    let status = match (manifest.status, code) {
        (RunStatus::Running, Some(code)) => RunStatus::from_exit_code(code),
        (recorded, Some(0)) => recorded,
        (_, _) => RunStatus::Failed,
    };
    manifest.finish(status, code.unwrap_or(-1))?;
    let outcome = match (status, code) {
        (RunStatus::Finished, _) => MemberStatus::Finished,
        (RunStatus::Stopped, _) => MemberStatus::Stopped,
        (_, code) => MemberStatus::Failed(code),
    };
    progress(&format!(
        "{} in {:.1}s (log: {})",
        outcome.label(),
        started.elapsed().as_secs_f64(),
        log_path.display()
    ));
    Ok(outcome)
}

/// The member recipe file's text.
pub fn recipe_yaml(member: &Member, valid: &ValidMember, dir: &Path) -> Result<String, SweepError> {
    let recipe = member_recipe(member, valid, dir);
    let body = serde_saphyr::to_string(&recipe).map_err(|e| SweepError::Serialize {
        what: format!("the recipe of {}", member.spec.name),
        message: e.to_string(),
    })?;
    Ok(format!(
        "# Member {} of a sweep, resolved (written by `recipe sweep`; hash {}).\n{body}",
        member.spec.name, valid.hash
    ))
}

pub(crate) fn already_finished(dir: &Path, recipe_path: &Path, recipe_text: &str) -> bool {
    let same_recipe = fs::read_to_string(recipe_path).is_ok_and(|text| text == recipe_text);
    same_recipe && RunManifest::read(dir).is_ok_and(|m| m.succeeded())
}

fn to_json(what: &str, value: &impl serde::Serialize) -> Result<serde_json::Value, SweepError> {
    serde_json::to_value(value).map_err(|e| SweepError::Serialize {
        what: what.to_owned(),
        message: e.to_string(),
    })
}
