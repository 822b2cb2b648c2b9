//! Megatron's split string ("969,30,1") and how it cuts a dataset's documents into train,
//! validation and test ranges (`parse_and_normalize_split`, `convert_split_vector_to_split_matrix`
//! and the rounding in `BlendedMegatronDatasetBuilder._build_megatron_dataset_splits`).

use std::ops::Range;

use crate::DataError;

/// Train, validation, test.
pub const SPLIT_NAMES: [&str; 3] = ["train", "valid", "test"];

/// The normalised split: for each of train/valid/test the `[begin, end)` fraction of the
/// documents, or `None` when the split is empty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SplitMatrix(pub [Option<(f64, f64)>; 3]);

impl SplitMatrix {
    /// Parses a split string the way Megatron does: every run of digits and dots is a number
    /// ("969,30,1", "98 2", "0.9/0.1"); missing trailing parts are 0; the parts are normalised.
    pub fn parse(split: &str) -> Result<Self, DataError> {
        let fail = |problem: String| DataError::Split {
            split: split.to_owned(),
            problem,
        };
        let mut parts = Vec::new();
        for token in split
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|t| !t.is_empty())
        {
            let value: f64 = token
                .parse()
                .map_err(|_| fail(format!("{token:?} is not a number")))?;
            parts.push(value);
        }
        if parts.is_empty() {
            return Err(fail(
                "expected up to three numbers such as \"969,30,1\"".into(),
            ));
        }
        if parts.len() > 3 {
            return Err(fail(format!(
                "{} numbers; a split has train, valid and test parts only",
                parts.len()
            )));
        }
        parts.resize(3, 0.0);
        let total: f64 = parts.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            return Err(fail("the parts must add up to more than zero".into()));
        }
        let mut begin = 0.0;
        let mut matrix = [None; 3];
        for (slot, part) in matrix.iter_mut().zip(&parts) {
            let end = begin + part / total;
            if end > begin {
                *slot = Some((begin, end));
            }
            begin = end;
        }
        Ok(SplitMatrix(matrix))
    }

    /// The document range of split `which` (0 train, 1 valid, 2 test) in a dataset of
    /// `documents` documents, with Python's round-half-to-even as Megatron computes it.
    pub fn documents(&self, which: usize, documents: usize) -> Option<Range<usize>> {
        self.0[which].map(|(begin, end)| {
            let n = documents as f64;
            let start = (begin * n).round_ties_even() as usize;
            let stop = (end * n).round_ties_even() as usize;
            start..stop.max(start)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megatron_default_split() {
        let m = SplitMatrix::parse("969,30,1").unwrap();
        assert_eq!(m.documents(0, 1000), Some(0..969));
        assert_eq!(m.documents(1, 1000), Some(969..999));
        assert_eq!(m.documents(2, 1000), Some(999..1000));
        // 157 documents: train round(152.133) = 152, valid up to round(156.843) = 157.
        assert_eq!(m.documents(0, 157), Some(0..152));
        assert_eq!(m.documents(1, 157), Some(152..157));
        assert_eq!(m.documents(2, 157), Some(157..157));
    }

    #[test]
    fn missing_parts_are_empty_splits() {
        let m = SplitMatrix::parse("98 2").unwrap();
        assert_eq!(m.documents(0, 100), Some(0..98));
        assert_eq!(m.documents(1, 100), Some(98..100));
        assert_eq!(m.documents(2, 100), None);
        let m = SplitMatrix::parse("100,0,0").unwrap();
        assert_eq!(m.documents(1, 100), None);
    }

    #[test]
    fn rounding_is_half_to_even() {
        let m = SplitMatrix::parse("1,1").unwrap();
        // 0.5 × 5 = 2.5 rounds to 2 in Python.
        assert_eq!(m.documents(0, 5), Some(0..2));
        assert_eq!(m.documents(1, 5), Some(2..5));
    }

    #[test]
    fn bad_splits_are_explained() {
        for (split, needle) in [
            ("", "expected up to three"),
            ("1,2,3,4", "4 numbers"),
            ("0,0,0", "more than zero"),
            ("1.2.3,4", "not a number"),
        ] {
            let err = SplitMatrix::parse(split).unwrap_err().to_string();
            assert!(err.contains(needle), "{split}: {err}");
        }
    }
}
