//! Run provenance: `manifest.json` in every run directory says what ran, from which code, where,
//! when, and how it ended.
//!
//! Weeks later the metrics alone cannot answer "which recipe, which commit, did it finish?"; the
//! manifest can. It is written atomically (temporary file, fsync, rename) at start with status
//! `running` and rewritten at the end, so a reader never sees half a file and a run that died
//! leaves `running` behind, which is itself the answer. The sweep reads it to skip members that
//! already finished with exit status 0.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferrotron_plan::Plan;
use ferrotron_recipe::{Cluster, Degrees, GpuKind, canonical_hash};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::TelemetryError;

/// File name of the manifest inside a run directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Version of the manifest layout, bumped when fields change meaning.
pub const MANIFEST_VERSION: u32 = 1;

/// How a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Started and not (yet) finished: a crashed run stays here.
    Running,
    /// Trained to the end.
    Finished,
    /// Stopped cleanly before the end (signal, exit interval), resumable: not finished.
    Stopped,
    /// Ended with a non-zero exit status or was killed.
    Failed,
}

impl RunStatus {
    /// What an exit code says when the process itself recorded nothing: 0 finished, else failed.
    pub fn from_exit_code(exit_code: i32) -> RunStatus {
        if exit_code == 0 {
            RunStatus::Finished
        } else {
            RunStatus::Failed
        }
    }
}

/// The program that ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramInfo {
    pub name: String,
    pub version: String,
    /// `git rev-parse HEAD` of the checkout the executable was built in, or `"unknown"`.
    pub git_commit: String,
}

/// What the manifest records of the plan: the fields it reads named here ([`PlanRecord::of`]),
/// so a field the planner renames is a compile error rather than a silent `null`, and the whole
/// plan beside them as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRecord {
    /// The plan's own `plan_hash`.
    pub plan_hash: String,
    pub world: WorldLayout,
    /// The GPU kind the plan assumes (`cpu` for CPU ranks).
    pub gpu: GpuKind,
    /// The whole plan, stored as it is and never read back by telemetry.
    pub plan: Value,
}

impl PlanRecord {
    pub fn of(plan: &Plan) -> Result<Self, TelemetryError> {
        Ok(PlanRecord {
            plan_hash: plan.plan_hash.clone(),
            world: WorldLayout {
                world_size: plan.world_size,
                degrees: plan.degrees,
                cluster: plan.cluster.clone(),
            },
            gpu: plan.hardware.gpu,
            plan: serde_json::to_value(plan)?,
        })
    }
}

/// The layout the run was planned for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorldLayout {
    pub world_size: u32,
    /// The plan's resolved degrees.
    pub degrees: Degrees,
    /// Nodes, GPUs per node and GPU kind of the plan.
    pub cluster: Cluster,
}

/// What the caller knows that the recipe and plan do not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunDetails {
    pub seed: u64,
    /// Cache keys of the data indices the run reads, when the data layer reports them.
    pub data_cache_keys: Option<Vec<String>>,
    /// The hosts of a multi-node run (a launcher's node list); empty means this host alone.
    pub hosts: Vec<String>,
    /// The backend's debugging and location environment variables that are set (name, value):
    /// what the recipe does not say about how the run executed.
    pub environment: Vec<(String, String)>,
}

/// The provenance record of one run directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    pub format_version: u32,
    pub status: RunStatus,
    /// Exit status of the process; `None` while running.
    pub exit_code: Option<i32>,
    /// What ended a failed run (the error or panic message, as printed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub program: ProgramInfo,
    /// The recipe's identity (`ferrotron_recipe::canonical_hash`), the same hash every checkpoint
    /// of the run records.
    pub recipe_hash: String,
    /// The plan's own `plan_hash`.
    pub plan_hash: String,
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_cache_keys: Option<Vec<String>>,
    pub world: WorldLayout,
    pub hosts: Vec<String>,
    /// The backend's environment variables that were set (`RunDetails::environment`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub environment: std::collections::BTreeMap<String, String>,
    pub gpu_kinds: Vec<GpuKind>,
    /// RFC 3339, UTC.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    pub recipe: Value,
    pub plan: Value,
    #[serde(skip)]
    path: PathBuf,
}

