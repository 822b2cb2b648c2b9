//! Rows for issue 44 that need a GPU but not several: the two communication lanes (a small
//! immediate tensor-parallel collective no longer waits behind a deferred 1 GiB data-parallel
//! one), a started collective dropped unwaited still orders the compute stream after it, and
//! the process watchdog ends a process whose stream is blocked by something an abort cannot
//! release (a child process of this one, so the table survives).
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUstreamWaitValue_flags};
use cudarc::driver::{CudaStream, result};
use ferrotron_cuda::nccl::NcclComm;
use ferrotron_cuda::{CudaDevice, CudaTensor, DType};
use ferrotron_dist::{Communicator, ReduceOp};

use crate::compare::Errors;
use crate::{Row, failed, first_line, guarded};

/// Set in the child processes this file's rows run in: which row.
pub(crate) const CHILD: &str = "GPU_CHECK_WATCHDOG_CHILD";
/// The child's exit code when its watchdog ended it.
const ENDED_BY_WATCHDOG: i32 = 9;
const GIB_F32: usize = 1 << 28;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A device word that holds streams back: a stream blocked on it waits until [`Gate::open`]
/// writes 1. Allocated with `cuMemAlloc`, because stream memory operations refuse the
/// stream-ordered pool's memory.
struct Gate(sys::CUdeviceptr);

impl Gate {
    fn new() -> Result<Gate, String> {
        // SAFETY: a fresh 4-byte allocation, zeroed before any stream waits on it.
        unsafe {
            let word = result::malloc_sync(4).map_err(|e| format!("{e:?}"))?;
            let status = sys::cuMemsetD32_v2(word, 0, 1);
            if status != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuMemsetD32: {status:?}"));
            }
            Ok(Gate(word))
        }
    }

    /// Makes `stream` wait (on the device) until the gate opens.
    fn block(&self, stream: &CudaStream) -> Result<(), String> {
        // SAFETY: the word is live until the gate drops, after the stream passed it.
        let status = unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                self.0,
                1,
                CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        if status == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("cuStreamWaitValue32: {status:?}"))
        }
    }

    /// Writes 1 from a stream of its own, releasing every stream blocked on the gate.
    fn open(&self, dev: &CudaDevice) -> Result<(), String> {
        let stream = dev.context().new_stream().map_err(|e| format!("{e:?}"))?;
        // SAFETY: as in `block`.
        let status = unsafe { sys::cuStreamWriteValue32_v2(stream.cu_stream(), self.0, 1, 0) };
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuStreamWriteValue32: {status:?}"));
        }
        stream.synchronize().map_err(|e| format!("{e:?}"))
    }
}

/// Polls `done` for up to `limit`; whether it completed, and when.
fn completes_within(
    done: &cudarc::driver::CudaEvent,
    limit: Duration,
) -> Result<Option<Duration>, String> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done.try_is_complete().map_err(|e| format!("{e:?}"))? {
            return Ok(Some(started.elapsed()));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(None)
}

/// A pass/fail row whose note carries the measured times.
fn verdict(op: &str, shape: &str, outcome: Result<(bool, String), String>) -> Row {
    let (errors, note) = match outcome {
        Ok((held, note)) => (
            Errors {
                max_abs: 0.0,
                max_rel: 0.0,
                bad: usize::from(!held),
                mismatch: None,
            },
            note,
        ),
        Err(e) => (failed(), first_line(&e)),
    };
    Row {
        op: op.into(),
        dtype: "f32",
        shape: shape.into(),
        errors,
        note,
    }
}

/// The data lane held back by a gate, a deferred 1 GiB all-reduce queued on it, then a 4 KiB
/// immediate all-reduce on `tp` (the model lane): the small one completes while the data lane
/// is still blocked, where one shared stream would have held it behind the large one.
fn lanes_row(comm: &NcclComm) -> Row {
    let outcome = guarded(|| {
        let dev = comm.device().clone();
        let me = comm.global_rank();
        let dp = comm.new_group("dp", &[me]).map_err(err)?;
        let tp = comm.new_group("tp", &[me]).map_err(err)?;
        let big = CudaTensor::empty(&dev, &[GIB_F32], DType::F32).map_err(err)?;
        let small = CudaTensor::empty(&dev, &[1024], DType::F32).map_err(err)?;
        dev.synchronize().map_err(err)?;
        let gate = Gate::new()?;
        gate.block(dp.stream())?;
        let (_reduced, started) = dp
            .all_reduce_tensor_started(&big, ReduceOp::Sum)
            .map_err(err)?;
        let _small_out = tp.all_reduce_tensor(&small, ReduceOp::Sum).map_err(err)?;
        let small_done = dev
            .stream()
            .record_event(None)
            .map_err(|e| format!("{e:?}"))?;
        let passed = completes_within(&small_done, Duration::from_secs(5))?;
        gate.open(&dev)?;
        started.wait().map_err(err)?;
        dev.synchronize().map_err(err)?;
        Ok((
            passed.is_some(),
            match passed {
                Some(after) => format!(
                    "tp 4 KiB immediate done {:.3} ms after queueing, dp 1 GiB deferred held back",
                    after.as_secs_f64() * 1e3
                ),
                None => "tp immediate still queued behind the blocked dp lane after 5 s".into(),
            },
        ))
    });
    verdict("nccl_lanes", "[2^28] + [1024]", outcome)
}

