//! Re-padding the vocabulary dimension. Megatron pads the vocabulary to a multiple of
//! `make_vocab_size_divisible_by × tp`, so the same model has 50,304 embedding rows at tp 1 and
//! 50,432 at tp 2: without this, a GPT-2-vocabulary run saved under tp2 could not resume under
//! tp1. Rows below the real vocabulary are the model; padding rows are never a target and
//! only enter the softmax's denominator. So the rows both layouts have are kept, rows the new
//! layout drops are dropped (never real tokens: the real vocabulary must fit), and rows it adds
//! take the mean of the checkpoint's padding rows — what training made of never-seen tokens —
//! or zeros when the checkpoint had none.

/// `values` (row-major in `shape`) with dim `dim` re-sized to `rows`.
pub(super) fn repad(
    values: &[f32],
    shape: &[usize],
    dim: usize,
    real_vocab: usize,
    rows: usize,
) -> Vec<f32> {
    let old_rows = shape[dim];
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let padding = real_vocab.min(old_rows)..old_rows;
    let mut out = Vec::with_capacity(outer * rows * inner);
    for o in 0..outer {
        let row_at = |row: usize| {
            let start = (o * old_rows + row) * inner;
            &values[start..start + inner]
        };
        // what this slice's padding rows hold on average (zeros when there are none)
        let mut fill = vec![0.0f32; inner];
        for row in padding.clone() {
            for (f, v) in fill.iter_mut().zip(row_at(row)) {
                *f += v / padding.len() as f32;
            }
        }
        for row in 0..rows {
            if row < old_rows {
                out.extend_from_slice(row_at(row));
            } else {
                out.extend_from_slice(&fill);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::repad;

    #[test]
    fn rows_are_kept_dropped_or_filled_with_the_padding_mean() {
        // 4 rows of 2 (real vocabulary 2, padding rows 2 and 3)
        let values = [1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
        assert_eq!(
            repad(&values, &[4, 2], 0, 2, 3),
            [1.0, 2.0, 3.0, 4.0, 10.0, 20.0]
        );
        assert_eq!(
            repad(&values, &[4, 2], 0, 2, 6),
            [
                1.0, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0, 20.0, 30.0, 20.0, 30.0
            ]
        );
        // the vocabulary along dim 1 (an output layer stored [hidden, vocab]), padding column 2
        let columns = [1.0, 2.0, 5.0, 3.0, 4.0, 7.0];
        assert_eq!(
            repad(&columns, &[2, 3], 1, 2, 4),
            [1.0, 2.0, 5.0, 5.0, 3.0, 4.0, 7.0, 7.0]
        );
        // no padding rows in the checkpoint: zeros
        assert_eq!(repad(&[1.0, 2.0], &[1, 2], 1, 2, 3), [1.0, 2.0, 0.0]);
    }
}
