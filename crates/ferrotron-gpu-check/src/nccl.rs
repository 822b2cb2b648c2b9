//! Rows for the NCCL communicator on one GPU: a NCCL communicator of one rank (`ncclCommInitRank`
//! with one rank) runs every collective, on device tensors and on host slices, plus the
//! sub-communicators (`ncclCommSplit` and `new_group`), against the expected result: in a group
//! of one every collective returns its input exactly (sum and max of one value, the gather of
//! one piece, the send to oneself), so any byte NCCL or our offsets got wrong shows. Outputs come
//! from the poisoned pool (NaN until written). Then a timing row per collective at 1 MiB and
//! 256 MiB: these are device-to-device NCCL calls with no host copy of the tensor.

use std::sync::Arc;
use std::time::Instant;

use ferrotron_cuda::nccl::{self, NcclComm, RecvSpec};
use ferrotron_cuda::{CudaDevice, CudaTensor, DType};
use ferrotron_dist::{Communicator, GroupMembers, ProcessGroups, ReduceOp, bf16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::compare::Errors;
use crate::{Row, failed, first_line, guarded};

type Out = Result<(Vec<f32>, Vec<f32>), String>;

fn label(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        _ => "other",
    }
}

/// Random values already rounded to `dtype` (so exact comparisons hold).
fn values(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.random_range(-4.0..4.0);
            if dtype == DType::BF16 {
                bf16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect()
}

fn upload(
    dev: &Arc<CudaDevice>,
    v: &[f32],
    shape: &[usize],
    dtype: DType,
) -> Result<CudaTensor, String> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    CudaTensor::from_bytes(dev, &bytes, shape, DType::F32)
        .and_then(|t| t.cast(dtype))
        .map_err(|e| e.to_string())
}

