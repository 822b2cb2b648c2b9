//! AdamW on host buffers: the offloaded optimizer's update (Megatron's
//! `--optimizer-cpu-offload`) of any slice of a flat state, on all cores.
//!
//! The offload streams an 8B model's state through host memory every step, so the update is
//! bound by memory traffic: each element is read once and written once, in one loop the
//! compiler vectorises (16-bit operands widened and narrowed inside it without branches, see
//! `bf16_bits`; a missing gradient factor or decay is a factor of exactly 1, which changes no
//! bit of what follows), and a slice is cut into [`CHUNK`]s updated in parallel. Taking
//! slices rather than tensors lets the caller update a piece of the state as soon as its
//! gradient has arrived and write the new 16-bit weights straight into the buffer it uploads.
//!
//! The arithmetic is the composed update's operation for operation (`crate::composed_adamw`),
//! every scalar rounded to f32 first as burn-flex rounds a scalar operand, so the results are
//! its bits whatever the slicing and the thread count; burn-flex's `adamw_step` runs here too.

use burn::tensor::{bf16, f16};

use super::bf16_bits::{bf16_from_f32, bf16_to_f32};
use crate::op::adamw::AdamWStep;
use crate::op::host_pass::HostValues;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// A moment updated in place, in the dtype it is stored in (Megatron's `--exp-avg-dtype`,
/// `--exp-avg-sq-dtype`).
#[derive(Debug)]
pub enum HostMoment<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
}

/// Where the 16-bit copy of the new value goes (the model's weights after the step).
#[derive(Debug)]
pub enum HostRounded<'a> {
    Bf16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

/// Where the update reads a buffer's old values when not from the buffer itself (each of the
/// same length and dtype as the buffer it stands for): a checkpoint's snapshot that shares the
/// state makes the update out of place.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostOldValues<'a> {
    pub master: Option<&'a [f32]>,
    pub exp_avg: Option<HostValues<'a>>,
    pub exp_avg_sq: Option<HostValues<'a>>,
}

/// One step's AdamW update of host buffers, with the scalars rounded to f32.
#[derive(Debug, Clone, Copy)]
pub struct HostAdamW {
    grad_scale: f32,
    device_scale: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: f32,
    bias_correction1: f32,
    bias_correction2: f32,
    eps: f32,
    lr: f32,
    first: bool,
}

impl HostAdamW {
    /// The update `step` describes, times `device_scale` (the clipping coefficient read back
    /// from the device) when given; on the `first` step the moments start from zero and their
    /// buffers are only written. The buffers' own dtypes rule, not `step`'s `rounded` and
    /// `moment_dtypes`.
    pub fn new(step: &AdamWStep, device_scale: Option<f32>, first: bool) -> Self {
        Self {
            grad_scale: if step.grad_scale == 1.0 {
                1.0
            } else {
                step.grad_scale as f32
            },
            device_scale: device_scale.unwrap_or(1.0),
            beta1: step.beta1 as f32,
            one_minus_beta1: (1.0 - step.beta1) as f32,
            beta2: step.beta2 as f32,
            one_minus_beta2: (1.0 - step.beta2) as f32,
            decay: step.decay.map_or(1.0, |d| d as f32),
            bias_correction1: step.bias_correction1 as f32,
            bias_correction2: step.bias_correction2 as f32,
            eps: step.eps as f32,
            lr: step.lr as f32,
            first,
        }
    }

    /// Update `master` (f32) and the moments in place from `grad`, reading the old values from
    /// `old` where it names a buffer, and write the new value rounded to `rounded`'s dtype when
    /// given; chunks of 16K elements in parallel on the current rayon pool.
    ///
    /// # Panics
    /// When the buffers differ in length, or an old moment in dtype from its buffer.
    pub fn update(
        &self,
        master: &mut [f32],
        exp_avg: HostMoment<'_>,
        exp_avg_sq: HostMoment<'_>,
        grad: HostValues<'_>,
        old: HostOldValues<'_>,
        rounded: Option<HostRounded<'_>>,
    ) {
        let piece = Piece {
            master,
            exp_avg,
            exp_avg_sq,
            grad,
            old,
            rounded,
        };
        piece.check();
        self.run(piece);
    }

