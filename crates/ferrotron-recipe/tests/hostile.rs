//! Inputs a hostile or careless user gives the loader (issue 19): each ends in one located
//! error, quickly and in bounded memory, never in a panic, an OOM kill or a stack overflow.

use ferrotron_recipe::{LoadOptions, RecipeErrors, load, load_str, read_text, text_from};

const MINIMAL: &str = "version: 2\nname: t\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32}\ntraining: {micro_batch_size: 2, global_batch_size: 8, train_iters: 10}\ndata:\n  tokenizer: {type: gpt2-bpe, vocab_file: v.json, merge_file: m.txt}\n  blend: [{path: d.jsonl}]\n";

/// `code file:line:col message (help)` per problem, for snapshots.
fn summary(errors: &RecipeErrors) -> String {
    errors
        .problems()
        .iter()
        .map(|p| {
            let at = p
                .file_position()
                .map_or_else(String::new, |(f, l, c)| format!(" {f}:{l}:{c}"));
            let help = p
                .help_text()
                .map_or_else(String::new, |h| format!(" (help: {h})"));
            format!("{}{at} {}{help}\n", p.code(), p.message())
        })
        .collect()
}

fn refused(text: &str) -> String {
    summary(&load_str("hostile.yaml", text, &LoadOptions::default()).expect_err("refused"))
}

/// Nine levels of nine aliases: 387 bytes that expand to 9⁹ nodes (24 GB before the limit).
fn alias_bomb(levels: u8) -> String {
    let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
    for level in 1..levels {
        let (name, prev) = (char::from(b'a' + level), char::from(b'a' + level - 1));
        let items = vec![format!("*{prev}"); 9].join(", ");
        text.push_str(&format!("{name}: &{name} [{items}]\n"));
    }
    text
}

#[test]
fn an_alias_bomb_is_refused_where_it_passes_the_node_limit() {
    let bomb = alias_bomb(9);
    assert!(bomb.len() < 400, "{} bytes", bomb.len());
    insta::assert_snapshot!(refused(&bomb));
}

#[test]
fn deep_nesting_is_refused_at_the_limit() {
    let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    insta::assert_snapshot!(refused(&deep));
    let block: String = (0..200)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect();
    assert!(refused(&block).starts_with("yaml::limit hostile.yaml:65:"));
}

#[test]
fn an_oversized_file_is_refused_before_parsing() {
    let big = format!("{MINIMAL}# {}\n", "x".repeat(2 << 20));
    insta::assert_snapshot!(refused(&big));
}

#[test]
fn a_long_extends_chain_is_cut_without_recursion() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 8,000 files overflowed the stack before; now the chain stops at the limit.
    for i in 0..8_000 {
        let text = if i == 7_999 {
            MINIMAL.to_owned()
        } else {
            format!("extends: r{}.yaml\n", i + 1)
        };
        std::fs::write(dir.path().join(format!("r{i}.yaml")), text).expect("write");
    }
    let errors = load(&dir.path().join("r0.yaml"), &LoadOptions::default()).expect_err("cut");
    let problems = errors.problems();
    assert_eq!(problems.len(), 1, "{}", summary(&errors));
    assert_eq!(problems[0].code(), "recipe::extends");
    assert_eq!(
        problems[0].message(),
        "the `extends` chain is longer than 32 files"
    );
    // 31 bases are fine.
    std::fs::write(dir.path().join("r31.yaml"), MINIMAL).expect("write");
    load(&dir.path().join("r0.yaml"), &LoadOptions::default()).expect("32 files load");
}

#[test]
fn non_finite_numbers_are_named_as_such() {
    let text = MINIMAL.replace(
        "train_iters: 10}",
        "train_iters: 10, optimizer: {lr: .nan, weight_decay: 1e400, beta1: -.inf, adam_beta2: .nan}}",
    );
    insta::assert_snapshot!(refused(&text));
    let sets = ["training.optimizer.lr=.inf".to_owned()];
    let opts = LoadOptions {
        overrides: &sets,
        use_env: false,
    };
    let errors = load_str("t.yaml", MINIMAL, &opts).expect_err("refused");
    assert_eq!(
        errors.problems()[0].message(),
        "`training.optimizer.lr` is not a finite number (it reads as `.inf`)"
    );
}