/// A deferred 1 GiB all-reduce whose handle is dropped unwaited: once the compute stream is
/// synchronised, the data lane is idle (the drop ordered the compute stream after it).
fn dropped_started_row(comm: &NcclComm) -> Row {
    let outcome = guarded(|| {
        let dev = comm.device().clone();
        let dp = comm.new_group("dp", &[comm.global_rank()]).map_err(err)?;
        let big = CudaTensor::empty(&dev, &[GIB_F32], DType::F32).map_err(err)?;
        dev.synchronize().map_err(err)?;
        let (reduced, started) = dp
            .all_reduce_tensor_started(&big, ReduceOp::Sum)
            .map_err(err)?;
        drop(started);
        drop(reduced);
        dev.synchronize().map_err(err)?;
        let lane_now = dp
            .stream()
            .record_event(None)
            .map_err(|e| format!("{e:?}"))?;
        let idle = lane_now.try_is_complete().map_err(|e| format!("{e:?}"))?;
        Ok((
            idle,
            format!("data lane idle after the compute stream synchronised: {idle}"),
        ))
    });
    verdict("nccl_started_dropped", "[2^28]", outcome)
}

/// Runs `which` in a child process of this program (`CHILD=which`), so a row that hangs
/// fails after `limit` instead of taking the table with it; the child's status, its time and
/// its stderr's last line.
fn in_child(which: &str, limit: Duration) -> Result<(Option<i32>, Duration, String), String> {
    let exe = std::env::current_exe().map_err(err)?;
    let started = Instant::now();
    let mut child = std::process::Command::new(exe)
        .env(CHILD, which)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(err)?;
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().map_err(err)? {
            break status.code();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{which}: hung, killed after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let after = started.elapsed();
    let text = reader.join().unwrap_or_default();
    let last = text.lines().last().unwrap_or_default().to_owned();
    Ok((status, after, last))
}

/// A row run in a child ([`child`] prints `PASS note` or `FAIL note` as its last line).
fn child_row(op: &str, shape: &str, which: &str) -> Row {
    let outcome = guarded(|| {
        let (status, _, last) = in_child(which, Duration::from_secs(60))?;
        match last.split_once(' ') {
            Some(("PASS", note)) if status == Some(0) => Ok((true, note.to_owned())),
            Some((_, note)) => Ok((false, note.to_owned())),
            None => Err(format!("child exited {status:?}: {last}")),
        }
    });
    verdict(op, shape, outcome)
}

/// The watchdog's child: it must end with the watchdog's code, naming the blocked read, after
/// the 1 s timeout and within the grace.
fn watchdog_row() -> Row {
    let outcome = guarded(|| {
        let (status, after, last) = in_child("watchdog", Duration::from_secs(60))?;
        let named = last.contains("copying a tensor to the host did not return after the abort");
        let ok = status == Some(ENDED_BY_WATCHDOG)
            && named
            && after >= Duration::from_secs(1)
            && after < Duration::from_secs(30);
        Ok((
            ok,
            format!(
                "child ended with {status:?} after {:.1} s: {}",
                after.as_secs_f64(),
                first_line(&last)
            ),
        ))
    });
    verdict("watchdog_blocked_stream", "-", outcome)
}

/// In a child process: the row `which` on a fresh one-rank communicator, its verdict as the
/// last line of stderr. Never returns.
pub(crate) fn child(which: &str, device_index: usize) -> ! {
    if which == "watchdog" {
        watchdog_child(device_index);
    }
    let made = guarded(|| {
        let dev = CudaDevice::get(device_index).map_err(err)?;
        NcclComm::solo(&dev, 0).map_err(err)
    });
    let row = match made {
        Ok(comm) if which == "lanes" => lanes_row(&comm),
        Ok(comm) => dropped_started_row(&comm),
        Err(e) => verdict(which, "-", Err(e)),
    };
    let verdict = if row.errors.pass() { "PASS" } else { "FAIL" };
    eprintln!("{verdict} {}", row.note);
    std::process::exit(0);
}

/// The child of [`watchdog_row`]: a NCCL communicator under an armed watchdog, the compute
/// stream blocked on a device word nobody writes, then a host read. Never returns.
fn watchdog_child(device_index: usize) -> ! {
    let dog = ferrotron_dist::watchdog::global();
    dog.on_stuck(Box::new(|reason| {
        eprintln!("watchdog: {reason}");
        ferrotron_dist::watchdog::end_process(ENDED_BY_WATCHDOG);
    }));
    dog.arm(0, Duration::from_secs(1));
    let blocked = (|| -> Result<(), String> {
        let dev = CudaDevice::get(device_index).map_err(err)?;
        let _comm = NcclComm::solo(&dev, 0).map_err(err)?;
        let tensor = CudaTensor::from_bytes(&dev, &[0u8; 4], &[1], DType::F32).map_err(err)?;
        dev.synchronize().map_err(err)?;
        let gate = Gate::new()?;
        gate.block(dev.stream())?;
        let _ = tensor.to_bytes();
        Err("the blocked read returned".to_owned())
    })();
    eprintln!("watchdog child: {}", blocked.err().unwrap_or_default());
    std::process::exit(1);
}

/// A group takes its parent's deadline (the recipe's distributed timeout), not the default.
fn group_timeout_row(comm: &NcclComm) -> Row {
    let outcome = guarded(|| {
        let before = comm.timeout();
        comm.set_timeout(Duration::from_secs(123));
        let tp = comm.new_group("tp", &[comm.global_rank()]).map_err(err);
        comm.set_timeout(before);
        let inherited = tp?.timeout();
        Ok((
            inherited == Duration::from_secs(123),
            format!("new_group after set_timeout(123 s): {inherited:?}"),
        ))
    });
    verdict("nccl_group_timeout", "-", outcome)
}

/// The rows above, on the one-rank world communicator.
pub(crate) fn rows(comm: &NcclComm) -> Vec<Row> {
    vec![
        child_row("nccl_lanes", "[2^28] + [1024]", "lanes"),
        child_row("nccl_started_dropped", "[2^28]", "dropped"),
        group_timeout_row(comm),
        watchdog_row(),
    ]
}
