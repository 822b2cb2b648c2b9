//! The default (forward-only) implementations on a plain backend, in a non-f32 dtype, and the
//! point-to-point tensor helpers.

use burn::backend::Flex;
use burn::tensor::{DType, FloatDType, Tensor, TensorData};

use super::{assert_close, chunk, flat, on_ranks, values};
use crate::collectives::{
    gather_from_region, recv_tensor, reduce_from_region, reduce_scatter_to_sequence_region,
    send_tensor,
};

fn bf16_tensor(shape: [usize; 2], seed: f32) -> Tensor<Flex, 2> {
    Tensor::<Flex, 2>::from_data(
        TensorData::new(values(&shape, seed), shape),
        &Default::default(),
    )
    .cast(FloatDType::BF16)
}

/// bf16 in, bf16 out; the values are those of the bf16 inputs combined in f32 and rounded once.
#[test]
fn plain_backend_collectives_keep_the_dtype() {
    let results = on_ranks(2, |comm| {
        let r = comm.rank();
        let full = bf16_tensor([4, 6], 0.3);
        let gathered = gather_from_region(chunk(full.clone(), 1, r, 2), 1, &comm);
        let summed = reduce_from_region(full.clone(), &comm);
        let scattered = reduce_scatter_to_sequence_region(full.clone(), 0, &comm);
        (
            [gathered.dtype(), summed.dtype(), scattered.dtype()],
            flat(full),
            flat(gathered),
            flat(summed),
            flat(scattered),
        )
    });
    for (r, (dtypes, full, gathered, summed, scattered)) in results.into_iter().enumerate() {
        assert_eq!(dtypes, [DType::BF16; 3]);
        assert_eq!(gathered, full);
        let doubled: Vec<f32> = full.iter().map(|x| 2.0 * x).collect();
        assert_close(&summed, &doubled, "sum");
        assert_close(&scattered, &doubled[r * 12..(r + 1) * 12], "reduce-scatter");
    }
}

#[test]
fn tensors_travel_point_to_point() {
    let results = on_ranks(2, |comm| {
        let device = Default::default();
        if comm.rank() == 0 {
            let x = Tensor::<Flex, 3>::from_data(
                TensorData::new(values(&[2, 3, 2], 0.9), [2, 3, 2]),
                &device,
            );
            send_tensor(&x, 1, &comm)?;
            Ok::<_, ferrotron_dist::CommError>(Vec::new())
        } else {
            Ok(flat(recv_tensor::<Flex, 3>([2, 3, 2], 0, &comm, &device)?))
        }
    });
    let received = results[1].as_ref().unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(*received, values(&[2, 3, 2], 0.9));
}
