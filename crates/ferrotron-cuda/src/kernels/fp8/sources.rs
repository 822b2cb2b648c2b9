//! The fp8 kernels: cast-and-transpose with the amax in the same pass (of a tensor, or of an
//! activation or its gradient computed on the way in, with the bias gradient's partial sums),
//! the amax alone (current scaling measures it before the cast), the bias gradient's final
//! sum, and the step-end update of every layer's delayed scales in one launch.
//!
//! Cast-transpose works on 64 × 64 tiles, a block casting [`ROW_TILES`] of them down a band of
//! rows, 256 threads: each thread first issues the 16-byte loads of all its rows in the tile
//! (its 8 elements of two rows, and of every input an activation's gradient reads), then
//! computes, scales and converts pairs with the saturating `__nv_cvt_float2_to_fp8x2`, stores
//! the 8 bytes of the row-major copy at once and leaves them in a shared-memory tile of words,
//! from which the transposed copy is written a word (four rows of a column) at a time; the
//! magnitudes' maximum is taken on the float bits as unsigned integers (so a NaN wins, as in
//! `ferrotron_ops::fp8::scaling::amax`), reduced over the block and merged with one
//! `atomicMax`. Rows and columns must be multiples of 8 (fp8 GEMMs need 16 anyway) and the
//! input contiguous. The scale is read from the device (a layer's state row, or computed from
//! the amax pass), never from the host, and block 0 writes its inverse for the GEMM.

use ferrotron_ops::fp8::scaling::Fp8Format;

use crate::engine::dtype::DType;
use crate::engine::launch::KernelSpec;
use crate::kernels::fused::swiglu;
use crate::kernels::prim::elementwise::{FAST_MATH, GELU, GELU_BACKWARD};
use crate::kernels::template::{Hole, template};

/// Rows and columns per tile.
pub(crate) const TILE: usize = 64;
/// Consecutive row tiles one block casts (a band of `TILE · ROW_TILES` rows): fewer blocks, so
/// fewer same-address amax atomics and per-block setups, and 4× fewer bias-gradient partials.
pub(crate) const ROW_TILES: usize = 4;
/// Threads of every fp8 kernel.
pub(crate) const THREADS: u32 = 256;

fn cuda_format(format: Fp8Format) -> &'static str {
    match format {
        Fp8Format::E4m3 => "__NV_E4M3",
        Fp8Format::E5m2 => "__NV_E5M2",
    }
}

/// The `raw8` loads of `input`'s elements (`load8.cu`).
fn load8(input: DType) -> String {
    let pair = match input {
        DType::BF16 => Some(("__nv_bfloat162", "__bfloat1622float2")),
        DType::F16 => Some(("__half2", "__half22float2")),
        _ => None,
    };
    let mut holes = vec![
        ("PAIRS", Hole::Flag(pair.is_some())),
        ("T", Hole::Storage(input)),
    ];
    if let Some((pair, to_float2)) = pair {
        holes.push(("PAIR", Hole::code(pair)));
        holes.push(("TO_FLOAT2", Hole::code(to_float2)));
    }
    template!("load8.cu").fill(&holes)
}

/// Block-wide maximum of unsigned values into `*dst` (one atomic per block).
const BLOCK_MAX: &str = include_str!("block_max.cu");

/// The scale of current scaling from an amax: `scaled_max / amax`, 1 for a zero or non-finite
/// amax, f32's maximum on overflow (`ferrotron_ops::fp8::scaling::current_scale`).
const SCALE_FROM_AMAX: &str = include_str!("scale_from_amax.cu");