    /// Halve `piece` at a chunk boundary until a chunk is left, the halves in parallel.
    fn run(&self, piece: Piece<'_>) {
        let len = piece.master.len();
        if len <= CHUNK {
            self.chunk(piece);
        } else {
            let (left, right) = piece.split_at(len.div_ceil(CHUNK) / 2 * CHUNK);
            rayon::join(|| self.run(left), || self.run(right));
        }
    }

    /// One task: old values copied in, an f16 gradient widened, the fused loop for the
    /// operands' dtypes, an f16 copy narrowed after it (through f64, as burn-flex casts).
    fn chunk(&self, piece: Piece<'_>) {
        let Piece {
            master,
            mut exp_avg,
            mut exp_avg_sq,
            grad,
            old,
            rounded,
        } = piece;
        if let Some(old) = old.master {
            master.copy_from_slice(old);
        }
        if !self.first {
            exp_avg.copy_from(old.exp_avg);
            exp_avg_sq.copy_from(old.exp_avg_sq);
        }
        let (bf16_copy, f16_copy) = match rounded {
            Some(HostRounded::Bf16(r)) => (Some(r), None),
            Some(HostRounded::F16(r)) => (None, Some(r)),
            None => (None, None),
        };
        let moments = (exp_avg, exp_avg_sq);
        match grad {
            HostValues::F32(g) => self.with_moments(master, moments, g, bf16_copy),
            HostValues::Bf16(g) => self.with_moments(master, moments, g, bf16_copy),
            HostValues::F16(g) => {
                let g: Vec<f32> = g.iter().map(|x| x.to_f32()).collect();
                self.with_moments(master, moments, &g, bf16_copy)
            }
        }
        if let Some(r) = f16_copy {
            for (r, &x) in r.iter_mut().zip(master.iter()) {
                *r = f16::from_f64(f64::from(x));
            }
        }
    }

    fn with_moments<G: Operand>(
        &self,
        p: &mut [f32],
        moments: (HostMoment<'_>, HostMoment<'_>),
        g: &[G],
        r: Option<&mut [bf16]>,
    ) {
        use HostMoment::{Bf16, F32};
        match moments {
            (F32(m), F32(v)) => self.with_first(p, m, v, g, r),
            (F32(m), Bf16(v)) => self.with_first(p, m, v, g, r),
            (Bf16(m), F32(v)) => self.with_first(p, m, v, g, r),
            (Bf16(m), Bf16(v)) => self.with_first(p, m, v, g, r),
        }
    }

    fn with_first<G: Operand, M: Stored, V: Stored>(
        &self,
        p: &mut [f32],
        m: &mut [M],
        v: &mut [V],
        g: &[G],
        r: Option<&mut [bf16]>,
    ) {
        match (self.first, r) {
            (true, Some(r)) => self.elements::<true, true, _, _, _>(p, m, v, g, r),
            (true, None) => self.elements::<true, false, _, _, _>(p, m, v, g, &mut []),
            (false, Some(r)) => self.elements::<false, true, _, _, _>(p, m, v, g, r),
            (false, None) => self.elements::<false, false, _, _, _>(p, m, v, g, &mut []),
        }
    }

