//! Which layers are MoE layers: Megatron's `--moe-layer-freq`, in each form Megatron takes.
//!
//! An integer N makes every N-th layer, counted from layer 0, an MoE layer (1: all of them).
//! A list gives one 0/1 per layer (1 = MoE), which is how DeepSeek-V3's dense first layers are
//! written (`[0, 0, 0, 1, …]`). Megatron's command line also takes that list as a Python
//! expression string, `"([0]*3+[1]*58)"`, which it `eval`s after allowing only the characters
//! `,0-9[]()+*`; [`LayerFreq::Expression`] keeps such a string as written and evaluates the same
//! arithmetic here (list + list, list × integer, integer × list, integers), nothing else. A
//! string without `[` is the integer form, as Megatron's `moe_freq_type` reads it (`int(x)`).
//!
//! A list's length and values, and an expression's syntax, are checked by the semantic rules
//! (which know `num_layers` and point at the offending item); [`LayerFreq::pattern`] is what
//! every other crate uses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Megatron's `--moe-layer-freq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum LayerFreq {
    /// Every N-th layer from layer 0 is MoE (1: all layers).
    Every(#[schemars(range(min = 1))] u32),
    /// One value per layer: 1 = MoE, 0 = dense (length num_layers).
    Pattern(Vec<u32>),
    /// Megatron's string form of the list, e.g. `"([0]*3+[1]*58)"`.
    Expression(String),
}

impl Default for LayerFreq {
    fn default() -> Self {
        LayerFreq::Every(1)
    }
}

/// Why a [`LayerFreq`] gives no pattern for a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerFreqError {
    #[error("layer_freq must be at least 1")]
    Zero,
    #[error("the pattern has {found} entries but the model has {num_layers} layers")]
    Length { found: usize, num_layers: u32 },
    #[error("entry {index} is {value}: only 0 (dense) and 1 (MoE) are allowed")]
    Value { index: usize, value: u32 },
    #[error("{0}")]
    Expression(String),
}

impl LayerFreq {
    /// The integer form's N: written as an integer, or as a string without `[` (which
    /// Megatron's `moe_freq_type` reads as `int(x)`).
    pub fn every(&self) -> Option<u32> {
        match self {
            LayerFreq::Every(n) => Some(*n),
            LayerFreq::Expression(text) if !text.contains('[') => text.parse().ok(),
            _ => None,
        }
    }

    /// Whether each of `num_layers` layers is MoE, as Megatron's `moe_layer_pattern`.
    pub fn pattern(&self, num_layers: u32) -> Result<Vec<bool>, LayerFreqError> {
        let values = match self {
            LayerFreq::Every(0) => return Err(LayerFreqError::Zero),
            LayerFreq::Every(n) => {
                return Ok((0..num_layers).map(|i| i.is_multiple_of(*n)).collect());
            }
            LayerFreq::Pattern(values) => values.clone(),
            LayerFreq::Expression(text) if text.contains('[') => {
                evaluate(text).map_err(LayerFreqError::Expression)?
            }
            LayerFreq::Expression(text) => {
                let n = text.parse().map_err(|_| {
                    LayerFreqError::Expression(format!(
                        "`{text}` is neither a number nor a list pattern"
                    ))
                })?;
                return LayerFreq::Every(n).pattern(num_layers);
            }
        };
        if values.len() != num_layers as usize {
            return Err(LayerFreqError::Length {
                found: values.len(),
                num_layers,
            });
        }
        values
            .iter()
            .enumerate()
            .map(|(index, &value)| match value {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(LayerFreqError::Value { index, value }),
            })
            .collect()
    }

    /// The form a checkpoint manifest records: the integer N where the pattern is exactly every
    /// N-th layer (so a manifest written before the list form compares equal), else the list.
    pub fn canonical(&self, num_layers: u32) -> LayerFreq {
        let Ok(pattern) = self.pattern(num_layers) else {
            return self.clone();
        };
        let every = (1..=num_layers.max(1))
            .find(|&n| LayerFreq::Every(n).pattern(num_layers).as_ref() == Ok(&pattern));
        match every {
            Some(n) => LayerFreq::Every(n),
            None => LayerFreq::Pattern(pattern.into_iter().map(u32::from).collect()),
        }
    }
}

/// Longest list an expression may build: no model has more layers than this.
const MAX_ENTRIES: usize = crate::bounds::MAX_LAYERS as usize;

/// A value of Megatron's pattern expressions.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Int(u64),
    List(Vec<u32>),
}

