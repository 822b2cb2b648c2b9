//! The MoE combine: the autodiff node (driven by the reference kernels) against the composed
//! gather, multiply and sum, with and without dropped slots; a dropped slot adds nothing and
//! its weight gets no gradient.

use burn::backend::Flex;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use super::{B, assert_close, flat, tensor};
use crate::{CombineIndex, CombineSpec, FusedOps, combine_rows, combine_rows_node};

fn ints(values: &[i64]) -> Tensor<B, 1, Int> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        &Default::default(),
    )
}

const TOPK: usize = 2;
const HIDDEN: usize = 5;

/// Four tokens' two slots over `rows` expert rows: `index` (slot → row, `rows` where dropped)
/// and `back` (row → slot).
fn routing(dropped: bool) -> (usize, Vec<i64>, Vec<i64>) {
    let index: Vec<i64> = if dropped {
        vec![3, 0, 6, 5, 1, 6, 2, 4]
    } else {
        vec![3, 0, 7, 5, 1, 6, 2, 4]
    };
    let rows = if dropped { 6 } else { 8 };
    let mut back = vec![0; rows];
    for (slot, &row) in index.iter().enumerate() {
        if (row as usize) < rows {
            back[row as usize] = slot as i64;
        }
    }
    (rows, index, back)
}

/// Output, rows' gradient and weights' gradient under a fixed weighting of the output, by the
/// node (`NODE`) or the composed graph.
fn run<const NODE: bool>(dropped: bool) -> [Vec<f32>; 3] {
    let (rows, index, back) = routing(dropped);
    let x = tensor([rows, HIDDEN], 0.4).require_grad();
    let weights = tensor([4 * TOPK], 1.1).require_grad();
    let spec = CombineSpec {
        topk: TOPK,
        dropped,
    };
    let out: Tensor<B, 2> = if NODE {
        Tensor::from_primitive(TensorPrimitive::Float(combine_rows_node::<
            Flex,
            NoCheckpointing,
        >(
            x.clone().into_primitive().tensor(),
            CombineIndex {
                index: ints(&index).into_primitive(),
                back: ints(&back).into_primitive(),
            },
            weights.clone().into_primitive().tensor(),
            spec,
        )))
    } else {
        combine_rows(x.clone(), ints(&index), ints(&back), weights.clone(), spec)
    };
    let grads = (out.clone() * tensor([4, HIDDEN], 2.3)).sum().backward();
    [
        flat(out),
        flat(x.grad(&grads).expect("a rows gradient")),
        flat(weights.grad(&grads).expect("a weights gradient")),
    ]
}

#[test]
fn combine_node_equals_the_composed_graph_with_and_without_dropped_slots() {
    assert!(!Flex::has_combine_rows_kernel(
        &tensor([8, HIDDEN], 0.4).inner().into_primitive().tensor(),
        &tensor([8], 1.1).inner().into_primitive().tensor(),
        &CombineSpec {
            topk: TOPK,
            dropped: false
        },
    ));
    for dropped in [false, true] {
        let node = run::<true>(dropped);
        let composed = run::<false>(dropped);
        for (what, (n, c)) in ["output", "rows gradient", "weights gradient"]
            .iter()
            .zip(node.iter().zip(&composed))
        {
            assert_close(n, c, &format!("{what}, dropped {dropped}"));
            assert!(n.iter().any(|v| v.abs() > 1e-3), "{what} is all zeros");
        }
    }
}

#[test]
fn a_dropped_slot_adds_nothing_and_its_weight_gets_no_gradient() {
    let (rows, index, _) = routing(true);
    let [out, _, d_weights] = run::<true>(true);
    let x = flat(tensor([rows, HIDDEN], 0.4));
    let w = flat(tensor([4 * TOPK], 1.1));
    // token 1: slot 2 dropped, slot 3 reads row 5, so its output is w[3] · x[5]
    for h in 0..HIDDEN {
        let want = w[3] * x[5 * HIDDEN + h];
        assert!(
            (out[HIDDEN + h] - want).abs() <= 1e-6,
            "token 1, column {h}"
        );
    }
    assert_eq!(index[2] as usize, rows);
    assert_eq!(d_weights[2], 0.0);
    assert_eq!(d_weights[5], 0.0);
}
