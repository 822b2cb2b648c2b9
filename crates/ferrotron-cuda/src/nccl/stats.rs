//! Bytes and time per kind of collective, and the bandwidths NCCL-tests reports.
//!
//! Every collective records a pair of timing events on the communication stream around its
//! NCCL call. Pairs are resolved lazily: each new record first collects the pairs that already
//! completed (`cuEventQuery`, which never blocks), and [`snapshot`] waits for the rest, so the
//! hot path never synchronises. Totals are per process and per kind, over every communicator.
//!
//! Bandwidths follow NCCL-tests (`doc/PERFORMANCE.md`): the *algorithm* bandwidth is the bytes a
//! rank's buffer holds divided by the time; the *bus* bandwidth scales it by the fraction of that
//! data each link must carry, so it is comparable with the hardware's link speed whatever the
//! group size: all-reduce `2(n−1)/n`, reduce-scatter, all-gather and all-to-all `(n−1)/n`,
//! broadcast and send/recv 1.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{CudaEvent, result};

/// The kinds of collective timed separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
    SendRecv,
    Broadcast,
}

impl CollectiveKind {
    pub const ALL: [CollectiveKind; 6] = [
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllGather,
        CollectiveKind::AllToAll,
        CollectiveKind::SendRecv,
        CollectiveKind::Broadcast,
    ];

    /// The label value of the Prometheus series (`kind="all_reduce"`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::SendRecv => "send_recv",
            CollectiveKind::Broadcast => "broadcast",
        }
    }

    /// Bus bandwidth ÷ algorithm bandwidth on a group of `ranks` (NCCL-tests' factors).
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::ReduceScatter
            | CollectiveKind::AllGather
            | CollectiveKind::AllToAll => (n - 1.0) / n,
            CollectiveKind::SendRecv | CollectiveKind::Broadcast => 1.0,
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Accumulated calls, bytes and GPU time of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KindTotals {
    pub calls: u64,
    /// Bytes of the rank's buffer, summed (NCCL-tests' "size": the larger of input and output).
    pub bytes: f64,
    /// `bytes × bus factor`, summed per call (groups of different sizes mix correctly).
    pub bus_bytes: f64,
    /// GPU time on the communication stream, in milliseconds.
    pub ms: f64,
}

impl KindTotals {
    pub fn add(&mut self, bytes: usize, bus_factor: f64, ms: f64) {
        self.calls += 1;
        self.bytes += bytes as f64;
        self.bus_bytes += bytes as f64 * bus_factor;
        self.ms += ms;
    }

    /// Algorithm bandwidth in bytes per second (0 before any timed call).
    pub fn algorithm_bandwidth(&self) -> f64 {
        if self.ms > 0.0 {
            self.bytes / (self.ms * 1e-3)
        } else {
            0.0
        }
    }

    /// Bus bandwidth in bytes per second (0 before any timed call).
    pub fn bus_bandwidth(&self) -> f64 {
        if self.ms > 0.0 {
            self.bus_bytes / (self.ms * 1e-3)
        } else {
            0.0
        }
    }
}

/// One kind's totals, as [`snapshot`] returns them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KindStats {
    pub kind: CollectiveKind,
    pub totals: KindTotals,
}

/// How long [`snapshot`] waits for collectives still in flight.
const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

struct Pending {
    kind: CollectiveKind,
    bytes: usize,
    bus_factor: f64,
    start: CudaEvent,
    end: CudaEvent,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Pending>,
    totals: [KindTotals; 6],
}

impl State {
    /// Folds completed pairs into the totals, oldest first; with `wait`, polls for the rest
    /// (up to [`WAIT_LIMIT`] in all: a collective stuck on a dead peer must not hang a report;
    /// pairs still pending then are dropped).
    fn resolve(&mut self, wait: bool) {
        let started = std::time::Instant::now();
        while let Some(front) = self.pending.front() {
            // Event queries need the event's context current on this thread.
            if front.end.context().bind_to_thread().is_err() {
                break;
            }
            let done = match front.end.try_is_complete() {
                Ok(true) => true,
                Ok(false) if wait && started.elapsed() < WAIT_LIMIT => {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                    continue;
                }
                Ok(false) if !wait => break,
                // A CUDA error (the communicator reports it) or the wait limit: drop the pair.
                _ => false,
            };
            let Some(pair) = self.pending.pop_front() else {
                break;
            };
            if !done {
                continue;
            }
            // SAFETY: both events were recorded on the same stream and the end one completed.
            let ms = unsafe { result::event::elapsed(pair.start.cu_event(), pair.end.cu_event()) };
            if let Ok(ms) = ms {
                self.totals[index(pair.kind)].add(pair.bytes, pair.bus_factor, f64::from(ms));
            }
        }
    }
}

