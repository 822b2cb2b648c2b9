//! The `/metrics` endpoint as a scraper sees it: real sockets over loopback, bounded by timeouts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ferrotron_telemetry::{Metrics, StepMetrics, TelemetryError};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `request` and returns `(status code, whole response)`.
fn exchange(address: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&address, TIMEOUT).expect("connect");
    stream
        .set_read_timeout(Some(TIMEOUT))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(TIMEOUT))
        .expect("write timeout");
    stream.write_all(request.as_bytes()).expect("send request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read response");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    (status, response)
}

fn get(address: SocketAddr, path: &str) -> (u16, String) {
    exchange(
        address,
        &format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: */*\r\n\r\n"),
    )
}

fn recorded_metrics() -> Metrics {
    let metrics = Metrics::new("http-test", 0).expect("metrics");
    metrics.record_step(&StepMetrics {
        step: 12,
        loss: 2.75,
        lr: 1e-3,
        grad_norm: 0.5,
        tokens_per_second: 2048.0,
        tflops_per_gpu: 0.01,
        mfu: Some(0.02),
        step_seconds: 0.05,
        memory_bytes: 4096,
    });
    metrics.record_iteration(ferrotron_telemetry::IterationCounts {
        seconds: 0.05,
        tokens: 64,
        samples: 4,
    });
    metrics.record_eval(10, 2.9);
    metrics
}

#[test]
fn get_metrics_returns_200_with_every_series() {
    let metrics = recorded_metrics();
    let server = metrics.serve("127.0.0.1", 0).expect("serve");
    let address = server.local_addr();
    assert!(address.ip().is_loopback());
    assert_ne!(address.port(), 0, "port 0 must resolve to the bound port");

    let (status, response) = get(address, "/metrics");
    assert_eq!(status, 200, "{response}");
    assert!(response.contains("Content-Type: text/plain; version=0.0.4"));
    for series in [
        r#"ferrotron_iteration{rank="0",run="http-test"} 12"#,
        r#"ferrotron_train_loss{rank="0",run="http-test"} 2.75"#,
        r#"ferrotron_eval_loss{rank="0",run="http-test"} 2.9"#,
        r#"ferrotron_learning_rate{rank="0",run="http-test"} 0.001"#,
        r#"ferrotron_grad_norm{rank="0",run="http-test"} 0.5"#,
        r#"ferrotron_tokens_per_second{rank="0",run="http-test"} 2048"#,
        r#"ferrotron_tflops_per_gpu{rank="0",run="http-test"} 0.01"#,
        r#"ferrotron_mfu_ratio{rank="0",run="http-test"} 0.02"#,
        r#"ferrotron_step_seconds_count{rank="0",run="http-test"} 1"#,
        r#"ferrotron_memory_bytes{rank="0",run="http-test"} 4096"#,
    ] {
        assert!(
            response.contains(series),
            "{series} missing from:\n{response}"
        );
    }
}

#[test]
fn scrapes_see_values_recorded_after_the_server_started() {
    let metrics = Metrics::new("live", 2).expect("metrics");
    let server = metrics.serve("127.0.0.1", 0).expect("serve");
    metrics.record_step(&StepMetrics {
        step: 99,
        ..StepMetrics::default()
    });
    let (status, response) = get(server.local_addr(), "/metrics?scrape=1");
    assert_eq!(status, 200);
    assert!(response.contains(r#"ferrotron_iteration{rank="2",run="live"} 99"#));
}

#[test]
fn other_paths_are_404() {
    let metrics = recorded_metrics();
    let server = metrics.serve("127.0.0.1", 0).expect("serve");
    for path in ["/", "/metric", "/metrics/extra", "/favicon.ico"] {
        let (status, response) = get(server.local_addr(), path);
        assert_eq!(status, 404, "{path}: {response}");
        assert!(!response.contains("ferrotron_iteration"));
    }
}

#[test]
fn garbage_is_a_400_not_a_hang() {
    let metrics = recorded_metrics();
    let server = metrics.serve("127.0.0.1", 0).expect("serve");
    let (status, _) = exchange(server.local_addr(), "HELLO\r\n\r\n");
    assert_eq!(status, 400);
}

#[test]
fn dropping_the_server_closes_the_port() {
    let metrics = recorded_metrics();
    let server = metrics.serve("127.0.0.1", 0).expect("serve");
    let address = server.local_addr();
    assert_eq!(get(address, "/metrics").0, 200);
    server.stop();
    assert!(TcpStream::connect_timeout(&address, TIMEOUT).is_err());
}

#[test]
fn a_port_in_use_is_a_bind_error_naming_the_address() {
    let metrics = recorded_metrics();
    let first = metrics.serve("127.0.0.1", 0).expect("serve");
    let port = first.local_addr().port();
    let error = metrics.serve("127.0.0.1", port).expect_err("port is taken");
    assert!(matches!(error, TelemetryError::Bind { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&format!("127.0.0.1:{port}")),
        "{error}"
    );
}

#[test]
fn an_unresolvable_address_is_an_error() {
    let metrics = recorded_metrics();
    let error = metrics.serve("not an address", 0).expect_err("cannot bind");
    assert!(error.to_string().contains("not an address"), "{error}");
}
