//! The sweep file: a base recipe plus axes over dot-paths.
//!
//! Values stay as JSON values (not typed) on purpose: a sweep may vary any recipe key, and the
//! recipe loader, fed the same `dot.path=value` strings as `--set`, is what judges them. Axis
//! order is kept as written because it decides member order and names.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::SweepError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepFile {
    sweep: SweepBody,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepBody {
    name: String,
    base: String,
    #[serde(default)]
    set: Map<String, Value>,
    #[serde(default)]
    grid: Map<String, Value>,
    #[serde(default)]
    zip: Map<String, Value>,
    #[serde(default)]
    seeds: Vec<u64>,
}

/// One varied key and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub key: String,
    pub values: Vec<Value>,
}

/// A parsed and checked sweep file.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    pub name: String,
    /// The sweep file, as given.
    pub path: PathBuf,
    /// The base recipe, resolved against the sweep file's directory.
    pub base: PathBuf,
    /// Applied to every member, in file order.
    pub set: Vec<(String, Value)>,
    /// Cartesian product, first axis outermost.
    pub grid: Vec<Axis>,
    /// Varied together: the i-th values of every axis form one point.
    pub zip: Vec<Axis>,
    /// `training.seed` values, innermost.
    pub seeds: Vec<u64>,
}

impl SweepSpec {
    /// Reads and checks a sweep file.
    pub fn load(path: &Path) -> Result<SweepSpec, SweepError> {
        let text = ferrotron_recipe::read_text(path).map_err(|source| SweepError::ReadSpec {
            path: path.to_path_buf(),
            source,
        })?;
        SweepSpec::parse(path, &text)
    }

    /// Parses sweep text; `path` names it in errors and anchors the relative `base`.
    pub fn parse(path: &Path, text: &str) -> Result<SweepSpec, SweepError> {
        let file: SweepFile = serde_saphyr::from_str(text).map_err(|e| SweepError::ParseSpec {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let body = file.sweep;
        let invalid = |message: String| SweepError::InvalidSpec {
            path: path.to_path_buf(),
            message,
        };
        if body.name.is_empty()
            || !body
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(invalid(format!(
                "sweep.name `{}` must be non-empty and use only letters, digits, `-`, `_` and `.` (it names directories)",
                body.name
            )));
        }
        let grid = axes("grid", body.grid).map_err(invalid)?;
        let zip = axes("zip", body.zip).map_err(invalid)?;
        if let Some(first) = zip.first()
            && let Some(odd) = zip.iter().find(|a| a.values.len() != first.values.len())
        {
            return Err(invalid(format!(
                "sweep.zip lists must have the same length: `{}` has {}, `{}` has {}",
                first.key,
                first.values.len(),
                odd.key,
                odd.values.len()
            )));
        }
        let set: Vec<(String, Value)> = body.set.into_iter().collect();
        let mut seen: Vec<&str> = Vec::new();
        let seed_key = (!body.seeds.is_empty()).then_some(SEED_KEY);
        let keys = set
            .iter()
            .map(|(k, _)| k.as_str())
            .chain(grid.iter().chain(&zip).map(|a| a.key.as_str()))
            .chain(seed_key);
        for key in keys {
            if seen.contains(&key) {
                return Err(invalid(format!(
                    "`{key}` is given more than once across set, grid, zip and seeds"
                )));
            }
            seen.push(key);
        }
        let dir = path.parent().unwrap_or(Path::new(""));
        Ok(SweepSpec {
            name: body.name,
            path: path.to_path_buf(),
            base: dir.join(&body.base),
            set,
            grid,
            zip,
            seeds: body.seeds,
        })
    }

    /// Members the sweep expands to: product of grid sizes × zip length × seed count.
    pub fn member_count(&self) -> usize {
        let grid: usize = self.grid.iter().map(|a| a.values.len()).product();
        let zip = self.zip.first().map_or(1, |a| a.values.len());
        grid * zip * self.seeds.len().max(1)
    }
}

/// The recipe key `seeds` sets.
pub const SEED_KEY: &str = "training.seed";

fn axes(section: &str, map: Map<String, Value>) -> Result<Vec<Axis>, String> {
    map.into_iter()
        .map(|(key, value)| match value {
            Value::Array(values) if !values.is_empty() => Ok(Axis { key, values }),
            Value::Array(_) => Err(format!("sweep.{section}.{key} is an empty list")),
            other => Err(format!(
                "sweep.{section}.{key} must be a list of values, not `{other}`"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SweepSpec, SweepError> {
        SweepSpec::parse(Path::new("sweeps/s.yaml"), text)
    }

    #[test]
    fn the_documented_shape_parses_in_order() {
        let spec = parse(
            "sweep:\n  name: lr-scan\n  base: ../tiny.yaml\n  set: { training.train_iters: 200 }\n  \
             grid: { training.optimizer.lr: [3.0e-4, 1.0e-3], parallel.tensor: [1, 2] }\n  \
             zip: { model.num_layers: [2, 4], model.hidden_size: [128, 256] }\n  seeds: [1, 2]\n",
        )
        .unwrap();
        assert_eq!(spec.base, Path::new("sweeps/../tiny.yaml"));
        assert_eq!(spec.grid[0].key, "training.optimizer.lr");
        assert_eq!(spec.grid[1].key, "parallel.tensor");
        assert_eq!(spec.zip[1].key, "model.hidden_size");
        assert_eq!(spec.member_count(), 2 * 2 * 2 * 2);
    }

    #[test]
    fn mismatched_zip_lengths_are_refused() {
        let err = parse("sweep:\n  name: z\n  base: b.yaml\n  zip: { a.b: [1, 2], c.d: [1] }\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("same length") && err.contains("c.d"), "{err}");
    }

    #[test]
    fn empty_axes_duplicates_and_bad_names_are_refused() {
        let err = parse("sweep:\n  name: z\n  base: b.yaml\n  grid: { a.b: [] }\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty list"), "{err}");
        let err = parse(
            "sweep:\n  name: z\n  base: b.yaml\n  grid: { training.seed: [1] }\n  seeds: [3]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("more than once"), "{err}");
        let err = parse("sweep:\n  name: a/b\n  base: b.yaml\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sweep.name"), "{err}");
        let err = parse("sweep:\n  name: a\n  base: b.yaml\n  gird: {}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gird"), "{err}");
    }

    #[test]
    fn a_sweep_without_axes_is_one_member() {
        let spec = parse("sweep:\n  name: one\n  base: b.yaml\n").unwrap();
        assert_eq!(spec.member_count(), 1);
    }
}