    /// [`Self::elements_with`] compiled for the widest vectors the CPU has: the same IEEE
    /// operations, each correctly rounded whatever the width (Rust never fuses a multiply and
    /// an add), so the same bits.
    fn elements<const FIRST: bool, const ROUND: bool, G: Operand, M: Stored, V: Stored>(
        &self,
        p: &mut [f32],
        m: &mut [M],
        v: &mut [V],
        g: &[G],
        r: &mut [bf16],
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512bw") {
                // SAFETY: the CPU has AVX-512 F and BW (BW implies F), checked just above.
                #[allow(unsafe_code)]
                return unsafe { self.elements_avx512::<FIRST, ROUND, _, _, _>(p, m, v, g, r) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, checked just above.
                #[allow(unsafe_code)]
                return unsafe { self.elements_avx2::<FIRST, ROUND, _, _, _>(p, m, v, g, r) };
            }
        }
        self.elements_with::<FIRST, ROUND, _, _, _>(p, m, v, g, r)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn elements_avx512<const FIRST: bool, const ROUND: bool, G: Operand, M: Stored, V: Stored>(
        &self,
        p: &mut [f32],
        m: &mut [M],
        v: &mut [V],
        g: &[G],
        r: &mut [bf16],
    ) {
        self.elements_with::<FIRST, ROUND, _, _, _>(p, m, v, g, r)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn elements_avx2<const FIRST: bool, const ROUND: bool, G: Operand, M: Stored, V: Stored>(
        &self,
        p: &mut [f32],
        m: &mut [M],
        v: &mut [V],
        g: &[G],
        r: &mut [bf16],
    ) {
        self.elements_with::<FIRST, ROUND, _, _, _>(p, m, v, g, r)
    }

    /// The composed update's arithmetic on each element, the bf16 copy written when `ROUND`;
    /// the moments start from zero when `FIRST` (`0·β₁ + x` is not `x` for `x = −0`).
    #[inline(always)]
    fn elements_with<const FIRST: bool, const ROUND: bool, G: Operand, M: Stored, V: Stored>(
        &self,
        p: &mut [f32],
        m: &mut [M],
        v: &mut [V],
        g: &[G],
        r: &mut [bf16],
    ) {
        let n = p.len();
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        let r = &mut r[..if ROUND { n } else { 0 }];
        for i in 0..n {
            let g = g[i].widen() * self.grad_scale * self.device_scale;
            let (m_new, v_new) = if FIRST {
                (g * self.one_minus_beta1, (g * g) * self.one_minus_beta2)
            } else {
                (
                    m[i].widen() * self.beta1 + g * self.one_minus_beta1,
                    v[i].widen() * self.beta2 + (g * g) * self.one_minus_beta2,
                )
            };
            m[i] = M::narrow(m_new);
            v[i] = V::narrow(v_new);
            let m_hat = m_new / self.bias_correction1;
            let v_hat = v_new / self.bias_correction2;
            let p_new = p[i] * self.decay - (m_hat / (v_hat.sqrt() + self.eps)) * self.lr;
            p[i] = p_new;
            if ROUND {
                r[i] = bf16_from_f32(p_new);
            }
        }
    }
}

/// An element the loop reads, widened to f32 as burn-flex casts it.
trait Operand: Copy {
    fn widen(self) -> f32;
}

/// An element the loop also writes back, narrowed as burn-flex casts it.
trait Stored: Operand {
    fn narrow(x: f32) -> Self;
}

impl Operand for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Stored for f32 {
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        x
    }
}

impl Operand for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self)
    }
}

impl Stored for bf16 {
    #[inline(always)]
    fn narrow(x: f32) -> Self {
        bf16_from_f32(x)
    }
}

/// The buffers of one update, or of a part of it.
struct Piece<'a> {
    master: &'a mut [f32],
    exp_avg: HostMoment<'a>,
    exp_avg_sq: HostMoment<'a>,
    grad: HostValues<'a>,
    old: HostOldValues<'a>,
    rounded: Option<HostRounded<'a>>,
}

impl Piece<'_> {
    fn check(&self) {
        let len = self.master.len();
        let lens = [
            ("exp_avg", Some(self.exp_avg.len())),
            ("exp_avg_sq", Some(self.exp_avg_sq.len())),
            ("gradient", Some(self.grad.len())),
            ("old master", self.old.master.map(<[f32]>::len)),
            (
                "old exp_avg",
                self.old.exp_avg.as_ref().map(HostValues::len),
            ),
            (
                "old exp_avg_sq",
                self.old.exp_avg_sq.as_ref().map(HostValues::len),
            ),
            ("rounded copy", self.rounded.as_ref().map(HostRounded::len)),
        ];
        for (name, other) in lens {
            assert!(
                other.is_none_or(|other| other == len),
                "AdamW: the {name} has {other:?} elements, the master {len}"
            );
        }
        for (moment, old) in [
            (&self.exp_avg, self.old.exp_avg),
            (&self.exp_avg_sq, self.old.exp_avg_sq),
        ] {
            assert!(
                old.is_none_or(|old| moment.same_dtype(&old)),
                "AdamW: a moment is updated from old values of another dtype"
            );
        }
    }

    fn split_at(self, mid: usize) -> (Self, Self) {
        let (master, master_right) = self.master.split_at_mut(mid);
        let (exp_avg, exp_avg_right) = self.exp_avg.split_at(mid);
        let (exp_avg_sq, exp_avg_sq_right) = self.exp_avg_sq.split_at(mid);
        let (grad, grad_right) = self.grad.split_at(mid);
        let (old, old_right) = self.old.split_at(mid);
        let (rounded, rounded_right) = match self.rounded.map(|r| r.split_at(mid)) {
            Some((left, right)) => (Some(left), Some(right)),
            None => (None, None),
        };
        (
            Piece {
                master,
                exp_avg,
                exp_avg_sq,
                grad,
                old,
                rounded,
            },
            Piece {
                master: master_right,
                exp_avg: exp_avg_right,
                exp_avg_sq: exp_avg_sq_right,
                grad: grad_right,
                old: old_right,
                rounded: rounded_right,
            },
        )
    }
}