#[test]
fn core_tags_are_honoured_and_others_refused() {
    // `!!str 4` is the string "4": the schema wants an integer and says so.
    let text = MINIMAL.replace("num_layers: 2", "num_layers: !!str 2");
    assert!(
        refused(&text).starts_with("schema::type"),
        "{}",
        refused(&text)
    );
    let text = MINIMAL.replace("num_layers: 2", "num_layers: !!int \"2\"");
    let loaded = load_str("t.yaml", &text, &LoadOptions::default()).expect("!!int of a string");
    assert_eq!(loaded.recipe.model.num_layers, 2);
    let text = MINIMAL
        .replace("num_layers: 2", "num_layers: !!int two")
        .replace("name: t", "name: !custom t");
    insta::assert_snapshot!(refused(&text));
}

#[test]
fn a_file_that_is_not_utf8_names_the_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("latin1.yaml");
    let mut bytes = MINIMAL.replace("name: t", "name: caf").into_bytes();
    let at = bytes.iter().position(|&b| b == b'f').expect("f") + 1;
    bytes.insert(at, 0xe9);
    std::fs::write(&path, bytes).expect("write");
    let errors = load(&path, &LoadOptions::default()).expect_err("refused");
    assert!(errors.is_unreadable());
    let problem = &errors.problems()[0];
    assert!(
        problem
            .message()
            .ends_with("not UTF-8 text: byte 20 (line 2, column 10) is 0xe9"),
        "{}",
        problem.message()
    );
    assert_eq!(problem.help_text(), Some("save the recipe as UTF-8"));
}

#[test]
fn what_is_no_regular_file_is_refused_before_it_is_opened() {
    // Reading `/dev/zero` never ended (issue 42); opening a FIFO blocks until a writer comes.
    let error = read_text(std::path::Path::new("/dev/zero")).expect_err("refused");
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(
        error.to_string(),
        "it is a character device, not a regular file"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let error = read_text(dir.path()).expect_err("refused");
    assert_eq!(error.kind(), std::io::ErrorKind::IsADirectory);
    assert_eq!(error.to_string(), "it is a directory, not a regular file");
    let fifo = dir.path().join("fifo.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let error = read_text(&fifo).expect_err("refused");
    assert_eq!(
        error.to_string(),
        "it is a named pipe (FIFO), not a regular file"
    );
    let errors =
        load(std::path::Path::new("/dev/zero"), &LoadOptions::default()).expect_err("refused");
    assert!(errors.is_unreadable());
    assert_eq!(
        errors.problems()[0].help_text(),
        Some("name a recipe file (YAML)")
    );
}

#[test]
fn an_oversized_file_is_refused_without_being_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge.yaml");
    // Sparse: 3 GB long, no disk used; it was read whole before the limit applied (issue 42).
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(3 << 30))
        .expect("sparse file");
    let errors = load(&path, &LoadOptions::default()).expect_err("refused");
    assert!(errors.is_unreadable());
    let problem = &errors.problems()[0];
    assert!(
        problem
            .message()
            .ends_with("it is 3221225472 bytes; a recipe file may have at most 1048576"),
        "{}",
        problem.message()
    );
    // A source with no size to check first (`git show`, a file growing while it is read) is cut
    // one byte past the limit.
    let error = text_from(std::io::repeat(b'a')).expect_err("refused");
    assert_eq!(error.kind(), std::io::ErrorKind::FileTooLarge);
    assert_eq!(
        error.to_string(),
        "it is over 1048576 bytes, the most a recipe file may have"
    );
    use std::io::Read as _;
    let exactly = text_from(std::io::repeat(b'#').take(1 << 20)).expect("at the limit");
    assert_eq!(exactly.len(), 1 << 20);
}
