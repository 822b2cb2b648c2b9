//! The scaled-dot-product attention graphs cuDNN's fused flash-attention engines recognise,
//! node for node as NVIDIA's cudnn-frontend builds them (`CompositeSDPANode` and
//! `CompositeSDPABackwardNode` in `scaled_dot_product_flash_attention.h`, causal mask and
//! sliding window from `attn_score_modifiers.h`'s `sliding_window_mask` as
//! `diagonal_band_mask.h`'s `CompositeDiagonalBandMaskNode` builds them for cuDNN before 9.21
//! (the GPU machine has 9.19; 9.21's single band-mask operation is not needed), softmax with
//! stats from `softmax.h`):
//!
//! forward: `S = Q·Kᵀ` → `·scale` → causal select(-inf) (→ window select(-inf)) → max, sub,
//! exp, sum, `stats = max +
//! ln sum`, div → (dropout: `·Bernoulli(1-p)·1/(1-p)`) → `O = P·V`;
//!
//! backward: `softmax_sum = Σ dO∘O (· (1-p))` (f32, in memory), `P = exp(Q·Kᵀ·scale − stats)`
//! (causal-masked), `dV = Pᵀ·dO`, `dS = (dO·Vᵀ (∘ mask) − softmax_sum) ∘ P (· 1/(1-p)) · scale`,
//! `dK = dSᵀ·Q`, `dQ = dS·K` through an f32 accumulator; grouped K/V by a head reduction.
//!
//! The value head dim may differ from the query/key one (multi-latent attention: DeepSeek-V3's
//! 192 and 128), as the frontend's node takes it: `d_qk` for Q, K, dQ, dK and the dQ
//! accumulator, `d_v` for V, O, dO, dV and `dO∘O`; the scores are the same. With equal head
//! dims every tensor is what it was before (the graphs are pinned by snapshot tests).

use super::graph::{Dt, Graph, Pw, Red, packed};

pub const Q: i64 = 1;
pub const K: i64 = 2;
pub const V: i64 = 3;
pub const O: i64 = 4;
pub const STATS: i64 = 5;
pub const D_O: i64 = 6;
pub const D_Q: i64 = 7;
pub const D_K: i64 = 8;
pub const D_V: i64 = 9;
pub const SOFTMAX_SUM: i64 = 10;
pub const DQ_ACCUM: i64 = 11;
pub const SEED: i64 = 12;
pub const OFFSET: i64 = 13;
pub const SCALE: i64 = 20;
pub const NEG_INF: i64 = 21;
pub const ONE: i64 = 22;
pub const DROPOUT_SCALE: i64 = 23;
pub const DROPOUT_KEEP: i64 = 24;
/// cudnn-frontend's `diagonal_band_left_bound` (`left + 1`) as an f32 scalar.
pub const LEFT_BOUND: i64 = 25;

/// Which keys a query sees, top-left aligned (query `i`, key `j`): `j ≤ i` when `causal`, and
/// `j ≥ i − left` with a sliding `window` of `left` (Megatron's `--window-size (left, 0)`;
/// cudnn-frontend's `diagonal_band_left_bound` is `left + 1`: it keeps `j + bound > i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SdpaMask {
    pub causal: bool,
    pub window: Option<i64>,
}

impl SdpaMask {
    /// The left bound's value, for the variant pack.
    pub fn left_bound(&self) -> Option<f32> {
        self.window.map(|left| (left + 1) as f32)
    }
}

/// Everything that selects one compiled plan: shapes, element strides of every tensor with
/// memory, dtype, mask and dropout. (The scale and the dropout seed are run-time values.)
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SdpaKey {
    pub backward: bool,
    pub batch: i64,
    pub heads: i64,
    pub groups: i64,
    pub seq_q: i64,
    pub seq_kv: i64,
    /// Query and key channels per head.
    pub head_dim: i64,
    /// Value (and output) channels per head.
    pub value_dim: i64,
    pub dtype: Dt,
    pub mask: SdpaMask,
    /// Dropout probability as f32 bits (0 = none).
    pub dropout_bits: u32,
    /// `[b, h, s, d]` element strides of q, k, v, o (and dO, dQ, dK, dV for the backward).
    pub strides: Vec<[i64; 4]>,
}

