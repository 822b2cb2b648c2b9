//! End to end against a real Slurm: a single-node cluster on loopback (Debian's slurm-wlm and
//! munge, installed and started by `tools/slurm/ci-cluster.sh`), `recipe submit` of a 2-task CPU
//! job of a tiny data-parallel recipe. The job trains and checkpoints; `scancel --signal=TERM`
//! makes both ranks save and exit 0; `scontrol requeue` runs the job again and it resumes from
//! that checkpoint, then a second SIGTERM stops it further on. Then `recipe sweep --submit` runs
//! a two-member sweep as one job array. One test function, because the phases share one cluster.
//!
//! It is `#[ignore]`d, because it needs root and apt to install Slurm: `tools/test.sh` (and so CI,
//! which runs as root) runs it where it can install it, and there a Slurm that cannot be installed
//! or started fails the test instead of skipping it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{RECIPE, repo, wait_ranks};

/// The cluster for this test; stopped when the test ends, whatever happens.
struct Cluster {
    conf: PathBuf,
}

impl Cluster {
    /// Installs (when missing) and starts the cluster; one that cannot be installed or started
    /// fails the test, which only runs where it was asked for.
    fn start() -> Cluster {
        let script = repo().join("tools/slurm/ci-cluster.sh");
        let output = Command::new("bash")
            .arg(&script)
            .arg("start")
            .output()
            .expect("running tools/slurm/ci-cluster.sh");
        let stderr = String::from_utf8_lossy(&output.stderr);
        match output.status.code() {
            Some(0) => {}
            Some(3) => panic!("Slurm could not be installed or started here: {stderr}"),
            _ => panic!("ci-cluster.sh start failed ({}): {stderr}", output.status),
        }
        let env = Command::new("bash")
            .arg(&script)
            .arg("env")
            .output()
            .expect("ci-cluster.sh env");
        let line = String::from_utf8_lossy(&env.stdout);
        let conf = line
            .trim()
            .strip_prefix("export SLURM_CONF=")
            .unwrap_or_else(|| panic!("ci-cluster.sh env printed {line:?}"));
        Cluster {
            conf: PathBuf::from(conf),
        }
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", &self.conf);
        command
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// `JobState=` of `job` (`PENDING`, `RUNNING`, `COMPLETED`, ...).
    fn state(&self, job: &str) -> String {
        let output = self.run("scontrol", &["show", "job", job, "-o"]);
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .find_map(|field| field.strip_prefix("JobState="))
            .unwrap_or("UNKNOWN")
            .to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("tools/slurm/ci-cluster.sh"))
            .arg("stop")
            .status();
    }
}

