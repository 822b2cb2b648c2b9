//! Data rules: the blend, the split string, the tokenizer's fields, and settings that would be
//! silently ignored (checkpoint cadence without a directory).

use crate::{Finding, Recipe, TokenizerKind};

pub(super) fn check(recipe: &Recipe, out: &mut Vec<Finding>) {
    let data = &recipe.data;
    if data.blend.is_empty() {
        out.push(
            Finding::error(
                "data::empty-blend",
                "data.blend",
                "training needs at least one dataset",
            )
            .with_help("add `data.blend: [{path: <prefix or .jsonl>}]`"),
        );
    }
    for (i, entry) in data.blend.iter().enumerate() {
        if entry.weight <= 0.0 {
            out.push(
                Finding::error(
                    "data::non-positive-weight",
                    format!("data.blend.{i}.weight"),
                    format!("blend weight {} is not positive", entry.weight),
                )
                .with_help("use a weight > 0, or remove the entry"),
            );
        }
        if entry.path.trim().is_empty() {
            out.push(
                Finding::error(
                    "data::empty-path",
                    format!("data.blend.{i}.path"),
                    "empty dataset path",
                )
                .with_help("name a Megatron `.bin/.idx` prefix or a `.jsonl` file"),
            );
        }
    }
    if let Err(message) = parse_split(&data.split) {
        out.push(
            Finding::error("data::split-syntax", "data.split", message).with_help(
                "write up to three non-negative numbers, e.g. \"969,30,1\" or \"98,2,0\"",
            ),
        );
    }
    check_tokenizer(recipe, out);
    let ckpt = &recipe.checkpoint;
    if ckpt.dir.is_none() {
        for (set, key) in [
            (ckpt.interval.is_some(), "interval"),
            (ckpt.keep_last.is_some(), "keep_last"),
        ] {
            if set {
                out.push(
                    Finding::warning(
                        "checkpoint::no-dir",
                        format!("checkpoint.{key}"),
                        format!("checkpoint.{key} has no effect without checkpoint.dir"),
                    )
                    .with_help("set checkpoint.dir to save checkpoints"),
                );
            }
        }
    }
    if ckpt.init_from.is_some() && (ckpt.dir.is_none() || ckpt.resume != "auto") {
        out.push(
            Finding::error(
                "checkpoint::init-from-needs-store",
                "checkpoint.init_from",
                "checkpoint.init_from imports the weights as the first checkpoint of checkpoint.dir, \
                 which the run then resumes from",
            )
            .with_help("set checkpoint.dir and keep checkpoint.resume: auto"),
        );
    }
}

/// Megatron's split string: up to three non-negative weights separated by `,` or `/`,
/// normalised to fractions; the training share must be positive.
pub(super) fn parse_split(split: &str) -> Result<[f64; 3], String> {
    let parts: Vec<&str> = split.split([',', '/']).map(str::trim).collect();
    if parts.len() > 3 {
        return Err(format!(
            "split \"{split}\" has {} parts; at most three (train, valid, test)",
            parts.len()
        ));
    }
    let mut weights = [0.0; 3];
    for (slot, part) in weights.iter_mut().zip(&parts) {
        *slot = part
            .parse::<f64>()
            .ok()
            .filter(|w| w.is_finite() && *w >= 0.0)
            .ok_or_else(|| format!("split \"{split}\": `{part}` is not a non-negative number"))?;
    }
    let total: f64 = weights.iter().sum();
    if weights[0] <= 0.0 || total <= 0.0 {
        return Err(format!("split \"{split}\" gives no data to training"));
    }
    Ok(weights.map(|w| w / total))
}

fn check_tokenizer(recipe: &Recipe, out: &mut Vec<Finding>) {
    let tok = &recipe.data.tokenizer;
    // (key, present) pairs: the fields this tokenizer type needs, and those it must not have.
    type Fields<'a> = &'a [(&'a str, bool)];
    let (needed, foreign): (Fields, Fields) = match tok.kind {
        TokenizerKind::Gpt2Bpe => (
            &[
                ("vocab_file", tok.vocab_file.is_some()),
                ("merge_file", tok.merge_file.is_some()),
            ],
            &[("file", tok.file.is_some())],
        ),
        TokenizerKind::Hf => (
            &[("file", tok.file.is_some())],
            &[
                ("vocab_file", tok.vocab_file.is_some()),
                ("merge_file", tok.merge_file.is_some()),
            ],
        ),
    };
    let kind = match tok.kind {
        TokenizerKind::Gpt2Bpe => "gpt2-bpe",
        TokenizerKind::Hf => "hf",
    };
    for (key, present) in needed {
        if !present {
            out.push(
                Finding::error(
                    "tokenizer::missing-file",
                    format!("data.tokenizer.{key}"),
                    format!("tokenizer type `{kind}` needs data.tokenizer.{key}"),
                )
                .with_help(match *key {
                    "vocab_file" => "point vocab_file at GPT-2's vocab.json",
                    "merge_file" => "point merge_file at GPT-2's merges.txt",
                    _ => "point file at a Hugging Face tokenizer.json",
                }),
            );
        }
    }
    for (key, present) in foreign {
        if *present {
            out.push(
                Finding::error(
                    "tokenizer::foreign-field",
                    format!("data.tokenizer.{key}"),
                    format!("data.tokenizer.{key} does not apply to tokenizer type `{kind}`"),
                )
                .with_help(format!(
                    "remove data.tokenizer.{key} or change data.tokenizer.type"
                )),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fixture::{codes, recipe};

    fn run(recipe: &Recipe) -> Vec<Finding> {
        crate::rules::fixture::run(check, recipe)
    }

    #[test]
    fn split_syntax() {
        assert_eq!(parse_split("969,30,1").map(|s| s[0]), Ok(0.969));
        assert_eq!(parse_split("98/2").map(|s| s[1]), Ok(0.02));
        assert!(parse_split("1,2,3,4").is_err());
        assert!(parse_split("a,b").is_err());
        assert!(parse_split("0,1,0").is_err());
        assert!(parse_split("-1,2").is_err());
    }

    #[test]
    fn blend_and_tokenizer() {
        let mut r = recipe();
        r.data.blend[0].weight = 0.0;
        r.data.tokenizer.kind = TokenizerKind::Hf;
        r.data.split = "1,2,3,4".into();
        assert_eq!(
            codes(&run(&r)),
            [
                "data::non-positive-weight",
                "data::split-syntax",
                "tokenizer::missing-file",
                "tokenizer::foreign-field",
                "tokenizer::foreign-field",
            ]
        );
        r.data.blend.clear();
        assert_eq!(codes(&run(&r))[0], "data::empty-blend");
    }

    #[test]
    fn init_from_needs_a_store_to_resume_from() {
        let mut r = recipe();
        r.checkpoint.init_from = Some(crate::InitFrom {
            hf: "hf/gpt2".into(),
        });
        assert_eq!(codes(&run(&r)), ["checkpoint::init-from-needs-store"]);
        r.checkpoint.dir = Some("ckpt".into());
        assert!(run(&r).is_empty());
        r.checkpoint.resume = "never".into();
        assert_eq!(codes(&run(&r)), ["checkpoint::init-from-needs-store"]);
    }
}