impl<'a> HostValues<'a> {
    pub fn len(&self) -> usize {
        match self {
            HostValues::F32(x) => x.len(),
            HostValues::Bf16(x) => x.len(),
            HostValues::F16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn split_at(self, mid: usize) -> (Self, Self) {
        match self {
            HostValues::F32(x) => {
                let (a, b) = x.split_at(mid);
                (HostValues::F32(a), HostValues::F32(b))
            }
            HostValues::Bf16(x) => {
                let (a, b) = x.split_at(mid);
                (HostValues::Bf16(a), HostValues::Bf16(b))
            }
            HostValues::F16(x) => {
                let (a, b) = x.split_at(mid);
                (HostValues::F16(a), HostValues::F16(b))
            }
        }
    }
}

impl<'a> HostOldValues<'a> {
    fn split_at(self, mid: usize) -> (Self, Self) {
        let split = |x: Option<HostValues<'a>>| match x.map(|x| x.split_at(mid)) {
            Some((a, b)) => (Some(a), Some(b)),
            None => (None, None),
        };
        let (master, master_right) = match self.master.map(|x| x.split_at(mid)) {
            Some((a, b)) => (Some(a), Some(b)),
            None => (None, None),
        };
        let (exp_avg, exp_avg_right) = split(self.exp_avg);
        let (exp_avg_sq, exp_avg_sq_right) = split(self.exp_avg_sq);
        (
            HostOldValues {
                master,
                exp_avg,
                exp_avg_sq,
            },
            HostOldValues {
                master: master_right,
                exp_avg: exp_avg_right,
                exp_avg_sq: exp_avg_sq_right,
            },
        )
    }
}

impl<'a> HostMoment<'a> {
    fn len(&self) -> usize {
        match self {
            HostMoment::F32(x) => x.len(),
            HostMoment::Bf16(x) => x.len(),
        }
    }

    fn same_dtype(&self, other: &HostValues<'_>) -> bool {
        matches!(
            (self, other),
            (HostMoment::F32(_), HostValues::F32(_)) | (HostMoment::Bf16(_), HostValues::Bf16(_))
        )
    }

    /// Copy `old`'s values in, when given (of the moment's dtype, see [`Piece::check`]).
    fn copy_from(&mut self, old: Option<HostValues<'_>>) {
        match (self, old) {
            (HostMoment::F32(to), Some(HostValues::F32(from))) => to.copy_from_slice(from),
            (HostMoment::Bf16(to), Some(HostValues::Bf16(from))) => to.copy_from_slice(from),
            (_, None) => {}
            _ => unreachable!("checked: a moment is updated from old values of its own dtype"),
        }
    }

    fn split_at(self, mid: usize) -> (Self, Self) {
        match self {
            HostMoment::F32(x) => {
                let (a, b) = x.split_at_mut(mid);
                (HostMoment::F32(a), HostMoment::F32(b))
            }
            HostMoment::Bf16(x) => {
                let (a, b) = x.split_at_mut(mid);
                (HostMoment::Bf16(a), HostMoment::Bf16(b))
            }
        }
    }
}

impl<'a> HostRounded<'a> {
    fn len(&self) -> usize {
        match self {
            HostRounded::Bf16(x) => x.len(),
            HostRounded::F16(x) => x.len(),
        }
    }

    fn split_at(self, mid: usize) -> (Self, Self) {
        match self {
            HostRounded::Bf16(x) => {
                let (a, b) = x.split_at_mut(mid);
                (HostRounded::Bf16(a), HostRounded::Bf16(b))
            }
            HostRounded::F16(x) => {
                let (a, b) = x.split_at_mut(mid);
                (HostRounded::F16(a), HostRounded::F16(b))
            }
        }
    }
}
