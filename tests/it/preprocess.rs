//! End-to-end tests of `recipe preprocess` (the real binary, real files).

use std::path::Path;
use std::process::{Command, Output};

use ferrotron_data::{IndexedDataset, TokenDtype};

use crate::common::repo;

fn preprocess(args: &[&str]) -> Output {
    let gpt2 = repo().join("recipes/data/gpt2");
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .arg("preprocess")
        .arg("--vocab-file")
        .arg(gpt2.join("vocab.json"))
        .arg("--merge-file")
        .arg(gpt2.join("merges.txt"))
        .args(args)
        .output()
        .expect("the recipe binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

#[test]
fn tokenizes_jsonl_into_megatron_files() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("small.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"Hello world\", \"meta\": 1}\n{\"text\": \"To be, or not to be: that is the question.\"}\n",
    )
    .unwrap();
    let prefix = dir.path().join("out/small");
    let out = preprocess(&[
        "--input",
        path(&input),
        "--output-prefix",
        path(&prefix),
        "--json-keys",
        "text",
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--dataset-impl",
        "mmap",
        "--append-eod",
        "--workers",
        "2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("small_text_document.bin"), "{stdout}");
    assert!(stdout.contains("2 documents, 17 tokens"), "{stdout}");
    let ds = IndexedDataset::open(dir.path().join("out/small_text_document")).unwrap();
    assert_eq!(ds.dtype(), TokenDtype::U16);
    assert_eq!(ds.sequence(0).unwrap(), [15496, 995, 50256]);
    assert_eq!(
        ds.sequence(1).unwrap(),
        [
            2514, 307, 11, 393, 407, 284, 307, 25, 326, 318, 262, 1808, 13, 50256
        ]
    );
    // Exact Megatron bytes: header, int32 lengths, int64 pointers, int64 document index.
    let idx = std::fs::read(dir.path().join("out/small_text_document.idx")).unwrap();
    assert_eq!(&idx[..9], b"MMIDIDX\x00\x00");
    assert_eq!(idx.len(), 34 + 2 * 4 + 2 * 8 + 3 * 8);
}

#[test]
fn a_bad_line_fails_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"fine\"}\n{\"txt\": \"typo\"}\n{\"text\": \"fine\"}\n",
    )
    .unwrap();
    let prefix = dir.path().join("bad");
    let out = preprocess(&[
        "--input",
        path(&input),
        "--output-prefix",
        path(&prefix),
        "--quiet",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("bad.jsonl:2: missing key \"text\""),
        "{stderr}"
    );
    assert!(stderr.contains("--skip-bad-lines"), "{stderr}");
    assert!(!dir.path().join("bad_text_document.idx").exists());
}

#[test]
fn skip_bad_lines_leaves_them_out_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"fine\"}\nnot json\n{\"text\": \"fine\"}\n{\"text\": null}\n",
    )
    .unwrap();
    let prefix = dir.path().join("kept");
    let out = preprocess(&[
        "--input",
        path(&input),
        "--output-prefix",
        path(&prefix),
        "--skip-bad-lines",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("skipped ") && stderr.contains("bad.jsonl:2: invalid JSON"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.jsonl:4: key \"text\" holds null"),
        "{stderr}"
    );
    assert!(text(&out.stdout).contains("skipped 2 bad lines"));
    let ds = IndexedDataset::open(dir.path().join("kept_text_document")).unwrap();
    assert_eq!(ds.documents(), 2);
}

#[test]
fn a_missing_tokenizer_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(["preprocess", "--input", "x.jsonl", "--output-prefix"])
        .arg(dir.path().join("o"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("name a tokenizer"),
        "{}",
        text(&out.stderr)
    );
}
