//! End-to-end checks of every kernel family against plain Rust references, on a real GPU.
//!
//! They are `#[ignore]`d because CI has no GPU; run them on the device machine with
//! `<test binary> --ignored` (see the crate README). Outputs are poisoned before every op, so
//! an element a kernel forgot to write shows up as NaN / -1.

use std::sync::Arc;

use crate::*;

fn dev() -> Arc<CudaDevice> {
    let d = CudaDevice::get(0).expect("a CUDA device");
    d.set_poison_allocations(true);
    d
}

fn up(d: &Arc<CudaDevice>, v: &[f32], shape: &[usize], dtype: DType) -> CudaTensor {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    CudaTensor::from_bytes(d, &bytes, shape, DType::F32)
        .and_then(|t| t.cast(dtype))
        .expect("upload")
}

fn down(t: &CudaTensor) -> Vec<f32> {
    let bytes = t
        .cast(DType::F32)
        .and_then(|c| c.to_bytes())
        .expect("download");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn down_i64(t: &CudaTensor) -> Vec<i64> {
    let bytes = t
        .cast(DType::I64)
        .and_then(|c| c.to_bytes())
        .expect("download");
    bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(ok, "element {i}: got {g}, want {w} (tol {tol})");
    }
}

fn seq(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * scale)
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn roundtrip_every_dtype() {
    let d = dev();
    for dtype in DType::ALL {
        let bytes: Vec<u8> = (0..24 * dtype.size_in_bytes())
            .map(|i| (i % 2) as u8)
            .collect();
        let t = CudaTensor::from_bytes(&d, &bytes, &[2, 3, 4], dtype).unwrap();
        assert_eq!(t.to_bytes().unwrap(), bytes, "{dtype}");
    }
    assert!(d.memory_stats().peak_bytes > 0);
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn elementwise_broadcast_and_views() {
    let d = dev();
    let a = seq(24, 0.1);
    let b = seq(4, 0.3);
    for (dtype, tol) in [(DType::F32, 1e-6), (DType::BF16, 2e-2), (DType::F16, 2e-3)] {
        let ta = up(&d, &a, &[2, 3, 4], dtype);
        let tb = up(&d, &b, &[4], dtype);
        let want: Vec<f32> = (0..24).map(|i| a[i] * b[i % 4]).collect();
        close(&down(&binary(&ta, &tb, BinaryOp::Mul).unwrap()), &want, tol);
        let want: Vec<f32> = a.iter().map(|x| x.exp()).collect();
        close(&down(&unary(&ta, UnaryOp::Exp).unwrap()), &want, tol);
    }
    // Transposed (non-contiguous) input, scalar ops, comparisons, where.
    let t = up(&d, &a, &[4, 6], DType::F32).swap_dims(0, 1).unwrap();
    let c = binary_scalar(&t, Scalar::Float(2.0), BinaryOp::Sub).unwrap();
    let want: Vec<f32> = (0..24).map(|i| a[(i % 4) * 6 + i / 4] - 2.0).collect();
    close(&down(&c), &want, 0.0);
    let r = scalar_binary(Scalar::Float(1.0), &t, BinaryOp::Sub).unwrap();
    close(
        &down(&r),
        &want.iter().map(|x| -1.0 - x).collect::<Vec<_>>(),
        1e-6,
    );
    let mask = compare_scalar(&c, Scalar::Float(0.0), CompareOp::Gt).unwrap();
    assert_eq!(mask.dtype(), DType::Bool);
    let w = where_(&mask, &c, &zeros(&d, &[1], DType::F32).unwrap()).unwrap();
    close(
        &down(&w),
        &want.iter().map(|x| x.max(0.0)).collect::<Vec<_>>(),
        0.0,
    );
    let f = mask_fill(&c, &mask, Scalar::Float(7.0)).unwrap();
    close(
        &down(&f),
        &want
            .iter()
            .map(|&x| if x > 0.0 { 7.0 } else { x })
            .collect::<Vec<_>>(),
        0.0,
    );
    let cl = clamp(&c, Some(Scalar::Float(-1.0)), Some(Scalar::Float(1.0))).unwrap();
    close(
        &down(&cl),
        &want.iter().map(|x| x.clamp(-1.0, 1.0)).collect::<Vec<_>>(),
        0.0,
    );
    // Integer math: remainder with the divisor's sign, integer power.
    let ints = up(&d, &[-7.0, 7.0, -3.0, 5.0], &[4], DType::I64);
    let rem = binary_scalar(&ints, Scalar::Int(3), BinaryOp::Rem).unwrap();
    assert_eq!(down_i64(&rem), vec![2, 1, 0, 2]);
    let pw = binary_scalar(&ints, Scalar::Int(2), BinaryOp::Pow).unwrap();
    assert_eq!(down_i64(&pw), vec![49, 49, 9, 25]);
    // Flip and stepped slice are views; contiguous() materialises them.
    let v = up(&d, &seq(10, 1.0), &[10], DType::F32);
    let s = v
        .slice(&[SliceArg {
            start: 2,
            end: 8,
            step: -2,
        }])
        .unwrap();
    let base = seq(10, 1.0);
    close(&down(&s), &[base[7], base[5], base[3]], 0.0);
    close(
        &down(&v.flip(&[0]).unwrap()),
        &base.iter().rev().copied().collect::<Vec<_>>(),
        0.0,
    );
    let ar = arange(&d, 3, -4, -2, DType::I64).unwrap();
    assert_eq!(down_i64(&ar), vec![3, 1, -1, -3]);
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn reductions_scans_and_sorts() {
    let d = dev();
    let a = seq(3 * 5, 0.5);
    let t = up(&d, &a, &[3, 5], DType::F32);
    let sum1 = reduce_dim(&t, 1, ReduceOp::Sum).unwrap();
    assert_eq!(sum1.shape(), &[3, 1]);
    let want: Vec<f32> = (0..3).map(|r| a[r * 5..r * 5 + 5].iter().sum()).collect();
    close(&down(&sum1), &want, 1e-6);
    let max0 = reduce_dim(&t, 0, ReduceOp::Max).unwrap();
    let want: Vec<f32> = (0..5)
        .map(|c| (0..3).map(|r| a[r * 5 + c]).fold(f32::MIN, f32::max))
        .collect();
    close(&down(&max0), &want, 0.0);
    let am = arg_reduce_dim(&t, 1, ArgOp::ArgMax).unwrap();
    let want: Vec<i64> = (0..3)
        .map(|r| {
            let row = &a[r * 5..r * 5 + 5];
            let m = row.iter().cloned().fold(f32::MIN, f32::max);
            row.iter().position(|&x| x == m).unwrap() as i64
        })
        .collect();
    assert_eq!(down_i64(&am), want);
    // Thread-per-output paths: a column sum and short rows.
    let cols = seq(4 * 1500, 0.25);
    let tc = up(&d, &cols, &[4, 1500], DType::F32);
    let want: Vec<f32> = (0..1500)
        .map(|c| (0..4).map(|r| cols[r * 1500 + c]).sum())
        .collect();
    close(
        &down(&reduce_dim(&tc, 0, ReduceOp::Sum).unwrap()),
        &want,
        1e-6,
    );
    let rows = tc.reshape(&[2000, 3]).unwrap();
    let want: Vec<f32> = (0..2000)
        .map(|r| (cols[r * 3] + cols[r * 3 + 1] + cols[r * 3 + 2]) / 3.0)
        .collect();
    close(
        &down(&reduce_dim(&rows, 1, ReduceOp::Mean).unwrap()),
        &want,
        1e-6,
    );
    // Two-pass full reduction.
    let n = 300_001;
    let big: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let tb = up(&d, &big, &[n], DType::F32);
    let total: f64 = big.iter().map(|&x| f64::from(x)).sum();
    close(
        &down(&reduce_all(&tb, ReduceOp::Sum).unwrap()),
        &[total as f32],
        1e-6,
    );
    close(
        &down(&reduce_all(&tb, ReduceOp::Mean).unwrap()),
        &[(total / n as f64) as f32],
        1e-6,
    );
    close(&down(&reduce_all(&tb, ReduceOp::Max).unwrap()), &[6.0], 0.0);
    let any = reduce_all(&tb, ReduceOp::All).unwrap();
    assert_eq!(down(&any), vec![0.0]);
    // Scan along dim 1.
    let cs = cumulative(&t, 1, ScanOp::Sum).unwrap();
    let mut want = a.clone();
    for r in 0..3 {
        for c in 1..5 {
            want[r * 5 + c] += want[r * 5 + c - 1];
        }
    }
    close(&down(&cs), &want, 1e-6);
    // Sort with ties (stable) and argsort, descending.
    let keys = [3.0, 1.0, 3.0, 2.0, 1.0, 5.0, 0.0];
    let tk = up(&d, &keys, &[1, 7], DType::F32);
    let (vals, idx) = sort_with_indices(&tk, 1, true).unwrap();
    close(&down(&vals), &[5.0, 3.0, 3.0, 2.0, 1.0, 1.0, 0.0], 0.0);
    assert_eq!(down_i64(&idx), vec![5, 0, 2, 3, 1, 4, 6]);
    assert_eq!(
        down_i64(&argsort(&tk, 1, false).unwrap()),
        vec![6, 1, 4, 3, 0, 2, 5]
    );
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn indexing_family() {
    let d = dev();
    let a = seq(12, 1.0);
    let t = up(&d, &a, &[3, 4], DType::F32);
    let idx = up(&d, &[2.0, 0.0, 2.0], &[3], DType::I64);
    // index_select along dim 0.
    let s = select(&t, 0, &idx).unwrap();
    let want: Vec<f32> = [2, 0, 2]
        .iter()
        .flat_map(|&r| a[r * 4..r * 4 + 4].to_vec())
        .collect();
    close(&down(&s), &want, 0.0);
    // select_add with a duplicate index accumulates.
    let ones_v = ones(&d, &[3, 4], DType::F32).unwrap();
    let sa = select_assign(&t, 0, &idx, &ones_v, ScatterReduce::Add).unwrap();
    let mut want = a.clone();
    for c in 0..4 {
        want[c] += 1.0;
        want[8 + c] += 2.0;
    }
    close(&down(&sa), &want, 0.0);
    // gather along dim 1, then scatter_add back.
    let gi = up(&d, &[3.0, 0.0, 1.0, 1.0, 2.0, 2.0], &[3, 2], DType::I64);
    let g = gather(&t, 1, &gi).unwrap();
    close(&down(&g), &[a[3], a[0], a[5], a[5], a[10], a[10]], 0.0);
    let z = zeros(&d, &[3, 4], DType::F32).unwrap();
    let sc = scatter(&z, 1, &gi, &g, ScatterReduce::Add).unwrap();
    let mut want = vec![0.0; 12];
    want[3] = a[3];
    want[0] = a[0];
    want[5] = 2.0 * a[5];
    want[10] = 2.0 * a[10];
    close(&down(&sc), &want, 0.0);
    // slice_assign, cat, repeat.
    let patch = full(&d, &[3, 2], Scalar::Float(9.0), DType::F32).unwrap();
    let sl = slice_assign(
        &t,
        &[
            SliceArg::full(3),
            SliceArg {
                start: 0,
                end: 4,
                step: 2,
            },
        ],
        &patch,
    )
    .unwrap();
    let want: Vec<f32> = (0..12)
        .map(|i| if i % 2 == 0 { 9.0 } else { a[i] })
        .collect();
    close(&down(&sl), &want, 0.0);
    let ct = cat(&[t.clone(), patch.clone()], 1).unwrap();
    assert_eq!(ct.shape(), &[3, 6]);
    let want: Vec<f32> = (0..3)
        .flat_map(|r| {
            let mut row = a[r * 4..r * 4 + 4].to_vec();
            row.extend([9.0, 9.0]);
            row
        })
        .collect();
    close(&down(&ct), &want, 0.0);
    let rp = repeat_dim(&t, 0, 2).unwrap();
    assert_eq!(rp.shape(), &[6, 4]);
    close(&down(&rp), &[a.clone(), a.clone()].concat(), 0.0);
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn random_is_reproducible_and_has_the_right_moments() {
    let d = dev();
    d.seed(42);
    let n = 1 << 18;
    let u = down(
        &random(
            &d,
            &[n],
            Distribution::Uniform {
                low: -1.0,
                high: 3.0,
            },
            DType::F32,
        )
        .unwrap(),
    );
    let z = down(
        &random(
            &d,
            &[n],
            Distribution::Normal {
                mean: 1.0,
                std: 2.0,
            },
            DType::F32,
        )
        .unwrap(),
    );
    d.seed(42);
    let u2 = down(
        &random(
            &d,
            &[n],
            Distribution::Uniform {
                low: -1.0,
                high: 3.0,
            },
            DType::F32,
        )
        .unwrap(),
    );
    assert_eq!(u, u2);
    let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
    let var = |v: &[f32], m: f64| {
        v.iter().map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / v.len() as f64
    };
    assert!(u.iter().all(|&x| (-1.0..3.0).contains(&x)));
    assert!((mean(&u) - 1.0).abs() < 0.02, "uniform mean {}", mean(&u));
    let mz = mean(&z);
    assert!((mz - 1.0).abs() < 0.02, "normal mean {mz}");
    assert!((var(&z, mz).sqrt() - 2.0).abs() < 0.02, "normal std");
    let b = down(&random(&d, &[n], Distribution::Bernoulli { p: 0.25 }, DType::Bool).unwrap());
    assert!((mean(&b) - 0.25).abs() < 0.01);
}

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum::<f64>() as f32;
        }
    }
    out
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn matmul_layouts_and_dtypes() {
    let d = dev();
    let (m, k, n) = (33, 70, 45);
    let a = seq(2 * m * k, 0.01);
    let b = seq(k * n, 0.02);
    let want: Vec<f32> = (0..2)
        .flat_map(|bi| matmul_ref(&a[bi * m * k..(bi + 1) * m * k], &b, m, k, n))
        .collect();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 3e-2), (DType::F16, 5e-3)] {
        let ta = up(&d, &a, &[2, m, k], dtype);
        // b broadcast over the batch.
        let tb = up(&d, &b, &[k, n], dtype);
        let out = matmul(&ta, &tb).unwrap();
        assert_eq!(out.shape(), &[2, m, n]);
        close(&down(&out), &want, tol);
        // b given as the transpose of a stored [n, k] matrix: read through the layout.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let tbt = up(&d, &bt, &[n, k], dtype).swap_dims(0, 1).unwrap();
        close(&down(&matmul(&ta, &tbt).unwrap()), &want, tol);
    }
    assert!(matches!(
        matmul(
            &up(&d, &a, &[2, m, k], DType::F32),
            &up(&d, &b, &[n, k], DType::F32)
        ),
        Err(CudaError::Invalid { .. })
    ));
    d.synchronize().unwrap();
}

