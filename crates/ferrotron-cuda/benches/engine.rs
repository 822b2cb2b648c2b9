//! GPU throughput of the engine's hot paths: cuBLASLt GEMMs (FLOP/s shown as elements/s) and
//! the memory-bound kernel families (bytes/s). Prints a note and measures nothing where no
//! CUDA driver is present (CI).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrotron_cuda::{
    BinaryOp, CudaDevice, DType, Distribution, ReduceOp, binary, matmul, random, reduce_dim,
};

fn device() -> Option<Arc<CudaDevice>> {
    if !ferrotron_cuda::driver_available() {
        eprintln!("no CUDA driver: GPU benchmarks skipped");
        return None;
    }
    CudaDevice::get(0).ok()
}

fn normal(d: &Arc<CudaDevice>, shape: &[usize], dtype: DType) -> ferrotron_cuda::CudaTensor {
    random(
        d,
        shape,
        Distribution::Normal {
            mean: 0.0,
            std: 1.0,
        },
        dtype,
    )
    .expect("random")
}

fn gemm(c: &mut Criterion) {
    let Some(d) = device() else { return };
    let mut group = c.benchmark_group("matmul");
    group.sample_size(10);
    for (dtype, size) in [(DType::BF16, 4096), (DType::BF16, 8192), (DType::F32, 4096)] {
        let a = normal(&d, &[size, size], dtype);
        let b = normal(&d, &[size, size], dtype);
        group.throughput(Throughput::Elements(2 * (size as u64).pow(3)));
        group.bench_function(format!("{dtype}_{size}"), |bench| {
            bench.iter(|| {
                black_box(matmul(&a, &b).expect("matmul"));
                d.synchronize().expect("sync");
            })
        });
    }
    // Transposed right operand, read through the layout.
    let a = normal(&d, &[8192, 8192], DType::BF16);
    let bt = normal(&d, &[8192, 8192], DType::BF16)
        .swap_dims(0, 1)
        .expect("view");
    group.throughput(Throughput::Elements(2 * 8192u64.pow(3)));
    group.bench_function("bf16_8192_bT", |bench| {
        bench.iter(|| {
            black_box(matmul(&a, &bt).expect("matmul"));
            d.synchronize().expect("sync");
        })
    });
    group.finish();
}

fn memory_bound(c: &mut Criterion) {
    let Some(d) = device() else { return };
    let mut group = c.benchmark_group("memory");
    group.sample_size(10);
    let n = 1usize << 26;
    let x = normal(&d, &[n], DType::F32);
    let y = normal(&d, &[n], DType::F32);
    group.throughput(Throughput::Bytes(3 * 4 * n as u64));
    group.bench_function("add_f32_64M", |bench| {
        bench.iter(|| {
            black_box(binary(&x, &y, BinaryOp::Add).expect("add"));
            d.synchronize().expect("sync");
        })
    });
    let rows = normal(&d, &[8192, 8192], DType::BF16);
    group.throughput(Throughput::Bytes(2 * 8192 * 8192));
    group.bench_function("sum_rows_bf16_8192x8192", |bench| {
        bench.iter(|| {
            black_box(reduce_dim(&rows, 1, ReduceOp::Sum).expect("sum"));
            d.synchronize().expect("sync");
        })
    });
    group.bench_function("sum_cols_bf16_8192x8192", |bench| {
        bench.iter(|| {
            black_box(reduce_dim(&rows, 0, ReduceOp::Sum).expect("sum"));
            d.synchronize().expect("sync");
        })
    });
    group.throughput(Throughput::Bytes(4 * 8192 * 8192));
    group.bench_function("transpose_copy_bf16_8192x8192", |bench| {
        bench.iter(|| {
            black_box(
                rows.swap_dims(0, 1)
                    .and_then(|t| t.contiguous())
                    .expect("copy"),
            );
            d.synchronize().expect("sync");
        })
    });
    group.finish();
}

criterion_group!(benches, gemm, memory_bound);
criterion_main!(benches);
