//! What telemetry costs the training loop per step, and what one scrape costs the server thread.

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ferrotron_telemetry::{JsonlWriter, Metrics, StepMetrics, process_memory_bytes};

fn step(step: u64) -> StepMetrics {
    StepMetrics {
        step,
        loss: 3.1,
        lr: 3e-4,
        grad_norm: 0.8,
        tokens_per_second: 1.2e6,
        tflops_per_gpu: 420.0,
        mfu: Some(0.42),
        step_seconds: 0.9,
        memory_bytes: 80 << 30,
    }
}

fn per_step_costs(c: &mut Criterion) {
    let metrics = Metrics::new("bench", 0).expect("metrics");
    let mut iteration = 0u64;
    c.bench_function("record_step", |b| {
        b.iter(|| {
            iteration += 1;
            metrics.record_step(black_box(&step(iteration)));
        })
    });

    let dir = tempfile::tempdir().expect("temp dir");
    let mut writer = JsonlWriter::open(&dir.path().join("metrics.jsonl")).expect("jsonl");
    c.bench_function("jsonl_write_step", |b| {
        b.iter(|| {
            iteration += 1;
            writer.write(black_box(&step(iteration))).expect("write");
        })
    });

    c.bench_function("process_memory_bytes", |b| {
        b.iter(|| black_box(process_memory_bytes()))
    });
}

fn scrape_costs(c: &mut Criterion) {
    let metrics = Metrics::new("bench", 0).expect("metrics");
    metrics.record_step(&step(1));
    c.bench_function("encode_text", |b| {
        b.iter(|| black_box(metrics.encode_text()))
    });

    let server = metrics.serve("127.0.0.1", 0).expect("serve");
    let address = server.local_addr();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\n\r\n");
    let mut response = Vec::with_capacity(8192);
    c.bench_function("http_scrape_loopback", |b| {
        b.iter(|| {
            let mut stream = TcpStream::connect(address).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            stream.write_all(request.as_bytes()).expect("send");
            response.clear();
            stream.read_to_end(&mut response).expect("read");
            black_box(response.len())
        })
    });
}

criterion_group!(benches, per_step_costs, scrape_costs);
criterion_main!(benches);
