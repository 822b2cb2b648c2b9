//! Per-op GPU timing with CUDA events, behind `FERROTRON_OP_TIMING`.
//!
//! When the variable is set (`1`: print to stderr at process exit; any other value: a file path
//! the table is written to at exit), every kernel launch, cuBLASLt matmul and cuDNN call records
//! an event pair on the compute stream around itself under its op name. Pending pairs are
//! resolved (one stream sync) every few thousand ops and at report time, and accumulated per
//! op: calls, total ms, mean µs, share of the timed total. Off (the default) it costs one
//! relaxed atomic load per op.
//!
//! `FERROTRON_OP_TIMELINE=<file>` (which turns timing on too) also keeps every op's start and
//! end on the stream, measured from the first timed op, and writes them as `op<TAB>start
//! ms<TAB>end ms` lines at exit. The gaps between one op's end and the next one's start are
//! where the GPU waited for the host: the per-op table cannot show them, and no timeline
//! profiler (nsys) produces reports on the GPU machine.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{result, sys};

use crate::engine::device::CudaDevice;
use crate::switches::EnvVars;

/// Pairs resolved in one go once this many are pending.
const FLUSH_AT: usize = 4096;

struct Pending {
    name: String,
    start: sys::CUevent,
    end: sys::CUevent,
}

#[derive(Default)]
struct State {
    pending: Vec<Pending>,
    free: Vec<sys::CUevent>,
    totals: HashMap<String, (u64, f64)>,
    /// The timeline's origin: recorded before the first timed op (timeline only).
    origin: Option<sys::CUevent>,
    /// Resolved ops as (name, start ms, end ms) from `origin`, when a timeline is kept.
    timeline: Vec<(String, f32, f32)>,
}

// SAFETY: CUevents are driver handles usable from any thread; the mutex serialises access.
unsafe impl Send for State {}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(State::default()))
}

/// 0 unknown, 1 off, 2 on.
static ENABLED: AtomicU8 = AtomicU8::new(0);

/// Whether op timing is on (`FERROTRON_OP_TIMING` set, or [`set_enabled`]).
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        0 => {
            let on = crate::switches::env_var(EnvVars::OP_TIMING).is_some_and(|v| v != "0")
                || timeline_path().is_some();
            ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            if on {
                register_exit_report();
            }
            on
        }
        v => v == 2,
    }
}

/// Where the timeline goes (`FERROTRON_OP_TIMELINE`), if one is kept.
fn timeline_path() -> Option<String> {
    crate::switches::env_var(EnvVars::OP_TIMELINE)
        .filter(|p| !p.is_empty() && *p != "0")
        .map(str::to_owned)
}

/// Switches timing on or off for this process (the gpu_check binary's `--op-timing`).
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// An open timing span; records its end event when dropped.
pub struct Scope {
    stream: sys::CUstream,
    name: String,
    start: sys::CUevent,
}

fn event(st: &mut State) -> Option<sys::CUevent> {
    st.free
        .pop()
        .or_else(|| result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).ok())
}

/// Starts timing `name` on `device`'s stream (None when timing is off).
pub fn scope(device: &CudaDevice, name: &str) -> Option<Scope> {
    if !enabled() {
        return None;
    }
    device.bind().ok()?;
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    if st.origin.is_none() && timeline_path().is_some() {
        let origin = event(&mut st)?;
        // SAFETY: a live event recorded on the device's live stream.
        unsafe { result::event::record(origin, device.cu_stream()) }.ok()?;
        st.origin = Some(origin);
    }
    let start = event(&mut st)?;
    drop(st);
    // SAFETY: a live event recorded on the device's live stream.
    unsafe { result::event::record(start, device.cu_stream()) }.ok()?;
    Some(Scope {
        stream: device.cu_stream(),
        name: name.to_string(),
        start,
    })
}

impl Drop for Scope {
    fn drop(&mut self) {
        let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
        let Some(end) = event(&mut st) else { return };
        // SAFETY: as in `scope`.
        if unsafe { result::event::record(end, self.stream) }.is_err() {
            return;
        }
        st.pending.push(Pending {
            name: std::mem::take(&mut self.name),
            start: self.start,
            end,
        });
        if st.pending.len() >= FLUSH_AT {
            resolve(&mut st);
        }
    }
}