fn download(t: &CudaTensor) -> Result<Vec<f32>, String> {
    let bytes = t
        .cast(DType::F32)
        .and_then(|t| t.to_bytes())
        .map_err(|e| e.to_string())?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Exact comparison: every element equal (NaN, a never-written poisoned element, fails).
fn exact(got: &[f32], want: &[f32]) -> Errors {
    if got.len() != want.len() {
        return Errors {
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            bad: 0,
            mismatch: Some(format!("{} elements, want {}", got.len(), want.len())),
        };
    }
    let mut e = Errors {
        max_abs: 0.0,
        max_rel: 0.0,
        bad: 0,
        mismatch: None,
    };
    for (&g, &w) in got.iter().zip(want) {
        let d = (f64::from(g) - f64::from(w)).abs();
        if g.to_bits() != w.to_bits() && !(g == 0.0 && w == 0.0) {
            e.bad += 1;
        }
        if d.is_nan() {
            e.max_abs = f64::NAN;
        } else if !e.max_abs.is_nan() {
            e.max_abs = e.max_abs.max(d);
            e.max_rel = e.max_rel.max(d / f64::from(w).abs().max(1e-30));
        }
    }
    e
}

fn row(op: &str, dtype: &'static str, shape: String, note: &str, out: Out) -> Row {
    let (errors, note) = match out {
        Ok((got, want)) => (exact(&got, &want), note.to_string()),
        Err(e) => (failed(), first_line(&e)),
    };
    Row {
        op: format!("nccl_{op}"),
        dtype,
        shape,
        errors,
        note,
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Device-tensor rows for one dtype.
fn tensor_rows(comm: &NcclComm, rng: &mut StdRng, dtype: DType) -> Vec<Row> {
    let dev = comm.device().clone();
    let shape = [1024usize, 257];
    let n = shape[0] * shape[1];
    let x = values(rng, n, dtype);
    let dt = label(dtype);
    let sh = format!("{shape:?}");
    let run = |f: &dyn Fn(&CudaTensor) -> Result<CudaTensor, String>| -> Out {
        guarded(|| {
            let t = upload(&dev, &x, &shape, dtype)?;
            let y = f(&t)?;
            if y.shape() != t.shape() {
                return Err(format!("shape {:?}, want {:?}", y.shape(), t.shape()));
            }
            // The input must be untouched too (collectives never write their input).
            let mut got = download(&y)?;
            got.extend(download(&t)?);
            let mut want = x.clone();
            want.extend(&x);
            Ok((got, want))
        })
    };
    let mut rows = vec![
        row(
            "all_reduce_sum",
            dt,
            sh.clone(),
            "tensor, out of place",
            run(&|t| comm.all_reduce_tensor(t, ReduceOp::Sum).map_err(err)),
        ),
        row(
            "all_reduce_started",
            dt,
            sh.clone(),
            "tensor, compute stream ordered at wait",
            run(&|t| waited(comm.all_reduce_tensor_started(t, ReduceOp::Sum))),
        ),
        row(
            "all_gather_started",
            dt,
            sh.clone(),
            "tensor, compute stream ordered at wait",
            run(&|t| waited(comm.all_gather_tensor_started(t))),
        ),
        row(
            "reduce_scatter_started",
            dt,
            sh.clone(),
            "tensor, compute stream ordered at wait",
            run(&|t| waited(comm.reduce_scatter_tensor_started(t, ReduceOp::Sum))),
        ),
        row(
            "all_reduce_max",
            dt,
            sh.clone(),
            "tensor",
            run(&|t| comm.all_reduce_tensor(t, ReduceOp::Max).map_err(err)),
        ),
        row(
            "all_gather",
            dt,
            sh.clone(),
            "tensor, leading dim",
            run(&|t| comm.all_gather_tensor(t).map_err(err)),
        ),
        row(
            "all_gather_uneven",
            dt,
            sh.clone(),
            "grouped broadcasts",
            run(&|t| comm.all_gather_uneven_tensor(t, &[shape[0]]).map_err(err)),
        ),
        row(
            "reduce_scatter_sum",
            dt,
            sh.clone(),
            "tensor, leading dim",
            run(&|t| comm.reduce_scatter_tensor(t, ReduceOp::Sum).map_err(err)),
        ),
        row(
            "broadcast",
            dt,
            sh.clone(),
            "root 0",
            run(&|t| comm.broadcast_tensor(t, 0).map_err(err)),
        ),
        row(
            "send_recv",
            dt,
            sh.clone(),
            "grouped send + recv to self",
            run(&|t| {
                let mut got = comm
                    .send_recv_tensors(
                        &[(t, 0)],
                        &[RecvSpec {
                            shape: t.shape().to_vec(),
                            dtype: t.dtype(),
                            peer: 0,
                        }],
                    )
                    .map_err(err)?;
                got.pop().ok_or_else(|| "nothing received".to_string())
            }),
        ),
        row(
            "all_to_all_rows",
            dt,
            sh.clone(),
            "grouped send/recv",
            run(&|t| {
                comm.all_to_all_rows_tensor(t, &[shape[0]], &[shape[0]])
                    .map_err(err)
            }),
        ),
    ];
    // Along a non-leading dim: the permute to the front and back must be exact.
    let shape3 = [4usize, 6, 8];
    let x3 = values(rng, 4 * 6 * 8, dtype);
    for (op, dim) in [("all_gather_dim1", 1usize), ("reduce_scatter_dim2", 2)] {
        let out = guarded(|| {
            let t = upload(&dev, &x3, &shape3, dtype)?;
            let y = if dim == 1 {
                comm.all_gather_along(&t, dim)
            } else {
                comm.reduce_scatter_along(&t, dim, ReduceOp::Sum)
            }
            .map_err(err)?;
            if y.shape() != shape3 {
                return Err(format!("shape {:?}", y.shape()));
            }
            Ok((download(&y)?, x3.clone()))
        });
        rows.push(row(
            op,
            dt,
            format!("{shape3:?}"),
            "moved to the front and back",
            out,
        ));
    }
    rows
}

/// Host-slice rows: the `Communicator` trait (staged through device buffers), every element type.
fn host_rows(comm: &NcclComm, rng: &mut StdRng) -> Vec<Row> {
    let n = 4099;
    let f64s: Vec<f64> = (0..n).map(|_| rng.random_range(-1e6..1e6)).collect();
    let i64s: Vec<i64> = (0..n)
        .map(|_| rng.random_range(-(1 << 40)..(1 << 40)))
        .collect();
    let u32s: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let i32s: Vec<i32> = (0..n).map(|_| rng.random()).collect();
    let b16s: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-8.0..8.0)))
        .collect();
    let f32s: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
    let sh = format!("[{n}]");
    // Integer and f64 results: mismatching elements counted (bitwise); bf16/f32 compared exactly.
    let mut rows = Vec::new();
    let out = guarded(|| {
        let mut buf = f64s.clone();
        comm.all_reduce(&mut buf, ReduceOp::Sum).map_err(err)?;
        let bad = buf
            .iter()
            .zip(&f64s)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        Ok((vec![bad as f32], vec![0.0]))
    });
    rows.push(row(
        "host_all_reduce",
        "f64",
        sh.clone(),
        "Communicator, mismatches counted",
        out,
    ));
    let out = guarded(|| {
        let mut got = vec![0i64; n];
        comm.all_gather(&i64s, &mut got).map_err(err)?;
        let bad = got.iter().zip(&i64s).filter(|(a, b)| a != b).count();
        Ok((vec![bad as f32], vec![0.0]))
    });
    rows.push(row(
        "host_all_gather",
        "i64",
        sh.clone(),
        "Communicator, mismatches counted",
        out,
    ));
    let out = guarded(|| {
        let mut got = vec![0u32; n];
        comm.reduce_scatter(&u32s, &mut got, ReduceOp::Max)
            .map_err(err)?;
        let bad = got.iter().zip(&u32s).filter(|(a, b)| a != b).count();
        Ok((vec![bad as f32], vec![0.0]))
    });
    rows.push(row(
        "host_reduce_scatter_max",
        "u32",
        sh.clone(),
        "Communicator, mismatches counted",
        out,
    ));
    let out = guarded(|| {
        let mut buf = b16s.clone();
        comm.broadcast(&mut buf, 0).map_err(err)?;
        Ok((
            buf.iter().map(|v| v.to_f32()).collect(),
            b16s.iter().map(|v| v.to_f32()).collect(),
        ))
    });
    rows.push(row(
        "host_broadcast",
        "bf16",
        sh.clone(),
        "Communicator",
        out,
    ));
    let out = guarded(|| {
        let mut got = vec![0i32; n];
        comm.all_to_all(&i32s, &[n], &mut got, &[n]).map_err(err)?;
        let bad = got.iter().zip(&i32s).filter(|(a, b)| a != b).count();
        Ok((vec![bad as f32], vec![0.0]))
    });
    rows.push(row(
        "host_all_to_all",
        "i32",
        sh.clone(),
        "Communicator, mismatches counted",
        out,
    ));
    let out = guarded(|| {
        let mut buf = f32s.clone();
        comm.all_reduce(&mut buf, ReduceOp::Max).map_err(err)?;
        comm.barrier().map_err(err)?;
        Ok((buf, f32s.clone()))
    });
    rows.push(row(
        "host_all_reduce_max",
        "f32",
        sh.clone(),
        "Communicator + barrier",
        out,
    ));
    // Argument checks answer before NCCL is called, in the host transports' words.
    let out = guarded(|| {
        let mut small = vec![0f32; 3];
        let e = comm
            .reduce_scatter(&f32s, &mut small, ReduceOp::Sum)
            .expect_err("sizes disagree");
        let want = format!(
            "reduce_scatter on group {}: input holds {n} elements, 1 ranks × 3 needed",
            comm.label()
        );
        if e.to_string() != want {
            return Err(format!("got {e:?}"));
        }
        let e = comm.send(&f32s, 0).expect_err("send to self");
        if !e
            .to_string()
            .contains("cannot send to or receive from itself")
        {
            return Err(format!("got {e}"));
        }
        if comm.aborted().is_some() {
            return Err("an argument error aborted the communicator".into());
        }
        Ok((vec![0.0], vec![0.0]))
    });
    rows.push(row(
        "argument_errors",
        "-",
        "-".into(),
        "wrong sizes, send to self: errors, no abort",
        out,
    ));
    rows
}

