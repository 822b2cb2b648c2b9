//! The tokenizer Megatron users already have: GPT-2 byte-level BPE from `vocab.json` +
//! `merges.txt` (Megatron's `GPT2BPETokenizer`), or any Hugging Face `tokenizer.json`.
//!
//! Everything goes through the Hugging Face `tokenizers` crate so ids are the reference ids. For
//! GPT-2, `<|endoftext|>` is deliberately *not* registered as a special token: Megatron's GPT-2
//! tokenizer splits that string like any other text, and the end-of-document id is only ever
//! added by `--append-eod`, never smuggled in by the text itself.

use std::path::Path;

use ferrotron_recipe::TokenizerKind;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::DataError;

/// GPT-2's end-of-document token.
const GPT2_EOD: &str = "<|endoftext|>";

/// End-of-sequence tokens of common `tokenizer.json` files, in order of preference; the first one
/// the vocabulary knows becomes the end-of-document id.
const KNOWN_EOD_TOKENS: [&str; 7] = [
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eot_id|>",
    "<|im_end|>",
    "[SEP]",
];

/// A loaded tokenizer with its end-of-document id.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eod_id: u32,
    vocab_size: u32,
}

impl Tokenizer {
    /// Loads the tokenizer a recipe names (its paths already resolved by the recipe loader).
    pub fn from_recipe(spec: &ferrotron_recipe::Tokenizer) -> Result<Self, DataError> {
        match spec.kind {
            TokenizerKind::Gpt2Bpe => {
                let vocab = spec.vocab_file.as_deref().ok_or_else(|| {
                    DataError::Tokenizer("gpt2-bpe needs data.tokenizer.vocab_file".into())
                })?;
                let merges = spec.merge_file.as_deref().ok_or_else(|| {
                    DataError::Tokenizer("gpt2-bpe needs data.tokenizer.merge_file".into())
                })?;
                Self::gpt2(Path::new(vocab), Path::new(merges))
            }
            TokenizerKind::Hf => {
                let file = spec.file.as_deref().ok_or_else(|| {
                    DataError::Tokenizer("hf needs data.tokenizer.file (a tokenizer.json)".into())
                })?;
                Self::from_tokenizer_json(Path::new(file))
            }
        }
    }

    /// GPT-2 byte-level BPE from `vocab.json` and `merges.txt`.
    pub fn gpt2(vocab_file: &Path, merge_file: &Path) -> Result<Self, DataError> {
        for path in [vocab_file, merge_file] {
            if !path.is_file() {
                return Err(DataError::Tokenizer(format!(
                    "{} does not exist or is not a file",
                    path.display()
                )));
            }
        }
        let bpe = BPE::from_file(&vocab_file.to_string_lossy(), &merge_file.to_string_lossy())
            .build()
            .map_err(|e| {
                DataError::Tokenizer(format!(
                    "cannot load GPT-2 BPE from {} and {}: {e}",
                    vocab_file.display(),
                    merge_file.display()
                ))
            })?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let eod_id = inner.token_to_id(GPT2_EOD).ok_or_else(|| {
            DataError::Tokenizer(format!(
                "{} has no {GPT2_EOD} token, so it is not a GPT-2 vocabulary",
                vocab_file.display()
            ))
        })?;
        Ok(Self::with_eod(inner, eod_id))
    }

    /// Any Hugging Face `tokenizer.json`; the end-of-document id is its first known EOS token.
    pub fn from_tokenizer_json(file: &Path) -> Result<Self, DataError> {
        let inner = tokenizers::Tokenizer::from_file(file)
            .map_err(|e| DataError::Tokenizer(format!("cannot load {}: {e}", file.display())))?;
        let eod_id = KNOWN_EOD_TOKENS
            .iter()
            .find_map(|token| inner.token_to_id(token))
            .ok_or_else(|| {
                DataError::Tokenizer(format!(
                    "{} has none of the end-of-document tokens {KNOWN_EOD_TOKENS:?}",
                    file.display()
                ))
            })?;
        Ok(Self::with_eod(inner, eod_id))
    }