fn erf_ref(x: f32) -> f32 {
    // Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7), enough for a 1e-5 check.
    let t = 1.0 / (1.0 + 0.327_591_1 * f64::from(x.abs()));
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-f64::from(x) * f64::from(x)).exp();
    (y as f32).copysign(x)
}

fn unary_ref(op: UnaryOp, x: f32) -> f32 {
    use UnaryOp::*;
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.ln(),
        Log1p => x.ln_1p(),
        Sqrt => x.sqrt(),
        Sin => x.sin(),
        Cos => x.cos(),
        Tan => x.tan(),
        Tanh => x.tanh(),
        Sinh => x.sinh(),
        Cosh => x.cosh(),
        Asin => x.asin(),
        Acos => x.acos(),
        Atan => x.atan(),
        Asinh => x.asinh(),
        Acosh => x.acosh(),
        Atanh => x.atanh(),
        Erf => erf_ref(x),
        Recip => 1.0 / x,
        Floor => x.floor(),
        Ceil => x.ceil(),
        Round => x.round_ties_even(),
        Trunc => x.trunc(),
        Sign => {
            if x == 0.0 {
                0.0
            } else {
                x.signum()
            }
        }
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Gelu => 0.5 * x * (1.0 + erf_ref(x / std::f32::consts::SQRT_2)),
        Relu => x.max(0.0),
        Silu => x / (1.0 + (-x).exp()),
        Not => f32::from(u8::from(x == 0.0)),
        BitNot => unreachable!("not a float op"),
        IsNan => f32::from(u8::from(x.is_nan())),
        IsInf => f32::from(u8::from(x.is_infinite())),
    }
}