/// Sub-communicators: `ncclCommSplit` and `new_group`, each running a collective.
fn group_rows(comm: &NcclComm, rng: &mut StdRng) -> Vec<Row> {
    let x = values(rng, 1 << 16, DType::F32);
    let mut rows = Vec::new();
    let out = guarded(|| {
        let split = comm.split("split", 0, 0).map_err(err)?;
        if split.label().to_string() != format!("split[{}]", comm.global_rank()) {
            return Err(format!("label {}", split.label()));
        }
        let t = upload(comm.device(), &x, &[x.len()], DType::F32)?;
        let y = split.all_reduce_tensor(&t, ReduceOp::Sum).map_err(err)?;
        Ok((download(&y)?, x.clone()))
    });
    rows.push(row(
        "split_all_reduce",
        "f32",
        format!("[{}]", x.len()),
        "ncclCommSplit color 0",
        out,
    ));
    let out = guarded(|| {
        let me = comm.global_rank();
        let tp = comm.new_group("tp", &[me]).map_err(err)?;
        let t = upload(comm.device(), &x, &[x.len()], DType::F32)?;
        let y = tp.all_gather_tensor(&t).map_err(err)?;
        let e = comm.new_group("dp", &[me + 1]).expect_err("not a member");
        if !e.to_string().contains("not a member") {
            return Err(format!("non-member: {e}"));
        }
        Ok((download(&y)?, x.clone()))
    });
    rows.push(row(
        "new_group_all_gather",
        "f32",
        format!("[{}]", x.len()),
        "new_group tp[rank]; non-member refused",
        out,
    ));
    rows.push(warm_up_row(comm));
    rows
}