/// Evaluate Megatron's `--moe-layer-freq` string to its list, as Python's `eval` would.
fn evaluate(text: &str) -> Result<Vec<u32>, String> {
    if let Some(bad) = text
        .chars()
        .find(|c| !(c.is_ascii_digit() || ",[]()+*".contains(*c)))
    {
        return Err(format!(
            "`{text}`: Megatron allows only digits and `,[]()+*` in a pattern, not `{bad}`"
        ));
    }
    let mut parser = Parser {
        text: text.as_bytes(),
        at: 0,
    };
    let value = parser.sum()?;
    if parser.at != text.len() {
        return Err(format!(
            "`{text}`: unexpected `{}` at character {}",
            char::from(text.as_bytes()[parser.at]),
            parser.at + 1
        ));
    }
    match value {
        Value::List(list) => Ok(list),
        Value::Int(n) => Err(format!("`{text}` is the number {n}, not a list")),
    }
}

struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn expect(&mut self, wanted: u8) -> Result<(), String> {
        if self.peek() == Some(wanted) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{}`", char::from(wanted))))
        }
    }

    fn unexpected(&self, wanted: &str) -> String {
        match self.peek() {
            Some(c) => format!(
                "expected {wanted} at character {}, found `{}`",
                self.at + 1,
                char::from(c)
            ),
            None => format!("expected {wanted}, found the end"),
        }
    }

    /// `product ('+' product)*`
    fn sum(&mut self) -> Result<Value, String> {
        let mut value = self.product()?;
        while self.peek() == Some(b'+') {
            self.at += 1;
            let right = self.product()?;
            value = match (value, right) {
                (Value::Int(a), Value::Int(b)) => Value::Int(
                    a.checked_add(b)
                        .ok_or_else(|| "a number is too large".to_owned())?,
                ),
                (Value::List(mut a), Value::List(b)) => {
                    a.extend(b);
                    checked_len(a)?
                }
                _ => {
                    return Err(
                        "`+` joins two lists or two numbers, not a list and a number".into(),
                    );
                }
            };
        }
        Ok(value)
    }

    /// `atom ('*' atom)*`
    fn product(&mut self) -> Result<Value, String> {
        let mut value = self.atom()?;
        while self.peek() == Some(b'*') {
            self.at += 1;
            let right = self.atom()?;
            value = match (value, right) {
                (Value::Int(a), Value::Int(b)) => Value::Int(
                    a.checked_mul(b)
                        .ok_or_else(|| "a number is too large".to_owned())?,
                ),
                (Value::List(list), Value::Int(n)) | (Value::Int(n), Value::List(list)) => {
                    repeat(&list, n)?
                }
                (Value::List(_), Value::List(_)) => {
                    return Err(
                        "`*` repeats a list a number of times; two lists cannot be multiplied"
                            .into(),
                    );
                }
            };
        }
        Ok(value)
    }

    /// `'[' (int (',' int)* ','?)? ']'`, `'(' sum ')'` or an integer.
    fn atom(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some(b'(') => {
                self.at += 1;
                let value = self.sum()?;
                self.expect(b')')?;
                Ok(value)
            }
            Some(b'[') => {
                self.at += 1;
                let mut list = Vec::new();
                while self.peek() != Some(b']') {
                    let n = self.integer()?;
                    list.push(
                        u32::try_from(n).map_err(|_| "a list entry is too large".to_owned())?,
                    );
                    if self.peek() == Some(b',') {
                        self.at += 1;
                    } else {
                        break;
                    }
                }
                self.expect(b']')?;
                checked_len(list)
            }
            _ => self.integer().map(Value::Int),
        }
    }

    fn integer(&mut self) -> Result<u64, String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if start == self.at {
            return Err(self.unexpected("a number, `[` or `(`"));
        }
        std::str::from_utf8(&self.text[start..self.at])
            .ok()
            .and_then(|digits| digits.parse().ok())
            .ok_or_else(|| "a number is too large".to_owned())
    }
}

fn repeat(list: &[u32], times: u64) -> Result<Value, String> {
    let times = usize::try_from(times).unwrap_or(usize::MAX);
    if !list.is_empty() && times > MAX_ENTRIES {
        return Err(format!(
            "the pattern would be longer than {MAX_ENTRIES} layers"
        ));
    }
    checked_len(list.repeat(times))
}

fn checked_len(list: Vec<u32>) -> Result<Value, String> {
    if list.len() > MAX_ENTRIES {
        return Err(format!(
            "the pattern would be longer than {MAX_ENTRIES} layers"
        ));
    }
    Ok(Value::List(list))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ones(pattern: &[bool]) -> Vec<u32> {
        pattern.iter().map(|&b| u32::from(b)).collect()
    }

    #[test]
    fn the_integer_form_makes_every_nth_layer_moe_from_layer_zero() {
        let pattern = LayerFreq::Every(2).pattern(5).expect("valid");
        assert_eq!(ones(&pattern), [1, 0, 1, 0, 1]);
        assert_eq!(LayerFreq::Every(0).pattern(5), Err(LayerFreqError::Zero));
    }

    /// Python's `eval` of the examples in Megatron's `--moe-layer-freq` help and DeepSeek-V3's.
    #[test]
    fn megatron_expressions_evaluate_as_python_does() {
        let cases: [(&str, Vec<u32>); 5] = [
            ("([1]*3+[0]*1)*3", [1, 1, 1, 0].repeat(3)),
            ("([0]+[1]*23)", [vec![0], vec![1; 23]].concat()),
            ("([1]*3+[0]*2)*2", [1, 1, 1, 0, 0].repeat(2)),
            ("([0]*3+[1]*58)", [vec![0; 3], vec![1; 58]].concat()),
            ("2*[0,1,]+[1]*(1+1)", vec![0, 1, 0, 1, 1, 1]),
        ];
        for (text, expected) in cases {
            let freq = LayerFreq::Expression(text.to_owned());
            let layers = expected.len() as u32;
            assert_eq!(ones(&freq.pattern(layers).expect(text)), expected, "{text}");
        }
    }

    /// Megatron's `moe_freq_type` reads a string without `[` as `int(x)`.
    #[test]
    fn a_number_in_a_string_is_the_integer_form() {
        let freq = LayerFreq::Expression("2".into());
        assert_eq!(freq.every(), Some(2));
        assert_eq!(freq.pattern(4), LayerFreq::Every(2).pattern(4));
        assert_eq!(freq.canonical(4), LayerFreq::Every(2));
        assert_eq!(LayerFreq::Expression("[1]*2".into()).every(), None);
    }

    #[test]
    fn malformed_expressions_say_what_is_wrong() {
        let error = |text: &str| match LayerFreq::Expression(text.to_owned()).pattern(4) {
            Err(LayerFreqError::Expression(message)) => message,
            other => panic!("{text}: {other:?}"),
        };
        assert!(error("[0] * 4").contains("not ` `"), "{}", error("[0] * 4"));
        assert!(error("([0]*4").contains("expected `)`"));
        assert!(error("[0]*[1]").contains("cannot be multiplied"));
        assert!(error("[0]+4").contains("not a list and a number"));
        assert!(error("4*[1]*(1").contains("expected `)`"));
        assert!(error("two").contains("neither a number nor a list pattern"));
        assert!(error("[1]*99999999999999999999").contains("too large"));
        assert!(error("[1]*2000").contains("longer than 1024"));
    }

    #[test]
    fn lists_are_checked_for_length_and_values() {
        let list = LayerFreq::Pattern(vec![0, 1, 2]);
        assert_eq!(
            list.pattern(4),
            Err(LayerFreqError::Length {
                found: 3,
                num_layers: 4
            })
        );
        assert_eq!(
            list.pattern(3),
            Err(LayerFreqError::Value { index: 2, value: 2 })
        );
    }

    #[test]
    fn the_canonical_form_is_the_integer_where_one_exists() {
        assert_eq!(
            LayerFreq::Pattern(vec![1, 0, 1, 0]).canonical(4),
            LayerFreq::Every(2)
        );
        assert_eq!(LayerFreq::Every(3).canonical(4), LayerFreq::Every(3));
        assert_eq!(
            LayerFreq::Expression("[0]+[1]*3".into()).canonical(4),
            LayerFreq::Pattern(vec![0, 1, 1, 1])
        );
    }

    #[test]
    fn the_integer_form_serializes_as_before() {
        assert_eq!(
            serde_json::to_value(LayerFreq::Every(2)).ok(),
            Some(2.into())
        );
        let parsed: LayerFreq = serde_json::from_value(serde_json::json!([0, 1])).expect("list");
        assert_eq!(parsed, LayerFreq::Pattern(vec![0, 1]));
        let parsed: LayerFreq =
            serde_json::from_value(serde_json::json!("([0]+[1])")).expect("string");
        assert_eq!(parsed, LayerFreq::Expression("([0]+[1])".into()));
    }
}