const ALL_UNARY: [UnaryOp; 33] = {
    use UnaryOp::*;
    [
        Neg, Abs, Exp, Log, Log1p, Sqrt, Sin, Cos, Tan, Tanh, Sinh, Cosh, Asin, Acos, Atan, Asinh,
        Acosh, Atanh, Erf, Recip, Floor, Ceil, Round, Trunc, Sign, Sigmoid, Gelu, Relu, Silu, Not,
        BitNot, IsNan, IsInf,
    ]
};

const ALL_BINARY: [BinaryOp; 20] = {
    use BinaryOp::*;
    [
        Add,
        Sub,
        Mul,
        Div,
        Rem,
        Pow,
        Atan2,
        Max,
        Min,
        And,
        Or,
        Xor,
        BitAnd,
        BitOr,
        BitXor,
        Shl,
        Shr,
        GeluBackward,
        ReluBackward,
        SigmoidBackward,
    ]
};

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn every_unary_op_matches_rust_on_f32_and_compiles_for_every_dtype() {
    let d = dev();
    let xs: Vec<f32> = (0..64)
        .map(|i| (i as f32 - 31.5) / 35.0)
        .chain((0..64).map(|i| 1.25 + i as f32 / 16.0))
        .chain([0.5, -0.5, 1.5, 2.5, 0.0, -0.0, f32::NAN, f32::INFINITY])
        .collect();
    let t = up(&d, &xs, &[xs.len()], DType::F32);
    for op in ALL_UNARY {
        let Some(_) = op.expr(DType::F32) else {
            continue;
        };
        let got = down(&unary(&t, op).unwrap());
        let want: Vec<f32> = xs.iter().map(|&x| unary_ref(op, x)).collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let ok =
                (g - w).abs() <= 2e-5 * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()) || g == w;
            assert!(ok, "{op:?}({}) = {g}, want {w} (element {i})", xs[i]);
        }
    }
    for dtype in DType::ALL {
        let t = up(&d, &[1.0, 2.0, 3.0, 4.0], &[4], dtype);
        for op in ALL_UNARY {
            if op.expr(dtype).is_some() {
                unary(&t, op).unwrap_or_else(|e| panic!("{op:?} {dtype}: {e}"));
            }
        }
        for op in ALL_BINARY {
            if op.expr(dtype).is_some() {
                binary(&t, &t, op).unwrap_or_else(|e| panic!("{op:?} {dtype}: {e}"));
                binary_scalar(&t, Scalar::Int(2), op)
                    .unwrap_or_else(|e| panic!("{op:?} {dtype}: {e}"));
            }
        }
        for to in DType::ALL {
            let back = down(&t.cast(to).unwrap());
            let want: Vec<f32> = if to == DType::Bool {
                vec![1.0; 4]
            } else {
                vec![1.0, 2.0, 3.0, 4.0]
            };
            let want = if dtype == DType::Bool {
                vec![1.0; 4]
            } else {
                want
            };
            assert_eq!(back, want, "{dtype} -> {to}");
        }
        for op in [
            ReduceOp::Sum,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Prod,
            ReduceOp::Any,
            ReduceOp::All,
        ] {
            reduce_all(&t, op).unwrap_or_else(|e| panic!("{op:?} {dtype}: {e}"));
        }
        if !dtype.is_bool() {
            for op in [ScanOp::Sum, ScanOp::Prod, ScanOp::Max, ScanOp::Min] {
                cumulative(&t, 0, op).unwrap_or_else(|e| panic!("{op:?} {dtype}: {e}"));
            }
        }
        let (v, _) = sort_with_indices(&t, 0, true).unwrap();
        let want = if dtype == DType::Bool {
            vec![1.0; 4]
        } else {
            vec![4.0, 3.0, 2.0, 1.0]
        };
        assert_eq!(down(&v), want, "sort {dtype}");
        let idx = up(&d, &[3.0, 0.0], &[2], DType::I32);
        select(&t, 0, &idx).unwrap();
        let reduce = if dtype.is_bool() {
            ScatterReduce::Or
        } else {
            ScatterReduce::Add
        };
        if dtype != DType::U8 {
            let s = select_assign(
                &t,
                0,
                &idx,
                &t.slice(&[SliceArg::range(0, 2)]).unwrap(),
                reduce,
            )
            .unwrap();
            if dtype.is_float() || dtype == DType::I64 || dtype == DType::I32 {
                assert_eq!(down(&s), vec![3.0, 2.0, 3.0, 5.0], "select_add {dtype}");
            }
        }
    }
    d.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU: on the device machine, <test binary> --ignored kernels::gpu_tests (crates/ferrotron-cuda/README.md)"]