/// What a cast's `[rows, cols]` values are computed from (`ferrotron_ops::Fp8Source`):
/// `x` itself, an activation of `x`, or an activation's gradient from `x` (the output
/// gradient) and `aux` (the pre-activation). Math in f32, the 16-bit activation kernels' own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CastSource {
    Plain,
    /// GELU (erf form) of `x [rows, cols]`.
    Gelu,
    /// `silu(gate) · up` of the packed `x [rows, 2·cols]`.
    Swiglu,
    /// GELU's input gradient, `x` and `aux` `[rows, cols]`.
    GeluGrad,
    /// SwiGLU's packed gradient `[rows, cols]` from `x [rows, cols/2]`, `aux [rows, cols]`.
    SwigluGrad,
    /// The norm of `x [rows, cols]`, `(x − mean)·rstd·γ (+ β)` from the row statistics
    /// (RMSNorm: no mean) in the norm kernel's arithmetic, rounded to x's dtype as the norm's
    /// output is: the cast of a LayerNormLinear's input without the 16-bit output in between.
    Norm {
        rms: bool,
        beta: bool,
    },
    /// RoPE's backward of the packed QKV projection's gradient `x [rows, cols]` (`cols` whole
    /// groups of `slots` heads of `head_dim`, every slot but the value rotated; rows `[batch,
    /// seq]`, the tables `[seq, head_dim]` in x's dtype): each channel with its partner `d/2`
    /// away, in the RoPE map kernels' arithmetic, rounded to x's dtype as their output is.
    RopeGrad {
        slots: usize,
        head_dim: usize,
    },
    /// The dropped input's gradient of a residual add with hidden dropout from the output's
    /// gradient `x [rows, cols]`: each element's keep bit drawn again from the forward's
    /// (seed, offset) by the dropout kernels' Philox scheme (`kernels/prim/random.rs`), kept elements scaled
    /// by `1 / (1 − p)`, rounded to x's dtype as the dropout kernel's output is.
    DropoutGrad,
}