impl SdpaKey {
    pub fn dropout(&self) -> f32 {
        f32::from_bits(self.dropout_bits)
    }

    /// The key as the plan-choice cache names it (`tune.rs`): its debug form, less the value
    /// head dim where it equals the query/key one, so choices remembered before value head dims
    /// existed still name the same graphs.
    pub fn problem(&self) -> String {
        let full = format!("{self:?}");
        if self.value_dim == self.head_dim {
            full.replacen(&format!(", value_dim: {}", self.value_dim), "", 1)
        } else {
            full
        }
    }
}

fn swap23(s: [i64; 4]) -> [i64; 4] {
    [s[0], s[1], s[3], s[2]]
}

struct Dims {
    b: i64,
    h: i64,
    g: i64,
    sq: i64,
    skv: i64,
    /// Query/key head dim.
    d: i64,
    /// Value head dim.
    dv: i64,
}

impl Dims {
    fn of(k: &SdpaKey) -> Self {
        Self {
            b: k.batch,
            h: k.heads,
            g: k.groups,
            sq: k.seq_q,
            skv: k.seq_kv,
            d: k.head_dim,
            dv: k.value_dim,
        }
    }
    fn scores(&self) -> ([i64; 4], [i64; 4]) {
        let dims = [self.b, self.h, self.sq, self.skv];
        let s = packed(&dims);
        (dims, [s[0], s[1], s[2], s[3]])
    }
    fn rows(&self) -> ([i64; 4], [i64; 4]) {
        (
            [self.b, self.h, self.sq, 1],
            [self.h * self.sq, self.sq, 1, 1],
        )
    }
}

/// `x` with `-inf` where `keep` is false (`NEG_INF` registered by [`masked`]).
fn select(g: &mut Graph, name: &str, x: i64, keep: i64) -> i64 {
    let (dims, strides) = {
        let t = g.tensor(x);
        (t.dims.clone(), t.strides.clone())
    };
    let y = g.virt(name, &dims, &strides, Dt::F32);
    g.pw_into(Pw::BinarySelect, x, Some(NEG_INF), Some(keep), y);
    y
}

/// The scores `x` masked as `mask` says: the causal mask (top-left diagonal: keep column ≤ row)
/// then the sliding window's left bound (keep column + bound > row, the bound an f32 scalar as
/// the frontend passes it), each a pair of generated indices, a comparison and a select.
fn masked(g: &mut Graph, mask: SdpaMask, x: i64) -> i64 {
    if !mask.causal && mask.window.is_none() {
        return x;
    }
    g.scalar(NEG_INF, "-inf");
    let mut last = x;
    if mask.causal {
        let row = g.pw(
            "gen_row_index",
            Pw::GenIndex { axis: 2 },
            last,
            None,
            Dt::I32,
        );
        let col = g.pw(
            "gen_col_index",
            Pw::GenIndex { axis: 3 },
            last,
            None,
            Dt::I32,
        );
        let keep = g.pw("row>=col", Pw::CmpGe, row, Some(col), Dt::Bool);
        last = select(g, "causal_masked", last, keep);
    }
    if mask.window.is_some() {
        let bound = g.scalar(LEFT_BOUND, "left_bound");
        let row = g.pw(
            "gen_row_index",
            Pw::GenIndex { axis: 2 },
            last,
            None,
            Dt::I32,
        );
        let col = g.pw(
            "gen_col_index",
            Pw::GenIndex { axis: 3 },
            last,
            None,
            Dt::I32,
        );
        let shifted = g.pw("col+window", Pw::Add, col, Some(bound), Dt::F32);
        let keep = g.pw("col+window>row", Pw::CmpGt, shifted, Some(row), Dt::Bool);
        last = select(g, "window_masked", last, keep);
    }
    last
}