impl RunManifest {
    /// Records the start of a run in `run_dir/manifest.json` (status `running`), creating the
    /// directory if needed.
    pub fn start(
        run_dir: &Path,
        recipe: &Value,
        plan: PlanRecord,
        details: RunDetails,
    ) -> Result<RunManifest, TelemetryError> {
        let manifest = RunManifest {
            format_version: MANIFEST_VERSION,
            status: RunStatus::Running,
            exit_code: None,
            error: None,
            program: ProgramInfo::current(),
            recipe_hash: canonical_hash(recipe),
            plan_hash: plan.plan_hash,
            seed: details.seed,
            data_cache_keys: details.data_cache_keys,
            world: plan.world,
            hosts: if details.hosts.is_empty() {
                vec![host_name()]
            } else {
                details.hosts
            },
            environment: details.environment.into_iter().collect(),
            gpu_kinds: vec![plan.gpu],
            started_at: now_rfc3339(),
            finished_at: None,
            recipe: recipe.clone(),
            plan: plan.plan,
            path: run_dir.join(MANIFEST_FILE),
        };
        fs::create_dir_all(run_dir).map_err(|source| TelemetryError::ManifestWrite {
            path: manifest.path.clone(),
            source,
        })?;
        manifest.write()?;
        Ok(manifest)
    }

    /// Reads `run_dir/manifest.json`.
    pub fn read(run_dir: &Path) -> Result<RunManifest, TelemetryError> {
        let path = run_dir.join(MANIFEST_FILE);
        let text = fs::read_to_string(&path).map_err(|source| TelemetryError::ManifestRead {
            path: path.clone(),
            source,
        })?;
        let mut manifest: RunManifest =
            serde_json::from_str(&text).map_err(|source| TelemetryError::ManifestParse {
                path: path.clone(),
                source,
            })?;
        manifest.path = path;
        Ok(manifest)
    }

    /// Records the data indices the run reads once the data layer has built them (after the
    /// manifest was started, so a run that fails on its data still leaves a manifest).
    pub fn record_data_cache_keys(&mut self, keys: Vec<String>) -> Result<(), TelemetryError> {
        self.data_cache_keys = Some(keys);
        self.write()
    }

    /// Records the end of the run: its status, the exit code and the end time.
    pub fn finish(&mut self, status: RunStatus, exit_code: i32) -> Result<(), TelemetryError> {
        self.status = status;
        self.exit_code = Some(exit_code);
        self.finished_at = Some(now_rfc3339());
        self.write()
    }

    /// Records a failed run: status `failed`, what failed it, the exit code and the end time.
    pub fn fail(&mut self, error: &str, exit_code: i32) -> Result<(), TelemetryError> {
        self.error = Some(error.to_owned());
        self.finish(RunStatus::Failed, exit_code)
    }

    /// True when the run trained to the end with exit status 0: there is nothing left to do.
    pub fn succeeded(&self) -> bool {
        self.status == RunStatus::Finished && self.exit_code == Some(0)
    }

    /// Where this manifest lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self) -> Result<(), TelemetryError> {
        let err = |source| TelemetryError::ManifestWrite {
            path: self.path.clone(),
            source,
        };
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        let tmp = self
            .path
            .with_extension(format!("json.tmp-{}", std::process::id()));
        let mut file = fs::File::create(&tmp).map_err(err)?;
        file.write_all(text.as_bytes()).map_err(err)?;
        file.sync_all().map_err(err)?;
        drop(file);
        fs::rename(&tmp, &self.path).map_err(err)
    }
}

impl ProgramInfo {
    /// This executable: its name, the crate version and the git commit of its checkout.
    pub fn current() -> ProgramInfo {
        let exe = std::env::current_exe().ok();
        let name = exe
            .as_deref()
            .and_then(Path::file_stem)
            .map_or_else(|| "recipe".to_owned(), |s| s.to_string_lossy().into_owned());
        let git_commit = exe
            .as_deref()
            .and_then(Path::parent)
            .and_then(git_head)
            .or_else(|| std::env::current_dir().ok().as_deref().and_then(git_head))
            .unwrap_or_else(|| "unknown".to_owned());
        ProgramInfo {
            name,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            git_commit,
        }
    }
}

/// `git rev-parse HEAD` run in `dir`; `None` outside a checkout or without git.
fn git_head(dir: &Path) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && commit.len() >= 40).then_some(commit)
}

fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_else(|_| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan() -> PlanRecord {
        let degrees = Degrees {
            tp: 2,
            etp: 2,
            ..Degrees::ONE
        };
        let cluster = Cluster {
            nodes: 1,
            gpus_per_node: 2,
            gpu: GpuKind::H100,
        };
        PlanRecord {
            plan_hash: "abc123".to_owned(),
            world: WorldLayout {
                world_size: 2,
                degrees,
                cluster: cluster.clone(),
            },
            gpu: GpuKind::H100,
            plan: json!({"world_size": 2, "cluster": cluster, "plan_hash": "abc123"}),
        }
    }

    #[test]
    fn a_multi_node_run_records_every_node() {
        let dir = tempfile::tempdir().unwrap();
        let details = RunDetails {
            seed: 1,
            data_cache_keys: None,
            hosts: vec!["node01".into(), "node02".into()],
            environment: Vec::new(),
        };
        RunManifest::start(dir.path(), &json!({"name": "t"}), plan(), details).unwrap();
        let on_disk = RunManifest::read(dir.path()).unwrap();
        assert_eq!(
            on_disk.hosts,
            vec!["node01".to_owned(), "node02".to_owned()]
        );
    }

    #[test]
    fn the_backends_environment_is_recorded_and_absent_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let details = RunDetails {
            seed: 1,
            data_cache_keys: None,
            hosts: Vec::new(),
            environment: vec![("FERROTRON_OP_TIMING".into(), "/tmp/ops.md".into())],
        };
        RunManifest::start(dir.path(), &json!({"name": "t"}), plan(), details).unwrap();
        let on_disk = RunManifest::read(dir.path()).unwrap();
        assert_eq!(on_disk.environment["FERROTRON_OP_TIMING"], "/tmp/ops.md");

        let quiet = tempfile::tempdir().unwrap();
        let details = RunDetails {
            seed: 1,
            data_cache_keys: None,
            hosts: Vec::new(),
            environment: Vec::new(),
        };
        RunManifest::start(quiet.path(), &json!({"name": "t"}), plan(), details).unwrap();
        let text = std::fs::read_to_string(quiet.path().join("manifest.json")).unwrap();
        assert!(!text.contains("environment"), "{text}");
    }

    #[test]
    fn start_writes_running_and_finish_records_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        let recipe = json!({"name": "t", "training": {"seed": 7}});
        let details = RunDetails {
            seed: 7,
            data_cache_keys: Some(vec!["k1".into()]),
            hosts: Vec::new(),
            environment: Vec::new(),
        };
        let mut manifest = RunManifest::start(&run_dir, &recipe, plan(), details).unwrap();
        let on_disk = RunManifest::read(&run_dir).unwrap();
        assert_eq!(on_disk.status, RunStatus::Running);
        assert_eq!(on_disk.exit_code, None);
        assert!(!on_disk.succeeded());
        assert_eq!(on_disk.plan_hash, "abc123");
        assert_eq!(on_disk.recipe_hash, canonical_hash(&recipe));
        assert_eq!(on_disk.world.world_size, 2);
        assert_eq!(on_disk.world.degrees.etp, 2);
        assert_eq!(on_disk.world.cluster.gpus_per_node, 2);
        assert_eq!(on_disk.gpu_kinds, vec![GpuKind::H100]);
        // The layout is written under the names scripts read.
        let text = fs::read_to_string(run_dir.join(MANIFEST_FILE)).unwrap();
        let written: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(written["world"]["degrees"]["tp"], 2);
        assert_eq!(written["world"]["cluster"]["gpu"], "h100");
        assert_eq!(written["gpu_kinds"], json!(["h100"]));
        assert_eq!(on_disk.seed, 7);
        assert_eq!(on_disk.data_cache_keys, Some(vec!["k1".to_owned()]));
        assert!(on_disk.started_at.ends_with('Z'), "{}", on_disk.started_at);
        manifest
            .record_data_cache_keys(vec!["k2-GPTDataset".into()])
            .unwrap();
        assert_eq!(
            RunManifest::read(&run_dir).unwrap().data_cache_keys,
            Some(vec!["k2-GPTDataset".to_owned()])
        );
        assert!(!on_disk.hosts[0].is_empty());

        manifest.finish(RunStatus::Finished, 0).unwrap();
        let done = RunManifest::read(&run_dir).unwrap();
        assert!(done.succeeded());
        assert!(done.finished_at.is_some());
        // No temporary file is left next to it.
        let names: Vec<_> = fs::read_dir(&run_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(MANIFEST_FILE)]);
    }

    #[test]
    fn a_non_zero_exit_is_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let mut manifest =
            RunManifest::start(dir.path(), &json!({}), plan(), RunDetails::default()).unwrap();
        manifest.finish(RunStatus::from_exit_code(3), 3).unwrap();
        let read = RunManifest::read(dir.path()).unwrap();
        assert_eq!(read.status, RunStatus::Failed);
        assert_eq!(read.exit_code, Some(3));
        assert!(!read.succeeded());
        manifest.finish(RunStatus::Stopped, 0).unwrap();
        assert!(!RunManifest::read(dir.path()).unwrap().succeeded());
        // The plan's own hash is recorded.
        assert_eq!(read.plan_hash, "abc123");
    }

    #[test]
    fn reading_a_missing_or_broken_manifest_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = RunManifest::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("manifest.json"), "{err}");
        fs::write(dir.path().join(MANIFEST_FILE), "{").unwrap();
        let err = RunManifest::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not valid"), "{err}");
    }

    #[test]
    fn the_program_has_a_version_and_a_commit_or_unknown() {
        let program = ProgramInfo::current();
        assert_eq!(program.version, env!("CARGO_PKG_VERSION"));
        assert!(
            program.git_commit == "unknown"
                || (program.git_commit.len() == 40
                    && program.git_commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{}",
            program.git_commit
        );
    }
}