impl CastSource {
    fn name(self) -> &'static str {
        match self {
            CastSource::Plain => "",
            CastSource::Gelu => " gelu",
            CastSource::Swiglu => " swiglu",
            CastSource::GeluGrad => " gelu grad",
            CastSource::SwigluGrad => " swiglu grad",
            CastSource::Norm { rms: true, .. } => " rmsnorm",
            CastSource::Norm { beta: true, .. } => " layernorm beta",
            CastSource::Norm { .. } => " layernorm",
            CastSource::RopeGrad { .. } => " rope grad",
            CastSource::DropoutGrad => " dropout grad",
        }
    }

    /// The device functions [`CastSource::load`] calls: the 16-bit activation kernels' own
    /// expressions (`kernels/prim/elementwise.rs`, `kernels/fused/swiglu.rs`), so both paths compute one
    /// arithmetic.
    fn helpers(self) -> String {
        let function = |name: &str, args: &str, expr: &str| {
            format!("__device__ __forceinline__ float {name}({args}) {{ return {expr}; }}\n")
        };
        let activation = match self {
            CastSource::Plain | CastSource::Norm { .. } | CastSource::RopeGrad { .. } => {
                return String::new();
            }
            CastSource::DropoutGrad => {
                return format!(
                    "{}{}",
                    crate::kernels::prim::random::PHILOX_HELPERS,
                    crate::kernels::prim::random::PHILOX_WORD
                );
            }
            CastSource::Gelu => function("act", "const float a", GELU),
            CastSource::Swiglu => function("act", "const float a, const float b", swiglu::FORWARD),
            CastSource::GeluGrad => {
                function("act_grad", "const float a, const float b", GELU_BACKWARD)
            }
            CastSource::SwigluGrad => {
                function(
                    "grad_gate",
                    "const float a, const float b, const float c",
                    swiglu::GRAD_GATE,
                ) + &function("grad_up", "const float a, const float b", swiglu::GRAD_UP)
            }
        };
        format!("{FAST_MATH}{activation}")
    }

    /// The `raw8` loads a row's eight values need (`in[0..]`).
    fn inputs(self) -> usize {
        match self {
            CastSource::Plain
            | CastSource::Gelu
            | CastSource::Norm { .. }
            | CastSource::DropoutGrad => 1,
            CastSource::Swiglu | CastSource::GeluGrad | CastSource::RopeGrad { .. } => 2,
            CastSource::SwigluGrad => 3,
        }
    }

    /// Code that loads `in[..]` for row `r`, columns `c..c + 8`.
    fn fetch(self) -> String {
        if let CastSource::RopeGrad { slots, head_dim } = self {
            let width = slots * head_dim;
            let half = head_dim / 2;
            return format!(
                "      in[0] = load_raw(x + r * p.cols + c);\n      {{ const long long cc = c % {width}, j = cc % {head_dim};\n        if (cc / {head_dim} < {slots} - 1) in[1] = load_raw(x + r * p.cols + (j < {half} ? c + {half} : c - {half})); }}\n"
            );
        }
        let code = match self {
            CastSource::Plain
            | CastSource::Gelu
            | CastSource::Norm { .. }
            | CastSource::DropoutGrad => "      in[0] = load_raw(x + r * p.cols + c);\n",
            CastSource::Swiglu => {
                "      in[0] = load_raw(x + r * 2 * p.cols + c);\n      in[1] = load_raw(x + r * 2 * p.cols + p.cols + c);\n"
            }
            CastSource::GeluGrad => {
                "      in[0] = load_raw(x + r * p.cols + c);\n      in[1] = load_raw(aux + r * p.cols + c);\n"
            }
            CastSource::SwigluGrad => concat!(
                "      const long long f = p.cols >> 1;\n",
                "      if (c < f) {\n",
                "        in[0] = load_raw(aux + r * p.cols + c); in[1] = load_raw(aux + r * p.cols + f + c); in[2] = load_raw(x + r * f + c);\n",
                "      } else {\n",
                "        in[0] = load_raw(aux + r * p.cols + (c - f)); in[2] = load_raw(x + r * f + (c - f));\n",
                "      }\n"
            ),
            CastSource::RopeGrad { .. } => unreachable!("returned above"),
        };
        code.to_string()
    }

    /// Code that fills `float v[8]` from the loaded `in[..]` (`input`: x's dtype).
    fn compute(self, input: DType) -> String {
        if self == CastSource::DropoutGrad {
            let kept = input.load_expr(&input.store_expr("(keep ? a * (float)p.keep_scale : 0.f)"));
            let keep = crate::kernels::prim::random::keep_test(
                "(long long)p.seed",
                "(long long)p.offset",
                "i",
                "p.keep_prob",
            );
            return format!(
                "      unpack8(in[0], v);\n      {{ const long long i0 = r * p.cols + c;\n#pragma unroll\n        for (int e = 0; e < 8; ++e) {{\n          const long long i = i0 + e;\n          const float a = v[e];\n          const bool keep = {keep};\n          v[e] = {kept};\n        }} }}\n"
            );
        }
        if let CastSource::RopeGrad { slots, head_dim } = self {
            let width = slots * head_dim;
            let half = head_dim / 2;
            let round = |expr: &str| input.load_expr(&input.store_expr(expr));
            return format!(
                "      unpack8(in[0], v);\n      {{ const long long cc = c % {width}, j = cc % {head_dim};\n        if (cc / {head_dim} < {slots} - 1) {{\n          const long long pj = j < {half} ? j + {half} : j - {half}, pos = r % (long long)p.seq;\n          float pb[8], pc[8], pd[8];\n          unpack8(in[1], pb); load8(cosines + pos * {head_dim} + j, pc); load8(sines + pos * {head_dim} + pj, pd);\n          if (j < {half}) {{\n#pragma unroll\n            for (int e = 0; e < 8; ++e) {{ const float a = v[e], b = pb[e], c = pc[e], d = pd[e]; v[e] = {}; }}\n          }} else {{\n#pragma unroll\n            for (int e = 0; e < 8; ++e) {{ const float a = v[e], b = pb[e], c = pc[e], d = pd[e]; v[e] = {}; }}\n          }}\n        }} }}\n",
                round("(a * c + b * d)"),
                round("(a * c - b * d)")
            );
        }
        let code = match self {
            CastSource::Norm { rms, beta } => {
                let mean = if rms {
                    "0.f"
                } else {
                    "((const float*)p.mean)[r]"
                };
                let (load_beta, add_beta) = if beta {
                    ("        float b[8]; load8(beta + c, b);\n", " y += b[j];")
                } else {
                    ("", "")
                };
                let round = input.load_expr(&input.store_expr("y"));
                return format!(
                    "      unpack8(in[0], v);\n      {{ const float mean = {mean};\n        const float rstd = ((const float*)p.rstd)[r];\n        float g[8]; load8(gamma + c, g);\n{load_beta}#pragma unroll\n        for (int j = 0; j < 8; ++j) {{ float y = (v[j] - mean) * rstd * g[j];{add_beta} v[j] = {round}; }} }}\n"
                );
            }
            CastSource::Plain => "      unpack8(in[0], v);\n",
            CastSource::Gelu => {
                "      unpack8(in[0], v);\n#pragma unroll\n      for (int j = 0; j < 8; ++j) v[j] = act(v[j]);\n"
            }
            CastSource::Swiglu => {
                "      { float u[8];\n        unpack8(in[0], v); unpack8(in[1], u);\n#pragma unroll\n        for (int j = 0; j < 8; ++j) v[j] = act(v[j], u[j]); }\n"
            }
            CastSource::GeluGrad => {
                "      { float a[8];\n        unpack8(in[0], v); unpack8(in[1], a);\n#pragma unroll\n        for (int j = 0; j < 8; ++j) v[j] = act_grad(a[j], v[j]); }\n"
            }
            CastSource::SwigluGrad => concat!(
                "      { float a[8], g[8];\n        unpack8(in[0], a); unpack8(in[2], g);\n",
                "        if (c < (p.cols >> 1)) {\n          float b[8];\n          unpack8(in[1], b);\n",
                "#pragma unroll\n          for (int j = 0; j < 8; ++j) v[j] = grad_gate(a[j], b[j], g[j]);\n",
                "        } else {\n",
                "#pragma unroll\n          for (int j = 0; j < 8; ++j) v[j] = grad_up(a[j], g[j]);\n",
                "        } }\n"
            ),
            CastSource::RopeGrad { .. } | CastSource::DropoutGrad => {
                unreachable!("returned above")
            }
        };
        code.to_string()
    }
}