fn index(kind: CollectiveKind) -> usize {
    CollectiveKind::ALL
        .iter()
        .position(|&k| k == kind)
        .unwrap_or(0)
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(|| Mutex::new(State::default()))
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    state()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records one collective's event pair (the communicator calls this after queueing it).
pub(crate) fn record(
    kind: CollectiveKind,
    bytes: usize,
    ranks: usize,
    start: CudaEvent,
    end: CudaEvent,
) {
    let mut st = lock();
    st.resolve(false);
    st.pending.push_back(Pending {
        kind,
        bytes,
        bus_factor: kind.bus_factor(ranks),
        start,
        end,
    });
}

/// Totals per kind that has run, waiting for the collectives still in flight (call it at report
/// time, not on the hot path).
pub fn snapshot() -> Vec<KindStats> {
    let mut st = lock();
    st.resolve(true);
    totals(&st)
}

/// Totals per kind of the collectives that already finished, without waiting for any (what a
/// metrics exporter can call every logged step).
pub fn current() -> Vec<KindStats> {
    let mut st = lock();
    st.resolve(false);
    totals(&st)
}

fn totals(st: &State) -> Vec<KindStats> {
    CollectiveKind::ALL
        .iter()
        .zip(st.totals)
        .filter(|(_, t)| t.calls > 0)
        .map(|(&kind, totals)| KindStats { kind, totals })
        .collect()
}

/// Forgets every total (benchmarks time one phase at a time).
pub fn reset() {
    let mut st = lock();
    st.resolve(true);
    st.totals = Default::default();
}

/// `| collective | calls | MiB | ms | algbw GB/s | busbw GB/s |` for `stats`.
pub fn render(stats: &[KindStats]) -> String {
    let mut out = String::from(
        "| collective | calls | MiB | GPU ms | algbw GB/s | busbw GB/s |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for s in stats {
        let t = &s.totals;
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.3} | {:.1} | {:.1} |\n",
            s.kind,
            t.calls,
            t.bytes / (1024.0 * 1024.0),
            t.ms,
            t.algorithm_bandwidth() / 1e9,
            t.bus_bandwidth() / 1e9
        ));
    }
    out
}

/// `ferrotron_collective_bus_bandwidth_bytes_per_second{kind="..."}` lines in Prometheus' text
/// format, for a process that serves its own metrics (the telemetry crate's registry is built
/// per run inside the trainer and has no hook for an engine's gauges yet).
pub fn prometheus_text(stats: &[KindStats]) -> String {
    let mut out = String::from(
        "# HELP ferrotron_collective_bus_bandwidth_bytes_per_second NCCL bus bandwidth per collective kind (NCCL-tests' definition).\n\
         # TYPE ferrotron_collective_bus_bandwidth_bytes_per_second gauge\n",
    );
    for s in stats {
        out.push_str(&format!(
            "ferrotron_collective_bus_bandwidth_bytes_per_second{{kind=\"{}\"}} {}\n",
            s.kind,
            s.totals.bus_bandwidth()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_are_nccl_tests_ones() {
        assert_eq!(CollectiveKind::AllReduce.bus_factor(1), 0.0);
        assert_eq!(CollectiveKind::AllReduce.bus_factor(2), 1.0);
        assert_eq!(CollectiveKind::AllReduce.bus_factor(4), 1.5);
        assert_eq!(CollectiveKind::AllReduce.bus_factor(8), 1.75);
        assert_eq!(CollectiveKind::ReduceScatter.bus_factor(4), 0.75);
        assert_eq!(CollectiveKind::AllGather.bus_factor(2), 0.5);
        assert_eq!(CollectiveKind::AllToAll.bus_factor(8), 0.875);
        assert_eq!(CollectiveKind::Broadcast.bus_factor(8), 1.0);
        assert_eq!(CollectiveKind::SendRecv.bus_factor(2), 1.0);
    }

    #[test]
    fn bandwidths_are_bytes_over_time_scaled_per_call() {
        let mut t = KindTotals::default();
        assert_eq!(t.bus_bandwidth(), 0.0);
        // 1 GB in 4 ms on 4 ranks, then 1 GB in 4 ms on 2 ranks.
        t.add(1_000_000_000, CollectiveKind::AllReduce.bus_factor(4), 4.0);
        t.add(1_000_000_000, CollectiveKind::AllReduce.bus_factor(2), 4.0);
        assert_eq!(t.calls, 2);
        assert!((t.algorithm_bandwidth() - 250e9).abs() < 1.0);
        // (1.5 + 1.0) GB of bus traffic in 8 ms.
        assert!((t.bus_bandwidth() - 312.5e9).abs() < 1.0);
    }

    #[test]
    fn tables_name_every_kind() {
        let mut totals = KindTotals::default();
        totals.add(1 << 20, 1.0, 0.5);
        let stats = vec![KindStats {
            kind: CollectiveKind::SendRecv,
            totals,
        }];
        let table = render(&stats);
        assert!(
            table.contains("| send_recv | 1 | 1.0 | 0.500 | 2.1 | 2.1 |"),
            "{table}"
        );
        let text = prometheus_text(&stats);
        assert!(
            text.contains(
                "ferrotron_collective_bus_bandwidth_bytes_per_second{kind=\"send_recv\"} 2097152000"
            ),
            "{text}"
        );
        let names: Vec<&str> = CollectiveKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "all_reduce",
                "reduce_scatter",
                "all_gather",
                "all_to_all",
                "send_recv",
                "broadcast"
            ]
        );
    }
}
