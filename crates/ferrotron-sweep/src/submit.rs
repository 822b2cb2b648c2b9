//! `recipe sweep --submit`: the members as one Slurm job array instead of local processes.
//!
//! A member becomes an array index whose task runs exactly what the local runner would run
//! (`recipe run <member>/member.yaml --run-dir <member>`), so the member directories, the
//! provenance and the skip-on-rerun rule are the same whichever way a sweep runs. One array
//! rather than a job per member keeps a sweep one line in `squeue` and one `scancel`, and
//! `--array=…%N` caps how much of the cluster it takes at once. The array's shape is the
//! smallest that fits every member; a member with fewer ranks runs `srun --ntasks` of its own.

use std::fs;
use std::path::{Path, PathBuf};

use ferrotron_launch::{ArrayTask, JobShape, SbatchScript, SlurmOptions, TaskCommand};

use crate::SweepError;
use crate::resolve::Member;
use crate::runner::{RECIPE_FILE, already_finished, member_dir, recipe_yaml};

/// The array script and which members it runs.
#[derive(Debug, Clone)]
pub struct ArraySubmission {
    pub script: SbatchScript,
    /// Names of the members in the array, by array index.
    pub members: Vec<String>,
    /// Members left out because they finished in an earlier run.
    pub finished: Vec<String>,
    /// Members left out because they are invalid.
    pub invalid: Vec<String>,
}

/// Writes every valid, unfinished member's directory and recipe under `out_dir` and renders one
/// job array over them; `None` when no member is left to run.
pub fn prepare_array(
    sweep_name: &str,
    members: &[Member],
    out_dir: &Path,
    program: &Path,
    run_args: &[String],
    options: &SlurmOptions,
) -> Result<Option<ArraySubmission>, SweepError> {
    let mut tasks = Vec::new();
    let mut shapes = Vec::new();
    let (mut finished, mut invalid, mut names) = (Vec::new(), Vec::new(), Vec::new());
    for member in members {
        let Ok(valid) = &member.resolution else {
            invalid.push(member.spec.name.clone());
            continue;
        };
        let relative = member_dir(out_dir, member);
        let dir = std::path::absolute(&relative).map_err(|source| SweepError::Write {
            path: relative,
            source,
        })?;
        let recipe_path = dir.join(RECIPE_FILE);
        let recipe_text = recipe_yaml(member, valid, &dir)?;
        if already_finished(&dir, &recipe_path, &recipe_text) {
            finished.push(member.spec.name.clone());
            continue;
        }
        write(&dir, None)?;
        write(&recipe_path, Some(&recipe_text))?;
        let shape = JobShape::of_plan(&valid.plan, options);
        shapes.push(shape);
        let mut args = vec![
            "run".to_owned(),
            recipe_path.display().to_string(),
            "--run-dir".to_owned(),
            dir.display().to_string(),
        ];
        args.extend(run_args.iter().cloned());
        tasks.push(ArrayTask {
            name: member.spec.name.clone(),
            tasks: shape.tasks(),
            command: TaskCommand {
                program: program.to_path_buf(),
                args,
            },
        });
        names.push(member.spec.name.clone());
    }
    let Some(shape) = JobShape::covering(shapes) else {
        return Ok(None);
    };
    Ok(Some(ArraySubmission {
        script: SbatchScript::for_array(sweep_name, &tasks, shape, options),
        members: names,
        finished,
        invalid,
    }))
}

/// Creates a directory (`text` None) or writes a file.
fn write(path: &Path, text: Option<&str>) -> Result<(), SweepError> {
    let result = match text {
        None => fs::create_dir_all(path),
        Some(text) => fs::write(path, text),
    };
    result.map_err(|source| SweepError::Write {
        path: PathBuf::from(path),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use ferrotron_launch::SlurmOptions;

    use super::prepare_array;
    use crate::{SweepSpec, resolve};

    #[test]
    fn members_become_array_indices_and_finished_ones_stay_out() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let base =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parallel/gpt.yaml");
        let sweep_file = dir.path().join("arr.yaml");
        std::fs::write(
            &sweep_file,
            format!(
                "sweep:\n  name: arr\n  base: {}\n  set: {{ cluster.nodes: 1, cluster.gpu: cpu }}\n  \
                 grid: {{ cluster.gpus_per_node: [1, 2], training.train_iters: [4, 0] }}\n",
                base.display()
            ),
        )
        .expect("the sweep file");
        let spec = SweepSpec::load(&sweep_file).expect("the sweep loads");
        let members = resolve(&spec, dir.path());
        let out = dir.path().join("out");
        let options = SlurmOptions {
            log_dir: out.join("logs"),
            ..SlurmOptions::default()
        };
        let program = Path::new("/usr/bin/recipe");
        let run_args = ["--backend".to_owned(), "cpu".to_owned()];
        let array = prepare_array("arr", &members, &out, program, &run_args, &options)
            .expect("prepares")
            .expect("some members to run");
        assert_eq!(array.members.len(), 2, "{:?}", array.invalid);
        assert_eq!(array.invalid.len(), 2, "train_iters 0 is invalid");
        let text = array.script.text();
        assert!(text.contains("#SBATCH --array=0-1\n"), "{text}");
        assert!(text.contains("#SBATCH --ntasks-per-node=2\n"), "{text}");
        for (index, name) in array.members.iter().enumerate() {
            let member_dir = std::path::absolute(out.join(name)).expect("absolute");
            assert!(member_dir.join("member.yaml").is_file());
            assert!(text.contains(&format!(
                "  {index}) # {name}\n     ntasks={}; set -- /usr/bin/recipe run {}/member.yaml --run-dir {} --backend cpu ;;",
                index + 1,
                member_dir.display(),
                member_dir.display()
            )), "{text}");
        }

        // The first member finishes: a second submission leaves it out.
        let first = std::path::absolute(out.join(&array.members[0])).expect("absolute");
        let details = ferrotron_telemetry::RunDetails {
            seed: 1,
            data_cache_keys: None,
            hosts: Vec::new(),
            environment: Vec::new(),
        };
        let valid = members
            .iter()
            .find_map(|m| m.resolution.as_ref().ok())
            .expect("a valid member");
        let record = ferrotron_telemetry::PlanRecord::of(&valid.plan).expect("the plan record");
        ferrotron_telemetry::RunManifest::start(&first, &serde_json::json!({}), record, details)
            .and_then(|mut m| m.finish(ferrotron_telemetry::RunStatus::Finished, 0))
            .expect("a finished manifest");
        let again = prepare_array("arr", &members, &out, program, &run_args, &options)
            .expect("prepares")
            .expect("one member left");
        assert_eq!(again.finished, [array.members[0].clone()]);
        assert_eq!(again.members, [array.members[1].clone()]);
        assert!(again.script.text().contains("#SBATCH --array=0-0\n"));
    }
}
