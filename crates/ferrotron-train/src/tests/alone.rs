//! A rank alone is the run `recipe run` makes on one CPU or one GPU: the whole model, the
//! one-rank step and the one-rank checkpoint files, whatever parallel options the recipe carries.

use serde_json::json;

use super::fixture::{Layout, options, plan, train_alone, write_data};
use crate::checkpoint::{MODEL_FILE, OPTIMIZER_FILE, read_shard_specs};

#[test]
fn a_rank_alone_writes_whole_tensors_in_the_one_rank_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_data(dir.path());
    let stored = plan(
        dir.path(),
        Layout::alone(),
        2,
        2,
        json!({"checkpoint": {"dir": dir.path().join("ckpt")}}),
    );
    let outcome = train_alone(&stored, &options(dir.path())).expect("the rank trains");
    let folder = outcome.summary.checkpoint.expect("a checkpoint was saved");
    let mut files: Vec<String> = std::fs::read_dir(&folder)
        .expect("the checkpoint folder lists")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".safetensors"))
        .collect();
    files.sort();
    assert_eq!(files, [MODEL_FILE, OPTIMIZER_FILE]);
    for file in files {
        let specs = read_shard_specs(&folder.join(&file)).expect("the header reads");
        assert!(!specs.is_empty(), "{file} holds no tensor");
        for spec in specs {
            assert!(
                spec.splits.is_empty(),
                "{file}: {spec:?} is not a whole tensor"
            );
        }
    }
}
