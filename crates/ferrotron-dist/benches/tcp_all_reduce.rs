//! All-reduce throughput of the TCP communicator on 2–4 ranks over loopback.
//!
//! Each rank is a thread with its own TCP world (sockets, reader threads, encoding: everything a
//! process world does), so the figures are what a CPU job of N tasks on one node gets. As in
//! the thread-communicator bench, throughput is the algorithm bandwidth (buffer bytes / time);
//! the world is formed outside the timed region and one untimed all-reduce warms it up.

use std::hint::black_box;
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_dist::{Communicator, ReduceOp, TcpComm, TcpConfig};

fn time_all_reduces(ranks: u32, elements: usize, iters: u64) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("bound").port();
    let mut listener = Some(listener);
    thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let listener = if rank == 0 { listener.take() } else { None };
                scope.spawn(move || {
                    let config = TcpConfig {
                        timeout: Duration::from_secs(120),
                        ..TcpConfig::new(rank, ranks, "127.0.0.1", port)
                    };
                    let comm = match listener {
                        Some(listener) => TcpComm::serve(listener, &config),
                        None => TcpComm::connect(&config),
                    }
                    .expect("the benchmark world forms");
                    let mut buf = vec![rank as f32; elements];
                    comm.all_reduce(&mut buf, ReduceOp::Sum).expect("warm-up");
                    comm.barrier().expect("barrier");
                    let start = Instant::now();
                    for _ in 0..iters {
                        comm.all_reduce(&mut buf, ReduceOp::Sum)
                            .expect("all_reduce");
                    }
                    comm.barrier().expect("barrier");
                    black_box(&buf);
                    start.elapsed()
                })
            })
            .collect();
        let times: Vec<Duration> = handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect();
        times[0]
    })
}

fn tcp_all_reduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("tcp_all_reduce_f32");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for (label, bytes) in [("1MiB", 1usize << 20), ("16MiB", 16 << 20)] {
        let elements = bytes / size_of::<f32>();
        group.throughput(Throughput::Bytes(bytes as u64));
        for ranks in [2, 4] {
            group.bench_with_input(
                BenchmarkId::new(label, format!("{ranks}ranks")),
                &ranks,
                |b, &ranks| b.iter_custom(|iters| time_all_reduces(ranks, elements, iters)),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, tcp_all_reduce);
criterion_main!(benches);