/// Polls `check` every 200 ms until it returns `Some`, or fails naming `what` and the job log.
fn wait_for<T>(what: &str, limit: Duration, log: &Path, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        if started.elapsed() > limit {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("timed out after {limit:?} waiting for {what}; job log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The newest checkpoint iteration in `dir` (`iter_0000012` → 12).
fn newest_checkpoint(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_prefix("iter_")?.parse().ok()
        })
        .max()
}

/// "stopped on request at iteration N" lines of the log, in order.
fn stops(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|line| line.strip_prefix("stopped on request at iteration "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
#[ignore = "needs root and apt to install Slurm: tools/test.sh runs it there (cargo nextest run -p ferrotron-cli --test it --run-ignored only -E 'test(/^slurm::/)')"]
fn a_job_trains_stops_on_sigterm_resumes_when_requeued_and_a_sweep_runs_as_an_array() {
    let cluster = Cluster::start();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let work = dir.path();
    let base = std::fs::canonicalize(repo().join("tests/fixtures/parallel/gpt.yaml"))
        .expect("the parallel fixture");
    // Data parallel over the job's 2 tasks; long enough that SIGTERM lands mid-run, checkpoints
    // every 3 iterations.
    std::fs::write(
        work.join("dp2.yaml"),
        format!(
            "extends: {}\nname: slurm-dp2\n\
             cluster: {{ nodes: 1, gpus_per_node: 2, gpu: cpu }}\n\
             training: {{ train_iters: 2000, log_interval: 1 }}\n\
             checkpoint: {{ dir: run/checkpoints, interval: 3, keep_last: 2, resume: auto }}\n\
             logging: {{ jsonl: run/metrics.jsonl }}\n\
             data: {{ cache_dir: cache }}\n",
            base.display()
        ),
    )
    .expect("the recipe");

    let submitted = cluster
        .command(RECIPE)
        .current_dir(work)
        .args([
            "submit",
            "dp2.yaml",
            "--partition",
            "ci",
            "--time",
            "0:10:00",
        ])
        .args(["--log-dir", "logs", "--run-dir", "run"])
        .output()
        .expect("recipe submit");
    assert!(
        submitted.status.success(),
        "recipe submit: {}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let job = String::from_utf8_lossy(&submitted.stdout).trim().to_owned();
    assert!(
        job.parse::<u64>().is_ok(),
        "recipe submit prints the job id, got {job:?}"
    );
    let log = work.join(format!("logs/slurm-dp2-{job}.out"));
    let checkpoints = work.join("run/checkpoints");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // First life: trains on 2 ranks and checkpoints.
    wait_for("a first checkpoint", Duration::from_secs(90), &log, || {
        newest_checkpoint(&checkpoints)
    });
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(work.join("run/manifest.json")).expect("the run manifest"),
    )
    .expect("manifest JSON");
    assert_eq!(manifest["world"]["world_size"], 2, "{manifest}");
    assert_eq!(manifest["world"]["degrees"]["dp"], 2, "{manifest}");
    cluster.run("scancel", &["--signal=TERM", &job]);
    wait_for(
        "the job to end after SIGTERM",
        Duration::from_secs(60),
        &log,
        || (cluster.state(&job) == "COMPLETED").then_some(()),
    );
    let first_stop = wait_for("the stop message", Duration::from_secs(10), &log, || {
        stops(&read_log()).first().copied()
    });
    assert_eq!(
        newest_checkpoint(&checkpoints),
        Some(first_stop),
        "saved where it stopped"
    );

    // Second life: the requeued job resumes from that checkpoint. Slurm holds a requeued job
    // for a while before it is eligible again; let it start now. But not in the same second
    // the first life ended: slurmd revokes the job's credentials with a one-second resolution,
    // and a start within that second is killed as "Job credential revoked".
    std::thread::sleep(Duration::from_secs(2));
    cluster.run("scontrol", &["requeue", &job]);
    cluster.run(
        "scontrol",
        &["update", &format!("JobId={job}"), "StartTime=now"],
    );
    let resumed = format!("at iteration {first_stop} ");
    wait_for(
        "the requeued job to resume",
        Duration::from_secs(60),
        &log,
        || {
            read_log()
                .lines()
                .any(|l| l.contains("resumed from") && l.contains(&resumed))
                .then_some(())
        },
    );
    wait_for(
        "a checkpoint after the resume",
        Duration::from_secs(60),
        &log,
        || newest_checkpoint(&checkpoints).filter(|&n| n > first_stop),
    );
    cluster.run("scancel", &["--signal=TERM", &job]);
    wait_for(
        "the requeued job to end",
        Duration::from_secs(60),
        &log,
        || (cluster.state(&job) == "COMPLETED").then_some(()),
    );
    let all_stops = wait_for(
        "the second stop message",
        Duration::from_secs(10),
        &log,
        || {
            let all = stops(&read_log());
            (all.len() == 2).then_some(all)
        },
    );
    assert!(all_stops[1] > first_stop, "{all_stops:?}");
    let text = read_log();
    assert!(text.contains(&format!("job {job} (restart 0)")), "{text}");
    assert!(text.contains(&format!("job {job} (restart 1)")), "{text}");

    // The metrics continue where the first life stopped: every step once, in order.
    let metrics = std::fs::read_to_string(work.join("run/metrics.jsonl")).expect("metrics");
    let steps: Vec<u64> = metrics
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["kind"] == "train")
        .filter_map(|v| v["step"].as_u64())
        .collect();
    let expected: Vec<u64> = (1..=all_stops[1]).collect();
    assert_eq!(steps, expected);
    let manifest = std::fs::read_to_string(work.join("run/manifest.json")).expect("manifest");
    assert!(manifest.contains("\"stopped\""), "{manifest}");

    sweep_as_job_array(&cluster, work, &base);
}

/// `recipe sweep --submit`: members of 1 and 2 ranks as one array; both finish.
fn sweep_as_job_array(cluster: &Cluster, work: &Path, base: &Path) {
    let sweep_file = work.join("arr.yaml");
    std::fs::write(
        &sweep_file,
        format!(
            "sweep:\n  name: slurm-arr\n  base: {}\n  \
             set: {{ training.train_iters: 4, cluster.nodes: 1, cluster.gpu: cpu, data.cache_dir: {} }}\n  \
             grid: {{ cluster.gpus_per_node: [1, 2] }}\n",
            base.display(),
            work.join("cache").display()
        ),
    )
    .expect("the sweep file");
    let out = work.join("sweep");
    let submitted = cluster
        .command(RECIPE)
        .current_dir(work)
        .args([
            "sweep",
            "arr.yaml",
            "--submit",
            "--partition",
            "ci",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("recipe sweep --submit");
    let stdout = String::from_utf8_lossy(&submitted.stdout).into_owned();
    assert!(
        submitted.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let job = stdout.lines().last().unwrap_or_default().trim().to_owned();
    assert!(
        job.parse::<u64>().is_ok(),
        "the job id comes last: {stdout}"
    );
    let script = std::fs::read_to_string(out.join("sweep.sbatch")).expect("the array script");
    assert!(script.contains("#SBATCH --array=0-1\n"), "{script}");
    let log = out.join(format!("logs/slurm-arr-{job}_1.out"));
    let members = wait_for(
        "both members to finish",
        Duration::from_secs(120),
        &log,
        || {
            let finished: Vec<String> = std::fs::read_dir(&out)
                .ok()?
                .filter_map(|entry| {
                    let dir = entry.ok()?.path();
                    let manifest = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
                    let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
                    (manifest["status"] == "finished")
                        .then(|| format!("{} ranks", manifest["world"]["world_size"]))
                })
                .collect();
            (finished.len() == 2).then_some(finished)
        },
    );
    let mut members = members;
    members.sort();
    assert_eq!(members, ["1 ranks", "2 ranks"]);
}

/// `recipe submit --dry-run` needs no Slurm: the script follows the plan and the flags.
#[test]
fn submit_dry_run_prints_the_script_of_the_plan() {
    let recipe = repo().join("tests/fixtures/parallel/gpt.yaml");
    let output = Command::new(RECIPE)
        .arg("submit")
        .arg(&recipe)
        .args([
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--set",
            "parallel.tensor=2",
        ])
        .args([
            "--partition",
            "gpu",
            "--time",
            "1:00:00",
            "--account",
            "proj",
        ])
        .args([
            "--sbatch-arg=--constraint=h100",
            "--run-arg=--exit-interval=50",
        ])
        .arg("--dry-run")
        .output()
        .expect("recipe submit --dry-run");
    let script = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "#SBATCH --job-name=parallel-gpt\n",
        "#SBATCH --nodes=2\n",
        "#SBATCH --ntasks-per-node=4\n",
        "#SBATCH --partition=gpu\n",
        "#SBATCH --time=1:00:00\n",
        "#SBATCH --account=proj\n",
        "#SBATCH --signal=TERM@120\n",
        "#SBATCH --requeue\n",
        "#SBATCH --open-mode=append\n",
        "#SBATCH --output=logs/%x-%j.out\n",
        "#SBATCH --constraint=h100\n",
        "# 8 ranks = 2 node(s) × 4 task(s); tp 2 pp 1 cp 1 ep 1 dp 4.\n",
    ] {
        assert!(script.contains(line), "missing {line:?} in:\n{script}");
    }
    let srun = script
        .lines()
        .find(|l| l.starts_with("srun "))
        .expect("an srun line");
    assert!(
        srun.starts_with("srun --kill-on-bad-exit=1 --ntasks=8 ")
            && srun.ends_with(&format!(
                " run {} --set parallel.tensor=2 --exit-interval=50",
                recipe.display()
            )),
        "{srun}"
    );
    assert!(!script.contains("--gpus-per-node"), "CPU ranks: {script}");
}

#[test]
fn submit_explains_a_missing_sbatch_and_an_impossible_layout() {
    let recipe = repo().join("tests/fixtures/parallel/gpt.yaml");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let no_slurm = Command::new(RECIPE)
        .current_dir(dir.path())
        .env("PATH", "")
        .arg("submit")
        .arg(&recipe)
        .output()
        .expect("recipe submit");
    let stderr = String::from_utf8_lossy(&no_slurm.stderr);
    assert_eq!(no_slurm.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot run sbatch") && stderr.contains("--dry-run"),
        "{stderr}"
    );
    // The script was written (for a look or a manual sbatch) before sbatch was needed.
    assert!(dir.path().join("logs/parallel-gpt.sbatch").is_file());

    let impossible = Command::new(RECIPE)
        .arg("submit")
        .arg(&recipe)
        .args([
            "--gpus-per-node",
            "3",
            "--set",
            "parallel.tensor=2",
            "--dry-run",
        ])
        .output()
        .expect("recipe submit");
    assert_eq!(
        impossible.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&impossible.stderr)
    );
    assert!(
        impossible.stdout.is_empty(),
        "no script for an invalid layout"
    );
}

/// The losses of a metrics file, step by step.
fn losses(path: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["kind"] == "train")
        .filter_map(|v| Some((v["step"].as_u64()?, v["loss"].as_f64()?)))
        .collect()
}

const LAUNCHER_VARS: [&str; 8] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
];

/// Two processes launched torchrun-style (no Slurm needed) train exactly what two thread ranks
/// of one process train: the TCP world reduces in rank order like the thread world.
#[test]
fn a_process_world_trains_bit_for_bit_like_a_thread_world() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let work = dir.path();
    let base = std::fs::canonicalize(repo().join("tests/fixtures/parallel/gpt.yaml"))
        .expect("the parallel fixture");
    std::fs::write(
        work.join("dp2.yaml"),
        format!(
            "extends: {}\nname: tcp-dp2\n\
             cluster: {{ nodes: 1, gpus_per_node: 2, gpu: cpu }}\n\
             data: {{ cache_dir: cache }}\n",
            base.display()
        ),
    )
    .expect("the recipe");
    let run = |name: &str| {
        let mut command = Command::new(RECIPE);
        command
            .current_dir(work)
            .args(["run", "dp2.yaml", "--run-dir", name])
            .args(["--set", &format!("logging.jsonl={name}/metrics.jsonl")])
            .args(["--set", &format!("checkpoint.dir={name}/checkpoints")]);
        for var in LAUNCHER_VARS {
            command.env_remove(var);
        }
        command
    };

    let threads = run("threads").output().expect("the thread world");
    assert!(
        threads.status.success(),
        "{}",
        String::from_utf8_lossy(&threads.stderr)
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let rank = rank.to_string();
            run("processes")
                .envs([
                    ("RANK", rank.as_str()),
                    ("LOCAL_RANK", rank.as_str()),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("a rank process")
        })
        .collect();
    wait_ranks(ranks);

    let expected = losses(&work.join("threads/metrics.jsonl"));
    assert_eq!(expected.len(), 6, "{expected:?}");
    assert_eq!(losses(&work.join("processes/metrics.jsonl")), expected);
}