/// The forward graph. Inputs Q, K, V (and SEED, OFFSET with dropout); outputs O and STATS.
pub fn forward_graph(key: &SdpaKey) -> Graph {
    assert!(!key.backward);
    let n = Dims::of(key);
    let dt = key.dtype;
    let [sq_, sk_, sv_, so_] = [
        key.strides[0],
        key.strides[1],
        key.strides[2],
        key.strides[3],
    ];
    let mut g = Graph::new();
    let q = g.io(Q, "Q", &[n.b, n.h, n.sq, n.d], &sq_, dt);
    let kt = g.io(K, "K^T", &[n.b, n.g, n.d, n.skv], &swap23(sk_), dt);
    let v = g.io(V, "V", &[n.b, n.g, n.skv, n.dv], &sv_, dt);
    let o = g.io(O, "O", &[n.b, n.h, n.sq, n.dv], &so_, dt);
    let (rows, row_strides) = n.rows();
    let stats = g.io(STATS, "stats", &rows, &row_strides, Dt::F32);
    let scale = g.scalar(SCALE, "attn_scale");
    let (sdims, sstrides) = n.scores();

    let s = g.virt("bmm1", &sdims, &sstrides, Dt::F32);
    g.matmul(q, kt, s);
    let scaled = g.pw("attn_scale", Pw::Mul, s, Some(scale), Dt::F32);
    let mut last = masked(&mut g, key.mask, scaled);
    // Softmax, as `CompositeSoftmaxNode` with stats.
    let max = g.virt("max", &rows, &row_strides, Dt::F32);
    g.reduce(Red::Max, last, max);
    let sub = g.pw("sub_M", Pw::Sub, last, Some(max), Dt::F32);
    let exp = g.pw("exp_sub_M", Pw::Exp, sub, None, Dt::F32);
    let sum = g.virt("sum_exp", &rows, &row_strides, Dt::F32);
    g.reduce(Red::Add, exp, sum);
    let log = g.virt("log", &rows, &row_strides, Dt::F32);
    g.pw_into(Pw::Log, sum, None, None, log);
    g.pw_into(Pw::Add, max, Some(log), None, stats);
    let dropout = key.dropout();
    // bmm2's A operand carries the I/O type (a cuDNN backend requirement).
    let p_type = if dropout > 0.0 { Dt::F32 } else { dt };
    let p = g.virt("softmax", &sdims, &sstrides, p_type);
    g.pw_into(Pw::Div, exp, Some(sum), None, p);
    last = p;
    if dropout > 0.0 {
        let seed = g.io(SEED, "seed", &[1; 4], &[1; 4], Dt::I64);
        let offset = g.io(OFFSET, "offset", &[1; 4], &[1; 4], Dt::I64);
        let mask = g.virt("rng", &sdims, &sstrides, Dt::F32);
        g.rng(1.0 - f64::from(dropout), mask, seed, offset);
        let masked = g.pw("dropout_mask_mul", Pw::Mul, last, Some(mask), Dt::F32);
        let ds = g.scalar(DROPOUT_SCALE, "dropout_scale");
        last = g.pw("dropout_scale", Pw::Mul, masked, Some(ds), dt);
    }
    g.matmul(last, v, o);
    g
}