/// The warm-up (issue 44): a rank alone plans nothing and `warm_up` returns at once; then every
/// kind of warm-up operation runs on groups of one (the pipeline exchange as a send to oneself)
/// and the final wait returns.
fn warm_up_row(comm: &NcclComm) -> Row {
    use nccl::{GroupKind, WarmupOp};
    let out = guarded(|| {
        let me = comm.global_rank();
        let alone = vec![me];
        let members = GroupMembers {
            tp: alone.clone(),
            pp: alone.clone(),
            dp: alone.clone(),
            cp: alone.clone(),
            dp_cp: alone.clone(),
            ep: alone.clone(),
            etp: alone.clone(),
            edp: alone.clone(),
            embedding: Some(alone),
        };
        let planned = nccl::warmup_plan(&members, me, true).map_err(err)?;
        if !planned.is_empty() {
            return Err(format!("a rank alone planned {planned:?}"));
        }
        let groups = ProcessGroups::new(&members, comm).map_err(err)?;
        nccl::warm_up(&groups, true).map_err(err)?;
        let ops = [
            WarmupOp::AllReduce(GroupKind::Tp),
            WarmupOp::Neighbours {
                group: GroupKind::Pp,
                peers: vec![0],
            },
            WarmupOp::AllToAll(GroupKind::Ep),
            WarmupOp::AllReduce(GroupKind::Embedding),
        ];
        nccl::run_warmup(&groups, &ops).map_err(err)?;
        Ok((vec![0.0], vec![0.0]))
    });
    row(
        "warm_up",
        "f32",
        "[1]".into(),
        "empty plan alone; all-reduce, send/recv to self, all-to-all, wait",
        out,
    )
}

/// Every NCCL row (needs libnccl.so on LD_LIBRARY_PATH).
pub(crate) fn rows(device_index: usize) -> (Vec<Row>, Option<NcclComm>) {
    let made = guarded(|| {
        let dev = CudaDevice::get(device_index).map_err(err)?;
        NcclComm::solo(&dev, 0).map_err(err)
    });
    let comm = match made {
        Ok(comm) => comm,
        Err(e) => {
            let row = Row {
                op: "nccl_init".into(),
                dtype: "-",
                shape: "-".into(),
                errors: failed(),
                note: first_line(&e),
            };
            return (vec![row], None);
        }
    };
    let mut rng = StdRng::seed_from_u64(41);
    let mut rows = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        rows.extend(tensor_rows(&comm, &mut rng, dtype));
    }
    rows.extend(host_rows(&comm, &mut rng));
    rows.extend(group_rows(&comm, &mut rng));
    if let Some(reason) = comm.aborted() {
        rows.push(Row {
            op: "nccl_not_aborted".into(),
            dtype: "-",
            shape: "-".into(),
            errors: failed(),
            note: first_line(reason),
        });
    }
    (rows, Some(comm))
}