fn long_rows_sort_and_big_arg_reductions() {
    let d = dev();
    let n = 3000;
    let xs: Vec<f32> = (0..2 * n).map(|i| ((i * 7919) % 1009) as f32).collect();
    let t = up(&d, &xs, &[2, n], DType::BF16);
    let idx = down_i64(&argsort(&t, 1, false).unwrap());
    // The keys the GPU sorts are the bf16-rounded values (ties appear above 256).
    let keys: Vec<f32> = xs
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    for r in 0..2 {
        let mut want: Vec<usize> = (0..n).collect();
        want.sort_by(|&a, &b| keys[r * n + a].total_cmp(&keys[r * n + b]));
        let got: Vec<usize> = idx[r * n..(r + 1) * n]
            .iter()
            .map(|&i| i as usize)
            .collect();
        assert_eq!(got, want, "row {r}");
    }
    let am = down_i64(&arg_reduce_dim(&t, 1, ArgOp::ArgMin).unwrap());
    assert_eq!(
        am,
        vec![0, xs[n..].iter().position(|&x| x == 0.0).unwrap() as i64]
    );
    let big = up(
        &d,
        &xs.iter().cycle().take(400_000).copied().collect::<Vec<_>>(),
        &[400_000],
        DType::I64,
    );
    let s = down_i64(&reduce_all(&big, ReduceOp::Sum).unwrap());
    let want: i64 = xs.iter().cycle().take(400_000).map(|&x| x as i64).sum();
    assert_eq!(s, vec![want]);
    let ints = random(
        &d,
        &[10_000],
        Distribution::Uniform {
            low: -3.0,
            high: 3.0,
        },
        DType::I64,
    )
    .unwrap();
    let v = down_i64(&ints);
    assert!(v.iter().all(|x| (-3..3).contains(x)) && v.contains(&-3) && v.contains(&2));
}
