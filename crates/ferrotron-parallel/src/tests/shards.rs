//! Shard specs: which elements a rank holds, and that placing every rank's shard rebuilds the
//! global tensor exactly once per element.

use burn::tensor::{DType, TensorData};

use crate::{ShardError, ShardSpec, Split};

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

/// Every combination of indices of `spec_of(indices)`, placed into one buffer, covers each
/// element exactly once and reproduces the global values.
fn assert_round_trip(shape: &[usize], counts: &[usize], spec_of: impl Fn(&[usize]) -> ShardSpec) {
    let n: usize = shape.iter().product();
    let global = iota(n);
    let data = TensorData::new(global.clone(), shape.to_vec());
    let mut rebuilt = vec![-1.0f32; n];
    let mut hits = vec![0u32; n];
    let combos: usize = counts.iter().product();
    for combo in 0..combos {
        let mut rest = combo;
        let indices: Vec<usize> = counts
            .iter()
            .map(|&c| {
                let i = rest % c;
                rest /= c;
                i
            })
            .collect();
        let spec = spec_of(&indices);
        let local = spec.slice_of(&data).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(local.shape.to_vec(), spec.local_shape().unwrap());
        spec.place(&local, &mut rebuilt)
            .unwrap_or_else(|err| panic!("{err}"));
        let mut marks = vec![0.0f32; n];
        spec.place_f32(&vec![1.0; local.num_elements()], &mut marks)
            .unwrap_or_else(|err| panic!("{err}"));
        for (h, m) in hits.iter_mut().zip(&marks) {
            *h += *m as u32;
        }
        assert_eq!(
            spec.slice_of_f32(&global).unwrap(),
            local.to_vec::<f32>().unwrap()
        );
    }
    assert_eq!(rebuilt, global, "{shape:?}");
    assert!(hits.iter().all(|&h| h == 1), "{shape:?}: {hits:?}");
}

#[test]
fn a_column_split_holds_contiguous_columns() {
    let spec = ShardSpec::full("w", vec![2, 4]).with_split(Split::new(1, 1, 2));
    let local = spec.slice_of(&TensorData::new(iota(8), [2, 4])).unwrap();
    assert_eq!(local.shape.to_vec(), [2, 2]);
    assert_eq!(local.to_vec::<f32>().unwrap(), [2., 3., 6., 7.]);
}

#[test]
fn a_fused_split_takes_the_piece_of_every_block() {
    // [gate; up] with 4 rows each; tp rank 1 of 2 holds gate rows 2,3 and up rows 6,7.
    let spec = ShardSpec::full("fc1", vec![8, 1]).with_split(Split::fused(0, 2, 1, 2));
    let local = spec.slice_of(&TensorData::new(iota(8), [8, 1])).unwrap();
    assert_eq!(local.to_vec::<f32>().unwrap(), [2., 3., 6., 7.]);
    assert_round_trip(&[8, 3], &[2], |i| {
        ShardSpec::full("fc1", vec![8, 3]).with_split(Split::fused(0, 2, i[0], 2))
    });
}

#[test]
fn splits_of_one_dim_nest_in_order() {
    // 16 rows over ep=2 then etp=2: (ep 0, etp 1) holds rows 4..8.
    let spec = ShardSpec::full("experts", vec![16])
        .with_split(Split::new(0, 0, 2))
        .with_split(Split::new(0, 1, 2));
    let local = spec.slice_of(&TensorData::new(iota(16), [16])).unwrap();
    assert_eq!(local.to_vec::<f32>().unwrap(), [4., 5., 6., 7.]);
    assert_round_trip(&[16, 2], &[2, 2], |i| {
        ShardSpec::full("experts", vec![16, 2])
            .with_split(Split::new(0, i[0], 2))
            .with_split(Split::fused(0, 2, i[1], 2))
    });
}

#[test]
fn splits_of_several_dims_round_trip() {
    assert_round_trip(&[4, 6, 8], &[2, 3, 4], |i| {
        ShardSpec::full("t", vec![4, 6, 8])
            .with_split(Split::new(0, i[0], 2))
            .with_split(Split::new(1, i[1], 3))
            .with_split(Split::fused(2, 2, i[2], 4))
    });
    assert_round_trip(&[6, 4], &[1], |_| ShardSpec::full("replicated", vec![6, 4]));
    assert_round_trip(&[], &[1], |_| ShardSpec::full("scalar", vec![]));
}

#[test]
fn slice_of_keeps_the_dtype() {
    let global = TensorData::new((0..12).map(f64::from).collect::<Vec<_>>(), [3, 4]);
    let spec = ShardSpec::full("w", vec![3, 4]).with_split(Split::new(1, 0, 2));
    let local = spec.slice_of(&global).unwrap();
    assert_eq!(local.dtype, DType::F64);
    assert_eq!(local.to_vec::<f64>().unwrap(), [0., 1., 4., 5., 8., 9.]);
    let mut rebuilt = vec![0.0f32; 12];
    spec.place(&local, &mut rebuilt).unwrap();
    assert_eq!(rebuilt[..6], [0., 1., 0., 0., 4., 5.]);
}

#[test]
fn bad_specs_and_buffers_are_errors() {
    let data = TensorData::new(iota(6), [2, 3]);
    let split = |s: Split| ShardSpec::full("w", vec![2, 3]).with_split(s);
    let why = |spec: ShardSpec| match spec.slice_of(&data) {
        Err(ShardError::InvalidSplit { why, .. }) => why,
        other => panic!("expected an invalid split, got {other:?}"),
    };
    assert_eq!(
        why(split(Split::new(1, 0, 2))),
        "the dim is not divisible by parts × count"
    );
    assert_eq!(why(split(Split::new(2, 0, 1))), "dim out of range");
    assert_eq!(why(split(Split::new(0, 2, 2))), "index must be below count");
    assert_eq!(
        why(split(Split::fused(0, 0, 0, 1))),
        "parts and count must be at least 1"
    );
    let spec = ShardSpec::full("w", vec![3, 2]);
    let err = spec.slice_of(&data).unwrap_err();
    assert_eq!(
        err.to_string(),
        "shard of `w`: expected a global tensor of shape [3, 2], got [2, 3]"
    );
    let err = spec.place_f32(&iota(6), &mut [0.0; 5]).unwrap_err();
    assert!(matches!(
        err,
        ShardError::BufferLength {
            expected: 6,
            actual: 5,
            ..
        }
    ));
    let err = spec.place(&data, &mut [0.0; 6]).unwrap_err();
    assert!(matches!(
        err,
        ShardError::ShapeMismatch {
            what: "local tensor",
            ..
        }
    ));
}

#[test]
fn specs_round_trip_through_json() {
    let spec = ShardSpec::full("decoder.layers.0.mlp.fc1.weight", vec![8, 4])
        .with_split(Split::fused(0, 2, 1, 2));
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(
        json,
        r#"{"global_name":"decoder.layers.0.mlp.fc1.weight","global_shape":[8,4],"splits":[{"dim":0,"parts":2,"index":1,"count":2}]}"#
    );
    assert_eq!(serde_json::from_str::<ShardSpec>(&json).unwrap(), spec);
    assert!(spec.is_split() && !ShardSpec::full("b", vec![4]).is_split());
}