/// Median wall time of `f` with the device synchronised around it.
fn median_ms(
    dev: &CudaDevice,
    reps: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    f()?;
    dev.synchronize().map_err(err)?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        dev.synchronize().map_err(err)?;
        t.push(start.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// One timing row per collective at 1 MiB and 256 MiB of bf16: wall time (host clock around a
/// device sync), GPU time on the communication stream (from the communicator's events) and the
/// algorithm bandwidth. In a group of one NCCL copies device to device, so this bounds the
/// per-call overhead and shows that no host copy is involved (256 MiB through the host would
/// take tens of ms).
pub(crate) fn timings(comm: &NcclComm) -> String {
    let mut out = String::from(
        "| collective (NCCL, 1 rank) | MiB | wall ms | GPU ms | algbw GB/s |\n|---|---:|---:|---:|---:|\n",
    );
    let dev = comm.device().clone();
    for mib in [1usize, 256] {
        let n = mib * (1 << 20) / 2;
        let normal = ferrotron_cuda::Distribution::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let x = match ferrotron_cuda::random(&dev, &[n / 256, 256], normal, DType::BF16) {
            Ok(x) => x,
            Err(e) => {
                out.push_str(&format!(
                    "| {mib} MiB | failed: {} |\n",
                    first_line(&e.to_string())
                ));
                continue;
            }
        };
        let rows = x.shape()[0];
        type Run<'a> = Box<dyn Fn() -> Result<(), String> + 'a>;
        let kinds: Vec<(&str, Run)> = vec![
            (
                "all_reduce",
                Box::new(|| {
                    comm.all_reduce_tensor(&x, ReduceOp::Sum)
                        .map(drop)
                        .map_err(err)
                }),
            ),
            (
                "all_reduce_started",
                Box::new(|| waited(comm.all_reduce_tensor_started(&x, ReduceOp::Sum)).map(drop)),
            ),
            (
                "all_gather_started",
                Box::new(|| waited(comm.all_gather_tensor_started(&x)).map(drop)),
            ),
            (
                "reduce_scatter_started",
                Box::new(|| {
                    waited(comm.reduce_scatter_tensor_started(&x, ReduceOp::Sum)).map(drop)
                }),
            ),
            (
                "all_gather",
                Box::new(|| comm.all_gather_tensor(&x).map(drop).map_err(err)),
            ),
            (
                "reduce_scatter",
                Box::new(|| {
                    comm.reduce_scatter_tensor(&x, ReduceOp::Sum)
                        .map(drop)
                        .map_err(err)
                }),
            ),
            (
                "broadcast",
                Box::new(|| comm.broadcast_tensor(&x, 0).map(drop).map_err(err)),
            ),
            (
                "all_to_all",
                Box::new(|| {
                    comm.all_to_all_rows_tensor(&x, &[rows], &[rows])
                        .map(drop)
                        .map_err(err)
                }),
            ),
            (
                "send_recv",
                Box::new(|| {
                    comm.send_recv_tensors(
                        &[(&x, 0)],
                        &[RecvSpec {
                            shape: x.shape().to_vec(),
                            dtype: DType::BF16,
                            peer: 0,
                        }],
                    )
                    .map(drop)
                    .map_err(err)
                }),
            ),
        ];
        for (name, run) in kinds {
            nccl::stats::reset();
            let wall = median_ms(&dev, 10, &*run);
            let gpu = nccl::stats::snapshot()
                .first()
                .map(|s| s.totals.ms / s.totals.calls as f64);
            match wall {
                Ok(ms) => {
                    let gpu_ms = gpu.unwrap_or(f64::NAN);
                    let bytes = (n * 2) as f64;
                    out.push_str(&format!(
                        "| {name} | {mib} | {ms:.3} | {gpu_ms:.3} | {:.1} |\n",
                        bytes / (gpu_ms * 1e-3) / 1e9
                    ));
                }
                Err(e) => out.push_str(&format!(
                    "| {name} | {mib} | failed: {} | | |\n",
                    first_line(&e)
                )),
            }
        }
    }
    out
}

/// A started collective's output once the compute stream waited for it.
fn waited(
    started: Result<(CudaTensor, nccl::StartedCollective), ferrotron_dist::CommError>,
) -> Result<CudaTensor, String> {
    let (out, started) = started.map_err(err)?;
    started.wait().map_err(err)?;
    Ok(out)
}
