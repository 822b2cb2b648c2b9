//! All-reduce throughput of the in-process communicator on 2–4 thread ranks.
//!
//! Criterion's throughput is the algorithm bandwidth (buffer bytes / time per all-reduce);
//! nccl-tests' bus bandwidth is that × 2(n−1)/n. Each sample starts one world and times
//! `iters` back-to-back all-reduces on rank 0 between two barriers, after one untimed
//! all-reduce, so thread start-up and first-touch page faults are not measured (steady state,
//! as in a training loop).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_dist::{Communicator, ReduceOp, World};

fn time_all_reduces(ranks: u32, elements: usize, iters: u64) -> Duration {
    let times = World::new(ranks)
        .run(|ctx| {
            let comm = ctx.world();
            let mut buf = vec![ctx.rank() as f32; elements];
            // One untimed call allocates the rendezvous buffers the timed ones reuse.
            comm.all_reduce(&mut buf, ReduceOp::Sum)?;
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..iters {
                comm.all_reduce(&mut buf, ReduceOp::Sum)?;
            }
            comm.barrier()?;
            black_box(&buf);
            Ok::<_, ferrotron_dist::CommError>(start.elapsed())
        })
        .expect("the benchmark world runs");
    times[0]
}

fn all_reduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("all_reduce_f32");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for (label, bytes) in [("1MiB", 1usize << 20), ("64MiB", 64 << 20)] {
        let elements = bytes / size_of::<f32>();
        group.throughput(Throughput::Bytes(bytes as u64));
        for ranks in 2..=4 {
            group.bench_with_input(
                BenchmarkId::new(label, format!("{ranks}ranks")),
                &ranks,
                |b, &ranks| b.iter_custom(|iters| time_all_reduces(ranks, elements, iters)),
            );
        }
    }
    group.finish();
}

/// One thread copying the same buffer: the machine's memory bandwidth, for scale. An
/// all-reduce moves each byte several times (copy in, reduce, copy out).
fn copy_baseline(c: &mut Criterion) {
    let mut group = c.benchmark_group("copy_baseline");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for (label, bytes) in [("1MiB", 1usize << 20), ("64MiB", 64 << 20)] {
        let source = vec![1.0f32; bytes / size_of::<f32>()];
        let mut target = vec![0.0f32; source.len()];
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(label, |b| {
            b.iter(|| target.copy_from_slice(black_box(&source)));
        });
    }
    group.finish();
}

criterion_group!(benches, all_reduce, copy_baseline);
criterion_main!(benches);
