use std::path::Path;

use super::*;
use crate::IndexedDataset;
use crate::test_support::gpt2;

fn config(inputs: Vec<PathBuf>, prefix: &Path) -> PreprocessConfig {
    PreprocessConfig {
        inputs,
        output_prefix: prefix.to_path_buf(),
        json_keys: vec!["text".into()],
        append_eod: true,
        workers: 2,
        skip_bad_lines: false,
        progress: Progress::Hidden,
    }
}

#[test]
fn documents_are_tokenized_in_input_order_with_eod() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"Hello world\"}\n{\"text\": \"\", \"id\": 2}\r\n{\"text\": \" Hello world\"}",
    )
    .unwrap();
    let prefix = dir.path().join("out");
    let tok = gpt2();
    let report = preprocess_jsonl(&config(vec![input], &prefix), &tok).unwrap();
    assert_eq!(report.documents, 3);
    assert_eq!(report.tokens, 3 + 1 + 3);
    let ds = IndexedDataset::open(output_prefix(&prefix, "text")).unwrap();
    assert_eq!(ds.dtype(), TokenDtype::U16);
    assert_eq!(ds.sequence(0).unwrap(), [15496, 995, 50256]);
    assert_eq!(ds.sequence(1).unwrap(), [50256]);
    assert_eq!(ds.sequence(2).unwrap(), [18435, 995, 50256]);
}

#[test]
fn output_does_not_depend_on_the_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines: String = (0..10_000)
        .map(|i| {
            format!(
                "{{\"text\": \"line {i} of many, {}\"}}\n",
                "x".repeat(i % 97)
            )
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let tok = gpt2();
    let mut outputs = Vec::new();
    for workers in [1, 3] {
        let prefix = dir.path().join(format!("w{workers}"));
        let mut cfg = config(vec![input.clone()], &prefix);
        cfg.workers = workers;
        let report = preprocess_jsonl(&cfg, &tok).unwrap();
        assert_eq!(report.documents, 10_000);
        outputs.push(std::fs::read(crate::bin_path(&output_prefix(&prefix, "text"))).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn a_bad_line_fails_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"a\"}\n{\"text\": \"b\"\n{\"text\": \"c\"}\n",
    )
    .unwrap();
    let err = preprocess_jsonl(&config(vec![input], &dir.path().join("o")), &gpt2()).unwrap_err();
    match &err {
        DataError::BadLine { line, problem, .. } => {
            assert_eq!(*line, 2);
            assert!(problem.contains("invalid JSON"), "{problem}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("in.jsonl:2:"), "{err}");
    assert!(!crate::idx_path(&output_prefix(&dir.path().join("o"), "text")).exists());
}

#[test]
fn bad_lines_are_skipped_and_reported_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    std::fs::write(&a, "{\"text\": \"a\"}\n\n{\"body\": \"x\"}\n").unwrap();
    std::fs::write(&b, "[1]\n{\"text\": 5}\n{\"text\": \"b\"}\n").unwrap();
    let mut cfg = config(vec![a.clone(), b.clone()], &dir.path().join("o"));
    cfg.skip_bad_lines = true;
    let report = preprocess_jsonl(&cfg, &gpt2()).unwrap();
    assert_eq!(report.documents, 2);
    let skipped: Vec<(PathBuf, u64, String)> = report
        .skipped
        .into_iter()
        .map(|s| (s.path, s.line, s.problem))
        .collect();
    assert_eq!(
        skipped,
        [
            (a.clone(), 2, "empty line".to_owned()),
            (a, 3, "missing key \"text\"".to_owned()),
            (b.clone(), 1, "not a JSON object".to_owned()),
            (b, 2, "key \"text\" holds a number, not a string".to_owned()),
        ]
    );
}

#[test]
fn several_keys_write_one_dataset_each() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"Hello world\", \"title\": \"Hello\"}\n",
    )
    .unwrap();
    let prefix = dir.path().join("o");
    let mut cfg = config(vec![input], &prefix);
    cfg.json_keys = vec!["text".into(), "title".into()];
    cfg.append_eod = false;
    let report = preprocess_jsonl(&cfg, &gpt2()).unwrap();
    assert_eq!(report.outputs.len(), 2);
    let title = IndexedDataset::open(output_prefix(&prefix, "title")).unwrap();
    assert_eq!(title.sequence(0).unwrap(), [15496]);
}

#[test]
fn cached_preprocessing_runs_once_per_content() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.jsonl");
    std::fs::write(&input, "{\"text\": \"Hello world\"}\n").unwrap();
    let cache = dir.path().join("cache");
    let tok = gpt2();
    let first = preprocess_jsonl_cached(&input, "text", &tok, &cache, Progress::Hidden).unwrap();
    let stamp = std::fs::metadata(crate::bin_path(&first))
        .unwrap()
        .modified()
        .unwrap();
    let again = preprocess_jsonl_cached(&input, "text", &tok, &cache, Progress::Hidden).unwrap();
    assert_eq!(first, again);
    assert_eq!(
        std::fs::metadata(crate::bin_path(&again))
            .unwrap()
            .modified()
            .unwrap(),
        stamp
    );
    std::fs::write(&input, "{\"text\": \" Hello world\"}\n").unwrap();
    let changed = preprocess_jsonl_cached(&input, "text", &tok, &cache, Progress::Hidden).unwrap();
    assert_ne!(changed, first);
    let ds = IndexedDataset::open(&changed).unwrap();
    assert_eq!(ds.sequence(0).unwrap(), [18435, 995, 50256]);
    // No staging directories are left behind.
    let leftovers = std::fs::read_dir(cache.join("jsonl"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".staging")
        })
        .count();
    assert_eq!(leftovers, 0);
}