/// The backward graph. Inputs Q, K, V, O, dO, STATS (SEED, OFFSET); outputs dQ, dK, dV, and the
/// f32 scratch tensors SOFTMAX_SUM `[b, h, s_q, 1]` and DQ_ACCUM `[b, h, s_q, d]` (packed).
pub fn backward_graph(key: &SdpaKey) -> Graph {
    assert!(key.backward);
    let n = Dims::of(key);
    let dt = key.dtype;
    let st = &key.strides;
    let mut g = Graph::new();
    let q = g.io(Q, "Q", &[n.b, n.h, n.sq, n.d], &st[0], dt);
    let kt = g.io(K, "K^T", &[n.b, n.g, n.d, n.skv], &swap23(st[1]), dt);
    let vt = g.io(V, "V^T", &[n.b, n.g, n.dv, n.skv], &swap23(st[2]), dt);
    let o = g.io(O, "O", &[n.b, n.h, n.sq, n.dv], &st[3], dt);
    let d_o = g.io(D_O, "dO", &[n.b, n.h, n.sq, n.dv], &st[4], dt);
    let d_q = g.io(D_Q, "dQ", &[n.b, n.h, n.sq, n.d], &st[5], dt);
    let d_k = g.io(D_K, "dK", &[n.b, n.g, n.skv, n.d], &st[6], dt);
    let d_v = g.io(D_V, "dV", &[n.b, n.g, n.skv, n.dv], &st[7], dt);
    let (rows, row_strides) = n.rows();
    let stats = g.io(STATS, "stats", &rows, &row_strides, Dt::F32);
    let scale = g.scalar(SCALE, "attn_scale");
    let (sdims, sstrides) = n.scores();
    let dropout = key.dropout();

    let mask = (dropout > 0.0).then(|| {
        let seed = g.io(SEED, "seed", &[1; 4], &[1; 4], Dt::I64);
        let offset = g.io(OFFSET, "offset", &[1; 4], &[1; 4], Dt::I64);
        let mask = g.virt("rng", &sdims, &sstrides, Dt::F32);
        g.rng(1.0 - f64::from(dropout), mask, seed, offset);
        mask
    });
    let (drop_scale, drop_keep) = if dropout > 0.0 {
        (
            Some(g.scalar(DROPOUT_SCALE, "dropout_scale")),
            g.scalar(DROPOUT_KEEP, "dropout_scale_inv"),
        )
    } else {
        (None, g.scalar(ONE, "one"))
    };

    // softmax_sum = Σ_d dO ∘ O (· keep)
    let do_o = g.virt(
        "mul_dO_O",
        &[n.b, n.h, n.sq, n.dv],
        &[n.h * n.sq * n.dv, n.sq * n.dv, n.h * n.dv, 1],
        Dt::F32,
    );
    g.pw_into(Pw::Mul, d_o, Some(o), None, do_o);
    let red = g.virt("reduce_dO_o", &rows, &row_strides, Dt::F32);
    g.reduce(Red::Add, do_o, red);
    let softmax_sum = g.io(SOFTMAX_SUM, "softmax_sum", &rows, &row_strides, Dt::F32);
    g.pw_into(Pw::Mul, red, Some(drop_keep), None, softmax_sum);

    // P = exp(Q·Kᵀ·scale − stats), masked.
    let s = g.virt("matmul_Q_KT", &sdims, &sstrides, Dt::F32);
    g.matmul(q, kt, s);
    let s = g.pw("mul_s_attn_scale", Pw::Mul, s, Some(scale), Dt::F32);
    let shifted = g.pw("sub_s_m", Pw::Sub, s, Some(stats), Dt::F32);
    let mut last = masked(&mut g, key.mask, shifted);
    let exp_s = g.pw("exp_s", Pw::Exp, last, None, Dt::F32);
    last = exp_s;
    if let Some(mask) = mask {
        last = g.pw("mul_p_dropout_mask", Pw::Mul, last, Some(mask), Dt::F32);
        last = g.pw("mul_p_dropout_scale", Pw::Mul, last, drop_scale, Dt::F32);
    }
    let transposed = [n.h * n.sq * n.skv, n.sq * n.skv, 1, n.skv];
    let pt = g.virt("reshape_p", &[n.b, n.h, n.skv, n.sq], &transposed, dt);
    g.reshape(last, pt);
    head_reduced_matmul(&mut g, &n, pt, d_o, d_v, n.dv, dt, "matmul_pT_dO");

    // dS
    let dp = g.virt("matmul_dO_VT", &sdims, &sstrides, Dt::F32);
    g.matmul(d_o, vt, dp);
    last = dp;
    if let Some(mask) = mask {
        last = g.pw("dP_dropout_mask", Pw::Mul, last, Some(mask), Dt::F32);
    }
    last = g.pw(
        "sub_dP_softmax_sum",
        Pw::Sub,
        last,
        Some(softmax_sum),
        Dt::F32,
    );
    last = g.pw("mul_dP_exp_s", Pw::Mul, last, Some(exp_s), Dt::F32);
    if drop_scale.is_some() {
        last = g.pw("mul_dS_dropout_scale", Pw::Mul, last, drop_scale, Dt::F32);
    }
    let d_s = g.pw("mul_dS_attn_scale", Pw::Mul, last, Some(scale), Dt::F32);
    let dst = g.virt("reshape_dS", &[n.b, n.h, n.skv, n.sq], &transposed, dt);
    g.reshape(d_s, dst);
    head_reduced_matmul(&mut g, &n, dst, q, d_k, n.d, dt, "matmul_dST_Q");

    // dQ = dS·K through an f32 accumulator.
    let k = g.virt("reshape_k", &[n.b, n.g, n.skv, n.d], &st[1], dt);
    g.reshape(kt, k);
    let dims = [n.b, n.h, n.sq, n.d];
    let accum = g.io(DQ_ACCUM, "dQ_accum", &dims, &packed(&dims), Dt::F32);
    g.matmul(d_s, k, accum);
    g.pw_into(Pw::Identity, accum, None, None, d_q);
    g
}