    fn with_eod(inner: tokenizers::Tokenizer, eod_id: u32) -> Self {
        let vocab_size = inner.get_vocab_size(true) as u32;
        Tokenizer {
            inner,
            eod_id,
            vocab_size,
        }
    }

    /// Vocabulary size before padding (added tokens included), as Megatron counts it.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The end-of-document id (GPT-2: 50256).
    pub fn eod_id(&self) -> u32 {
        self.eod_id
    }

    /// Token ids of `text`. Special tokens are added only where the tokenizer's own
    /// post-processor adds them (e.g. a Llama `tokenizer.json` prepends BOS), exactly as
    /// Megatron's `HuggingFaceTokenizer.tokenize` does; GPT-2 adds none.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        self.inner
            .encode_fast(text, true)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| DataError::Tokenizer(format!("cannot encode text: {e}")))
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| DataError::Tokenizer(format!("cannot decode ids: {e}")))
    }

    /// A digest of everything that determines the ids (model, vocabulary, merges, pre-tokenizer,
    /// special tokens) and the end-of-document id: the tokenizer's part of a cache key.
    pub fn fingerprint(&self) -> Result<blake3::Hash, DataError> {
        let serialized = self
            .inner
            .to_string(false)
            .map_err(|e| DataError::Tokenizer(format!("cannot serialize tokenizer: {e}")))?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(serialized.as_bytes());
        hasher.update(&self.eod_id.to_le_bytes());
        Ok(hasher.finalize())
    }
}

/// The vocabulary size of the tokenizer a recipe names (loads it).
pub fn tokenizer_vocab_size(spec: &ferrotron_recipe::Tokenizer) -> Result<u32, DataError> {
    Tokenizer::from_recipe(spec).map(|t| t.vocab_size())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::gpt2;

    #[test]
    fn gpt2_ids_match_the_reference_tokenizer() {
        // Reference ids from the Python `tokenizers` package and OpenAI's published GPT-2 encodings.
        let tok = gpt2();
        let cases: [(&str, &[u32]); 5] = [
            ("Hello world", &[15496, 995]),
            (" Hello world", &[18435, 995]),
            (
                "To be, or not to be: that is the question.",
                &[
                    2514, 307, 11, 393, 407, 284, 307, 25, 326, 318, 262, 1808, 13,
                ],
            ),
            ("naïve café 😀", &[2616, 38776, 40304, 30325, 222]),
            // The text "<|endoftext|>" is text, as in Megatron's GPT-2 tokenizer.
            ("<|endoftext|>", &[27, 91, 437, 1659, 5239, 91, 29]),
        ];
        for (text, ids) in cases {
            assert_eq!(tok.encode(text).unwrap(), ids, "{text:?}");
            assert_eq!(tok.decode(ids).unwrap(), text);
        }
        assert_eq!(tok.vocab_size(), 50257);
        assert_eq!(tok.eod_id(), 50256);
    }

    #[test]
    fn recipe_without_files_is_a_clear_error() {
        let spec = ferrotron_recipe::Tokenizer::default();
        let err = Tokenizer::from_recipe(&spec).unwrap_err().to_string();
        assert!(err.contains("vocab_file"), "{err}");
    }

    #[test]
    fn missing_vocab_file_is_named() {
        let err = Tokenizer::gpt2(Path::new("nope/vocab.json"), Path::new("nope/merges.txt"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope/vocab.json"), "{err}");
    }

    #[test]
    fn tokenizer_json_round_trips_through_the_hf_loader() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokenizer.json");
        std::fs::write(&file, gpt2().inner.to_string(false).unwrap()).unwrap();
        let spec = ferrotron_recipe::Tokenizer {
            kind: TokenizerKind::Hf,
            file: Some(file.to_string_lossy().into_owned()),
            ..Default::default()
        };
        let tok = Tokenizer::from_recipe(&spec).unwrap();
        assert_eq!(tok.encode("Hello world").unwrap(), [15496, 995]);
        assert_eq!(tok.eod_id(), 50256);
        assert_eq!(tokenizer_vocab_size(&spec).unwrap(), 50257);
        assert_eq!(tok.fingerprint().unwrap(), gpt2().fingerprint().unwrap());
    }
}
