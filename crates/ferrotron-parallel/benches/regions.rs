//! Cost of the host round trip behind the default region operators on 2 thread ranks: a
//! sequence-parallel all-gather (forward) and its reduce-scatter (backward) of a
//! `[batch, seq/2, hidden]` activation, and a row-parallel all-reduce. What the CPU runtime pays
//! per transformer layer boundary; a device-side NCCL override would replace it on GPUs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_dist::{CommError, Communicator, World};
use ferrotron_parallel::Comm;
use ferrotron_parallel::collectives::{
    gather_from_sequence_region, reduce_from_region, reduce_scatter_to_sequence_region,
};

type B = Autodiff<Flex>;
const SHAPE: [usize; 3] = [4, 128, 512];

/// Runs `step` `iters` times on each of 2 ranks; returns rank 0's wall time.
fn timed(iters: u64, step: impl Fn(&Comm, Tensor<B, 3>) + Sync) -> Duration {
    let times = World::new(2)
        .run(|ctx| {
            let comm: Comm = Arc::new(ctx.world().new_group("tp", &[0, 1])?);
            let n: usize = SHAPE.iter().product();
            let data = TensorData::new(vec![0.5f32; n / 2], [SHAPE[0], SHAPE[1] / 2, SHAPE[2]]);
            let x = Tensor::<B, 3>::from_data(data, &Default::default());
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..iters {
                step(&comm, x.clone());
            }
            Ok::<_, CommError>(start.elapsed())
        })
        .unwrap_or_else(|err| panic!("{err}"));
    times[0]
}

fn regions(c: &mut Criterion) {
    let mut group = c.benchmark_group("regions_2_ranks");
    let bytes = (SHAPE.iter().product::<usize>() * 4) as u64;
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(10);
    group.bench_function("sp_gather_fwd_bwd_4x128x512", |b| {
        b.iter_custom(|iters| {
            timed(iters, |comm, x| {
                let x = x.require_grad();
                let y = gather_from_sequence_region(x.clone(), 1, comm);
                let grads = y.sum().backward();
                std::hint::black_box(x.grad(&grads));
            })
        })
    });
    // The same graph shape without communication (concatenating the local half with itself):
    // what burn's autodiff costs on its own, to read the line above against.
    group.bench_function("baseline_local_cat_fwd_bwd_4x128x512", |b| {
        b.iter_custom(|iters| {
            timed(iters, |_comm, x| {
                let x = x.require_grad();
                let y = Tensor::cat(vec![x.clone(), x.clone()], 1);
                let grads = y.sum().backward();
                std::hint::black_box(x.grad(&grads));
            })
        })
    });
    group.bench_function("sp_gather_fwd_4x128x512", |b| {
        b.iter_custom(|iters| {
            timed(iters, |comm, x| {
                std::hint::black_box(gather_from_sequence_region(x, 1, comm));
            })
        })
    });
    group.bench_function("sp_reduce_scatter_fwd_4x64x512", |b| {
        b.iter_custom(|iters| {
            timed(iters, |comm, x| {
                std::hint::black_box(reduce_scatter_to_sequence_region(x, 1, comm));
            })
        })
    });
    group.bench_function("all_reduce_fwd_4x64x512", |b| {
        b.iter_custom(|iters| {
            timed(iters, |comm, x| {
                std::hint::black_box(reduce_from_region(x, comm));
            })
        })
    });
    group.finish();
}

criterion_group!(benches, regions);
criterion_main!(benches);