/// Cast a `[rows, cols]` tensor to fp8 (and its transpose), recording the amax.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CastTranspose {
    pub input: DType,
    pub format: Fp8Format,
    /// Write `[cols, rows]` too.
    pub transpose: bool,
    /// The scale comes from the amax at `amax_src` (current scaling), not from `scale`.
    pub current: bool,
    pub source: CastSource,
    /// Write each band's column sums of the (unscaled) values to `partial [bands, cols]` f32,
    /// which [`ColumnSum`] adds up: a bias gradient in the pass that casts `dy`.
    pub dbias: bool,
}

impl KernelSpec for CastTranspose {
    fn source(&self) -> String {
        let (x, f) = (self.input, self.format);
        let extra = match self.source {
            CastSource::Norm { .. } => ", mean, rstd, gamma, beta",
            CastSource::RopeGrad { .. } => ", cos, sin, seq",
            CastSource::DropoutGrad => ", seed, offset; double keep_prob, keep_scale",
            _ => "",
        };
        let fetch = self.source.fetch();
        let compute = self.source.compute(x);
        template!("cast_transpose.cu").fill(&[
            (
                "TRANSPOSE_NOTE",
                Hole::code(if self.transpose { " transpose" } else { "" }),
            ),
            ("X_NAME", Hole::Name(x)),
            ("FORMAT_NAME", Hole::code(f.name())),
            (
                "SCALING",
                Hole::code(if self.current { "current" } else { "delayed" }),
            ),
            ("SOURCE_NOTE", Hole::code(self.source.name())),
            (
                "DBIAS_NOTE",
                Hole::code(if self.dbias { " dbias" } else { "" }),
            ),
            ("HALF", Hole::Flag(x.needs_half_headers())),
            ("LOAD8", Hole::code(load8(x))),
            ("HELPERS", Hole::code(self.source.helpers())),
            ("BLOCK_MAX", Hole::code(BLOCK_MAX)),
            ("SCALE_FROM_AMAX", Hole::code(SCALE_FROM_AMAX)),
            ("EXTRA_PARAMS", Hole::code(extra)),
            ("TILE", Hole::Int(TILE as i64)),
            ("ROW_TILES", Hole::Int(ROW_TILES as i64)),
            ("CURRENT", Hole::Flag(self.current)),
            ("X", Hole::Storage(x)),
            (
                "NORM",
                Hole::Flag(matches!(self.source, CastSource::Norm { .. })),
            ),
            (
                "ROPE",
                Hole::Flag(matches!(self.source, CastSource::RopeGrad { .. })),
            ),
            ("DBIAS", Hole::Flag(self.dbias)),
            ("INPUTS", Hole::Int(self.source.inputs() as i64)),
            // the fragments' last line ends where the template's line does
            (
                "FETCH",
                Hole::code(fetch.strip_suffix('\n').unwrap_or(&fetch)),
            ),
            (
                "COMPUTE",
                Hole::code(compute.strip_suffix('\n').unwrap_or(&compute)),
            ),
            ("FORMAT", Hole::code(cuda_format(f))),
            ("TRANSPOSE", Hole::Flag(self.transpose)),
        ])
    }
}

