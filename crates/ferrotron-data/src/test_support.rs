//! Fixtures shared by the unit tests: the repository's GPT-2 tokenizer and corpus.

use std::path::PathBuf;

use crate::Tokenizer;

/// `recipes/data` of this repository.
pub(crate) fn recipes_data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../recipes/data")
}

pub(crate) fn gpt2() -> Tokenizer {
    let dir = recipes_data().join("gpt2");
    Tokenizer::gpt2(&dir.join("vocab.json"), &dir.join("merges.txt")).expect("gpt2 loads")
}