/// `out = a·b` (`width` channels per head), summed over each group's query heads when K/V are
/// grouped.
#[allow(clippy::too_many_arguments)]
fn head_reduced_matmul(
    g: &mut Graph,
    n: &Dims,
    a: i64,
    b: i64,
    out: i64,
    width: i64,
    dt: Dt,
    name: &str,
) {
    if n.h == n.g {
        g.matmul(a, b, out);
    } else {
        let dims = [n.b, n.h, n.skv, width];
        let full = g.virt(&format!("{name}_fullhead"), &dims, &packed(&dims), dt);
        g.matmul(a, b, full);
        g.reduce(Red::Add, full, out);
    }
}

/// Forward inputs (for [`Graph::validate`]).
pub fn forward_inputs(key: &SdpaKey) -> Vec<i64> {
    let mut v = vec![Q, K, V];
    if key.dropout() > 0.0 {
        v.extend([SEED, OFFSET]);
    }
    v
}

/// Backward inputs (for [`Graph::validate`]).
pub fn backward_inputs(key: &SdpaKey) -> Vec<i64> {
    let mut v = vec![Q, K, V, O, D_O, STATS];
    if key.dropout() > 0.0 {
        v.extend([SEED, OFFSET]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::graph::{Op, Pw};
    use super::*;

    fn key(backward: bool, groups: i64, dropout: f32) -> SdpaKey {
        let (b, h, s, d) = (2, 4, 128, 64);
        // q/o/dq as [b, s, h, d] memory seen as [b, h, s, d]; k, v packed [b, g, s, d].
        let bshd = [s * h * d, d, h * d, 1];
        let kv = [groups * s * d, s * d, d, 1];
        let strides = if backward {
            vec![bshd, kv, kv, bshd, bshd, bshd, kv, kv]
        } else {
            vec![bshd, kv, kv, bshd]
        };
        SdpaKey {
            backward,
            batch: b,
            heads: h,
            groups,
            seq_q: s,
            seq_kv: s,
            head_dim: d,
            value_dim: d,
            dtype: Dt::Bf16,
            mask: SdpaMask {
                causal: true,
                window: None,
            },
            dropout_bits: dropout.to_bits(),
            strides,
        }
    }

    #[test]
    fn forward_graph_is_the_frontend_pattern() {
        let k = key(false, 4, 0.0);
        let g = forward_graph(&k);
        g.validate(&forward_inputs(&k)).unwrap();
        let modes: Vec<String> = g
            .ops
            .iter()
            .map(|op| match op {
                Op::Matmul { .. } => "matmul".to_string(),
                Op::Pointwise { mode, .. } => format!("{mode:?}"),
                Op::Reduction { mode, .. } => format!("reduce {mode:?}"),
                Op::Rng { .. } => "rng".into(),
                Op::Reshape { .. } => "reshape".into(),
            })
            .collect();
        assert_eq!(
            modes,
            [
                "matmul",
                "Mul",
                "GenIndex { axis: 2 }",
                "GenIndex { axis: 3 }",
                "CmpGe",
                "BinarySelect",
                "reduce Max",
                "Sub",
                "Exp",
                "reduce Add",
                "Log",
                "Add",
                "Div",
                "matmul"
            ]
        );
        // K is read transposed in place: dims [b, g, d, s], strides swapped.
        let kt = g.tensor(K);
        assert_eq!(kt.dims, vec![2, 4, 64, 128]);
        assert_eq!(kt.strides, vec![4 * 128 * 64, 128 * 64, 1, 64]);
        // Stats are f32 in memory; the probabilities feeding bmm2 carry the I/O type.
        assert!(!g.tensor(STATS).is_virtual);
        assert_eq!(g.tensor(STATS).dtype, Dt::F32);
        let Op::Matmul { a, .. } = g.ops.last().unwrap() else {
            panic!()
        };
        assert_eq!(g.tensor(*a).dtype, Dt::Bf16);
        assert!(g.tensor(*a).is_virtual);
    }

    #[test]
    fn dropout_adds_philox_mask_and_scale() {
        let k = key(false, 2, 0.1);
        let g = forward_graph(&k);
        g.validate(&forward_inputs(&k)).unwrap();
        let rng = g.ops.iter().find_map(|op| match op {
            Op::Rng {
                keep, seed, offset, ..
            } => Some((*keep, *seed, *offset)),
            _ => None,
        });
        let (keep, seed, offset) = rng.expect("an RNG node");
        assert!((keep - 0.9).abs() < 1e-6);
        assert_eq!((seed, offset), (SEED, OFFSET));
        assert!(g.variant_uids().contains(&DROPOUT_SCALE));
    }

    #[test]
    fn backward_graph_validates_for_mha_and_gqa() {
        for (groups, dropout) in [(4, 0.0), (2, 0.0), (1, 0.1), (4, 0.1)] {
            let k = key(true, groups, dropout);
            let g = backward_graph(&k);
            g.validate(&backward_inputs(&k))
                .unwrap_or_else(|e| panic!("groups {groups} dropout {dropout}: {e}"));
            let reductions = g
                .ops
                .iter()
                .filter(|op| matches!(op, Op::Reduction { .. }))
                .count();
            // softmax_sum, plus dK and dV head sums with grouped K/V.
            assert_eq!(reductions, if groups == 4 { 1 } else { 3 });
            assert!(g.ops.iter().any(|op| matches!(
                op,
                Op::Pointwise {
                    mode: Pw::Identity,
                    y: D_Q,
                    ..
                }
            )));
            for uid in [SOFTMAX_SUM, DQ_ACCUM] {
                assert_eq!(g.tensor(uid).dtype, Dt::F32);
                assert!(!g.tensor(uid).is_virtual);
            }
        }
    }

    /// The modes of a graph's pointwise ops, in order.
    fn pointwise_modes(g: &Graph) -> Vec<Pw> {
        g.ops
            .iter()
            .filter_map(|op| match op {
                Op::Pointwise { mode, .. } => Some(*mode),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_sliding_window_adds_the_frontends_left_bound_mask_after_the_causal_one() {
        for (backward, dropout) in [(false, 0.0), (true, 0.0), (false, 0.1), (true, 0.1)] {
            let mut k = key(backward, 2, dropout);
            k.mask.window = Some(31);
            let g = if backward {
                backward_graph(&k)
            } else {
                forward_graph(&k)
            };
            let inputs = if backward {
                backward_inputs(&k)
            } else {
                forward_inputs(&k)
            };
            g.validate(&inputs)
                .unwrap_or_else(|e| panic!("backward {backward} dropout {dropout}: {e}"));
            let modes = pointwise_modes(&g);
            let causal = modes
                .windows(2)
                .position(|w| w == [Pw::CmpGe, Pw::BinarySelect])
                .expect("the causal mask");
            assert_eq!(
                modes[causal + 2..causal + 7],
                [
                    Pw::GenIndex { axis: 2 },
                    Pw::GenIndex { axis: 3 },
                    Pw::Add,
                    Pw::CmpGt,
                    Pw::BinarySelect
                ],
                "backward {backward}: col + bound > row right after the causal select"
            );
            let bound = g.tensor(LEFT_BOUND);
            assert!(bound.by_value && bound.dtype == Dt::F32);
            assert_eq!(k.mask.left_bound(), Some(32.0));
        }
        // Without a window the graphs are the causal ones, unchanged.
        let plain = forward_graph(&key(false, 2, 0.0));
        assert!(!plain.variant_uids().contains(&LEFT_BOUND));
        assert!(!pointwise_modes(&plain).contains(&Pw::CmpGt));
    }

    /// One line per tensor and per operation: the whole graph cuDNN receives.
    fn render(g: &Graph) -> String {
        let mut out = String::new();
        for t in &g.tensors {
            out.push_str(&format!(
                "tensor {} {:?} dims {:?} strides {:?} {:?}{}{}\n",
                t.uid,
                t.name,
                t.dims,
                t.strides,
                t.dtype,
                if t.is_virtual { " virtual" } else { "" },
                if t.by_value { " by-value" } else { "" },
            ));
        }
        for op in &g.ops {
            out.push_str(&format!("{op:?}\n"));
        }
        out
    }

    /// The graphs of equal query/key and value head dims, pinned: the GPU-tested path must not
    /// change when other head dims are added.
    #[test]
    fn the_graphs_of_equal_head_dims_are_pinned() {
        for (backward, groups, dropout, window) in [
            (false, 4, 0.0, None),
            (false, 2, 0.1, Some(31)),
            (true, 4, 0.0, None),
            (true, 2, 0.1, Some(31)),
        ] {
            let mut k = key(backward, groups, dropout);
            k.mask.window = window;
            let g = if backward {
                backward_graph(&k)
            } else {
                forward_graph(&k)
            };
            let name = format!(
                "sdpa_{}_groups{groups}_dropout{dropout}_window{}",
                if backward { "bwd" } else { "fwd" },
                window.unwrap_or(0)
            );
            insta::assert_snapshot!(name, render(&g));
        }
    }

    /// A key of query/key head dim `d` and value head dim `dv` (q, o, dO, dq as `[b, s, h, d]`
    /// memory, k and v packed, as the forward leaves them).
    fn mla_key(backward: bool, groups: i64, d: i64, dv: i64, dropout: f32) -> SdpaKey {
        let mut k = key(backward, groups, dropout);
        let (b, h, s) = (k.batch, k.heads, k.seq_q);
        let bshd = |d: i64| [s * h * d, d, h * d, 1];
        let kv = |d: i64| [groups * s * d, s * d, d, 1];
        k.head_dim = d;
        k.value_dim = dv;
        k.strides = if backward {
            vec![
                bshd(d),
                kv(d),
                kv(dv),
                bshd(dv),
                bshd(dv),
                bshd(d),
                kv(d),
                kv(dv),
            ]
        } else {
            vec![bshd(d), kv(d), kv(dv), bshd(dv)]
        };
        assert_eq!(b, 2);
        k
    }

    #[test]
    fn a_value_head_dim_of_its_own_shapes_v_o_and_their_gradients() {
        for (d, dv) in [(192, 128), (96, 64), (48, 32)] {
            for (groups, dropout, window) in [(4, 0.0, None), (2, 0.1, Some(31))] {
                let mut fwd = mla_key(false, groups, d, dv, dropout);
                fwd.mask.window = window;
                let g = forward_graph(&fwd);
                g.validate(&forward_inputs(&fwd))
                    .unwrap_or_else(|e| panic!("forward {d}/{dv}: {e}"));
                assert_eq!(g.tensor(Q).dims, vec![2, 4, 128, d]);
                assert_eq!(g.tensor(K).dims, vec![2, groups, d, 128]);
                assert_eq!(g.tensor(V).dims, vec![2, groups, 128, dv]);
                assert_eq!(g.tensor(O).dims, vec![2, 4, 128, dv]);

                let mut bwd = mla_key(true, groups, d, dv, dropout);
                bwd.mask.window = window;
                let g = backward_graph(&bwd);
                g.validate(&backward_inputs(&bwd))
                    .unwrap_or_else(|e| panic!("backward {d}/{dv} groups {groups}: {e}"));
                for (uid, dims) in [
                    (Q, [2, 4, 128, d]),
                    (K, [2, groups, d, 128]),
                    (V, [2, groups, dv, 128]),
                    (O, [2, 4, 128, dv]),
                    (D_O, [2, 4, 128, dv]),
                    (D_Q, [2, 4, 128, d]),
                    (D_K, [2, groups, 128, d]),
                    (D_V, [2, groups, 128, dv]),
                    (DQ_ACCUM, [2, 4, 128, d]),
                ] {
                    assert_eq!(g.tensor(uid).dims, dims, "{}", g.tensor(uid).name);
                }
            }
        }
    }

    #[test]
    fn validation_catches_head_dims_that_do_not_meet() {
        let k = mla_key(false, 4, 192, 128, 0.0);
        let mut g = forward_graph(&k);
        // O with the query's head dim: P·V cannot produce it.
        let o = g.tensors.iter_mut().find(|t| t.uid == O).unwrap();
        o.dims[3] = 192;
        let err = g.validate(&forward_inputs(&k)).unwrap_err();
        assert!(err.contains("is not"), "{err}");

        let k = mla_key(true, 2, 192, 128, 0.0);
        let mut g = backward_graph(&k);
        // dV with the key's head dim: the head sum of Pᵀ·dO cannot produce it.
        let dv = g.tensors.iter_mut().find(|t| t.uid == D_V).unwrap();
        dv.dims[3] = 192;
        let err = g.validate(&backward_inputs(&k)).unwrap_err();
        assert!(err.contains("does not reduce"), "{err}");
    }

    #[test]
    fn the_plan_cache_names_equal_head_dims_as_before() {
        let equal = key(true, 2, 0.0);
        assert!(!equal.problem().contains("value_dim"));
        assert_eq!(
            equal.problem(),
            format!("{equal:?}").replace(", value_dim: 64", "")
        );
        let mla = mla_key(true, 2, 192, 128, 0.0);
        assert!(mla.problem().contains("head_dim: 192, value_dim: 128"));
    }

    #[test]
    fn validation_catches_a_dangling_virtual() {
        let k = key(false, 4, 0.0);
        let mut g = forward_graph(&k);
        g.virt("orphan", &[1, 1, 1, 1], &[1, 1, 1, 1], Dt::F32);
        assert!(g.validate(&forward_inputs(&k)).is_err());
    }
}
