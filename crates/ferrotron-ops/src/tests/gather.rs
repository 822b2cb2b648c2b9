//! Row gathers differentiated by gathers: the node's gradients equal burn's `select` graph (a
//! scatter-add), bit for bit when each row is read twice (top-2 routing's dispatch), and to
//! rounding when more often.

use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::FusedOps;

fn ints(values: &[i64]) -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        &Default::default(),
    )
}

/// `x [4, 3]` read `group` times per row through `index`; `back` lists, per row of `x`, the
/// output rows that read it. Output and `x`'s gradient under a fixed weighting, by the node
/// (`FUSED`) or by `select`.
fn run<const FUSED: bool>(index: &[i64], back: &[i64], group: usize) -> [Vec<f32>; 2] {
    let x = tensor([4, 3], 0.8).require_grad();
    let out: Tensor<B, 2> = if FUSED {
        Tensor::from_primitive(TensorPrimitive::Float(B::gather_rows(
            x.clone().into_primitive().tensor(),
            ints(index).into_primitive(),
            ints(back).into_primitive(),
            group,
        )))
    } else {
        x.clone().select(0, ints(index))
    };
    let grads = (out.clone() * tensor([index.len(), 3], 1.3))
        .sum()
        .backward();
    [flat(out), flat(x.grad(&grads).expect("an x gradient"))]
}

/// The rows of `x` each output row reads, and per row of `x` the output rows reading it.
fn routing(group: usize) -> (Vec<i64>, Vec<i64>) {
    // Output row r reads x row (3r + ⌊r/4⌋) mod 4: each block of four output rows reads every
    // row of x once, in a shuffled order, so each row is read `group` times.
    let reads: Vec<i64> = (0..4 * group as i64).map(|r| (r * 3 + r / 4) % 4).collect();
    let mut back = Vec::new();
    for row in 0..4 {
        back.extend(
            reads
                .iter()
                .enumerate()
                .filter(|&(_, &read)| read == row)
                .map(|(r, _)| r as i64),
        );
    }
    (reads, back)
}

#[test]
fn gather_rows_of_a_permutation_and_of_pairs_are_select_bit_for_bit() {
    for group in [1, 2] {
        let (index, back) = routing(group);
        let node = run::<true>(&index, &back, group);
        let select = run::<false>(&index, &back, group);
        for (node, select) in node.iter().zip(&select) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(node), bits(select), "group {group}");
        }
    }
}

#[test]
fn gather_rows_of_larger_groups_equal_select_to_rounding() {
    let (index, back) = routing(4);
    let node = run::<true>(&index, &back, 4);
    let select = run::<false>(&index, &back, 4);
    assert_close(&node[0], &select[0], "output");
    assert_close(&node[1], &select[1], "x gradient");
}

#[test]
#[should_panic(expected = "need as many back indices")]
fn gather_rows_refuses_a_short_back_index() {
    run::<true>(&[0, 1], &[0, 1], 2);
}
