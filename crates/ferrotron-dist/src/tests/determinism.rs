//! All-reduce sums in rank order whatever the arrival order: bit-identical across runs and
//! equal to a sequential loop over the ranks.

use std::time::Duration;

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::on_ranks;
use crate::{Communicator, ReduceOp};

const RANKS: u32 = 4;
const LEN: usize = 1001;

/// Values spanning many magnitudes, so that summation order changes the rounding.
fn inputs() -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(7);
    (0..RANKS)
        .map(|_| {
            (0..LEN)
                .map(|_| rng.random_range(-1.0f32..1.0) * 10f32.powi(rng.random_range(-6..7)))
                .collect()
        })
        .collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn all_reduce_is_bit_identical_across_runs_with_random_arrival_delays() {
    let inputs = inputs();
    let sequential: Vec<f32> = (0..LEN)
        .map(|i| {
            let mut acc = inputs[0][i];
            for rank in &inputs[1..] {
                acc += rank[i];
            }
            acc
        })
        .collect();
    let reversed: Vec<f32> = (0..LEN)
        .map(|i| inputs.iter().rev().map(|rank| rank[i]).sum())
        .collect();
    assert_ne!(
        bits(&sequential),
        bits(&reversed),
        "the data must be order-sensitive for this test to mean anything"
    );
    for run in 0..20u64 {
        let results = on_ranks(RANKS, |ctx| {
            let mut rng = StdRng::seed_from_u64(run * 31 + u64::from(ctx.rank()));
            let mut buf = inputs[ctx.rank() as usize].clone();
            let mut half: Vec<bf16> = buf.iter().map(|&v| bf16::from_f32(v)).collect();
            std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
            ctx.world().all_reduce(&mut buf, ReduceOp::Sum)?;
            std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
            ctx.world().all_reduce(&mut half, ReduceOp::Sum)?;
            Ok((buf, half))
        });
        let half_reference: Vec<bf16> = (0..LEN)
            .map(|i| {
                let mut acc = bf16::from_f32(inputs[0][i]);
                for rank in &inputs[1..] {
                    acc += bf16::from_f32(rank[i]);
                }
                acc
            })
            .collect();
        for (rank, (sum, half)) in results.iter().enumerate() {
            assert_eq!(bits(sum), bits(&sequential), "run {run}, rank {rank}");
            assert!(
                half.iter()
                    .zip(&half_reference)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "run {run}, rank {rank}: bf16"
            );
        }
    }
}