fn resolve(st: &mut State) {
    let pending = std::mem::take(&mut st.pending);
    for p in pending {
        // SAFETY: both events were recorded; synchronize waits for the end one.
        let ms = unsafe {
            result::event::synchronize(p.end)
                .ok()
                .and_then(|_| result::event::elapsed(p.start, p.end).ok())
        };
        if let (Some(origin), Some(ms)) = (st.origin, ms) {
            // SAFETY: the origin was recorded before `start` on the same stream; both are done.
            if let Ok(start) = unsafe { result::event::elapsed(origin, p.start) } {
                st.timeline.push((p.name.clone(), start, start + ms));
            }
        }
        if let Some(ms) = ms {
            let e = st.totals.entry(p.name).or_default();
            e.0 += 1;
            e.1 += f64::from(ms);
        }
        st.free.push(p.start);
        st.free.push(p.end);
    }
}

/// One row of the op table.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRow {
    pub op: String,
    pub calls: u64,
    pub total_ms: f64,
}

/// Every op timed so far (waits for pending ones), largest total first.
pub fn rows() -> Vec<OpRow> {
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    resolve(&mut st);
    let mut rows: Vec<OpRow> = st
        .totals
        .iter()
        .map(|(op, (calls, ms))| OpRow {
            op: op.clone(),
            calls: *calls,
            total_ms: *ms,
        })
        .collect();
    rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    rows
}

/// Forgets every timing so far (e.g. after warm-up).
pub fn reset() {
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    resolve(&mut st);
    st.totals.clear();
}

/// The table as Markdown: op, calls, total ms, mean µs, share.
pub fn format_table(rows: &[OpRow]) -> String {
    let total: f64 = rows.iter().map(|r| r.total_ms).sum();
    let mut out =
        String::from("| op | calls | total ms | mean µs | share |\n|---|---:|---:|---:|---:|\n");
    for r in rows {
        let mean_us = if r.calls > 0 {
            r.total_ms * 1e3 / r.calls as f64
        } else {
            0.0
        };
        let share = if total > 0.0 {
            100.0 * r.total_ms / total
        } else {
            0.0
        };
        out.push_str(&format!(
            "| {} | {} | {:.3} | {:.1} | {:.1} % |\n",
            r.op, r.calls, r.total_ms, mean_us, share
        ));
    }
    out.push_str(&format!(
        "| **total** | {} | {:.3} | | 100 % |\n",
        rows.iter().map(|r| r.calls).sum::<u64>(),
        total
    ));
    out
}

/// The table of everything timed so far.
pub fn report() -> String {
    format_table(&rows())
}

/// The timeline as `op<TAB>start ms<TAB>end ms` lines, in stream order.
fn format_timeline(ops: &[(String, f32, f32)]) -> String {
    ops.iter()
        .map(|(op, start, end)| format!("{op}\t{start:.4}\t{end:.4}\n"))
        .collect()
}

extern "C" fn exit_report() {
    let rows = rows();
    if let Some(path) = timeline_path() {
        let st = state().lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = std::fs::write(&path, format_timeline(&st.timeline)) {
            eprintln!("cannot write the op timeline to {path}: {err}");
        }
    }
    if rows.is_empty() {
        return;
    }
    let table = format!(
        "ferrotron op timing (FERROTRON_OP_TIMING)\n{}",
        format_table(&rows)
    );
    match crate::switches::env_var(EnvVars::OP_TIMING) {
        Some(path) if path != "1" && !path.is_empty() => {
            if let Err(err) = std::fs::write(path, &table) {
                eprintln!("cannot write op timing to {path}: {err}\n{table}");
            }
        }
        _ => eprintln!("{table}"),
    }
}

unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

fn register_exit_report() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // SAFETY: registers a plain function with the C runtime; it runs once at exit.
        unsafe { atexit(exit_report) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_lines_are_op_start_end() {
        let ops = vec![
            ("matmul(cublaslt)".to_string(), 0.0, 1.25),
            ("map_add_bf16_bf16_bf16".to_string(), 1.5, 1.625),
        ];
        assert_eq!(
            format_timeline(&ops),
            "matmul(cublaslt)\t0.0000\t1.2500\nmap_add_bf16_bf16_bf16\t1.5000\t1.6250\n"
        );
    }

    #[test]
    fn table_has_means_and_shares() {
        let rows = vec![
            OpRow {
                op: "matmul".into(),
                calls: 4,
                total_ms: 3.0,
            },
            OpRow {
                op: "map_add".into(),
                calls: 2,
                total_ms: 1.0,
            },
        ];
        let t = format_table(&rows);
        assert!(t.contains("| matmul | 4 | 3.000 | 750.0 | 75.0 % |"), "{t}");
        assert!(
            t.contains("| map_add | 2 | 1.000 | 500.0 | 25.0 % |"),
            "{t}"
        );
        assert!(t.contains("| **total** | 6 | 4.000 |"), "{t}");
    }
}