/// `max |x|` of a contiguous tensor (8-element chunks) into `*amax_dst` (zeroed before).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Amax {
    pub input: DType,
}

impl KernelSpec for Amax {
    fn source(&self) -> String {
        let x = self.input;
        template!("amax.cu").fill(&[
            ("X_NAME", Hole::Name(x)),
            ("HALF", Hole::Flag(x.needs_half_headers())),
            ("LOAD8", Hole::code(load8(x))),
            ("BLOCK_MAX", Hole::code(BLOCK_MAX)),
            ("X", Hole::Storage(x)),
        ])
    }
}

/// The delayed-scaling update of `blocks` role blocks (`ferrotron_ops::fp8::scaling::
/// update_block`), one thread each: the amax rolled into the history, the scale from its newest
/// (`max_algo` 0) or largest entry, its inverse, the amax cleared.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ScaleUpdate;

impl KernelSpec for ScaleUpdate {
    fn source(&self) -> String {
        template!("scale_update.cu").fill(&[("SCALE_FROM_AMAX", Hole::code(SCALE_FROM_AMAX))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCES: [CastSource; 5] = [
        CastSource::Plain,
        CastSource::Gelu,
        CastSource::Swiglu,
        CastSource::GeluGrad,
        CastSource::SwigluGrad,
    ];

    fn specs() -> Vec<(String, String)> {
        let mut all = Vec::new();
        for input in [DType::BF16, DType::F32, DType::F16] {
            for format in [Fp8Format::E4m3, Fp8Format::E5m2] {
                for (transpose, current) in [(true, false), (true, true), (false, false)] {
                    let spec = CastTranspose {
                        input,
                        format,
                        transpose,
                        current,
                        source: CastSource::Plain,
                        dbias: false,
                    };
                    all.push((format!("{spec:?}"), spec.source()));
                }
                for source in SOURCES {
                    let spec = CastTranspose {
                        input,
                        format,
                        transpose: true,
                        current: false,
                        source,
                        dbias: true,
                    };
                    all.push((format!("{spec:?}"), spec.source()));
                }
            }
            let spec = CastTranspose {
                input,
                format: Fp8Format::E5m2,
                transpose: true,
                current: false,
                source: CastSource::DropoutGrad,
                dbias: true,
            };
            all.push((format!("{spec:?}"), spec.source()));
            for (slots, head_dim) in [(6, 64), (3, 128)] {
                let spec = CastTranspose {
                    input,
                    format: Fp8Format::E5m2,
                    transpose: true,
                    current: false,
                    source: CastSource::RopeGrad { slots, head_dim },
                    dbias: true,
                };
                all.push((format!("{spec:?}"), spec.source()));
            }
            for (rms, beta) in [(false, true), (false, false), (true, false)] {
                let spec = CastTranspose {
                    input,
                    format: Fp8Format::E4m3,
                    transpose: true,
                    current: false,
                    source: CastSource::Norm { rms, beta },
                    dbias: false,
                };
                all.push((format!("{spec:?}"), spec.source()));
            }
            all.push((format!("amax {input}"), Amax { input }.source()));
        }
        all.push(("update".into(), ScaleUpdate.source()));
        all
    }

    #[test]
    fn fp8_sources_are_unchanged() {
        let mut sources: Vec<String> = specs().into_iter().map(|(_, s)| s).collect();
        // every flag with every source, on bf16
        let all_sources = SOURCES.into_iter().chain([
            CastSource::DropoutGrad,
            CastSource::RopeGrad {
                slots: 3,
                head_dim: 128,
            },
            CastSource::Norm {
                rms: true,
                beta: false,
            },
            CastSource::Norm {
                rms: false,
                beta: true,
            },
        ]);
        for source in all_sources {
            for bits in 0..8u32 {
                let spec = CastTranspose {
                    input: DType::BF16,
                    format: Fp8Format::E4m3,
                    transpose: bits & 1 == 1,
                    current: bits & 2 == 2,
                    source,
                    dbias: bits & 4 == 4,
                };
                sources.push(spec.source());
            }
        }
        insta::assert_snapshot!(crate::kernels::digests(&sources));
    }

    #[test]
    fn cast_transpose_source() {
        let spec = CastTranspose {
            input: DType::BF16,
            format: Fp8Format::E4m3,
            transpose: true,
            current: false,
            source: CastSource::Plain,
            dbias: false,
        };
        insta::assert_snapshot!(spec.source());
    }

    #[test]
    fn current_scaling_cast_and_amax_sources() {
        let spec = CastTranspose {
            input: DType::F32,
            format: Fp8Format::E5m2,
            transpose: true,
            current: true,
            source: CastSource::Plain,
            dbias: false,
        };
        insta::assert_snapshot!(spec.source());
        insta::assert_snapshot!(Amax { input: DType::BF16 }.source());
    }

    #[test]
    fn scale_update_source() {
        insta::assert_snapshot!(ScaleUpdate.source());
    }

    #[test]
    fn kernels_are_named_after_what_they_cast() {
        let name = |spec: &CastTranspose| crate::engine::kernel_cache::kernel_name(&spec.source());
        let spec = CastTranspose {
            input: DType::BF16,
            format: Fp8Format::E5m2,
            transpose: true,
            current: false,
            source: CastSource::Plain,
            dbias: false,
        };
        assert_eq!(name(&spec), "fp8_cast_transpose_bf16_e5m2_delayed");
        let fused = CastTranspose {
            source: CastSource::SwigluGrad,
            dbias: true,
            ..spec
        };
        assert_eq!(
            name(&fused),
            "fp8_cast_transpose_bf16_e5m2_delayed_swiglu_grad_dbias"
        );
        assert_eq!(
            crate::engine::kernel_cache::kernel_name(&ScaleUpdate.source()),
            "fp8_scale_update"
        );
    }

    /// Every fp8 kernel compiles for sm_90 (NVRTC, no GPU needed).
    #[test]
    #[ignore = "needs NVRTC and the CUDA headers: tools/test.sh installs them and runs it"]
    fn fp8_sources_compile() {
        for (what, source) in specs() {
            crate::engine::kernel_cache::compile_for_test(&source, "sm_90")
                .unwrap_or_else(|e| panic!("{what}: {e}\n{source}"));
        }
    }
}
