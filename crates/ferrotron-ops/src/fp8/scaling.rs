//! fp8 per-tensor scaling as plain host arithmetic: the formats' grids, the scale a tensor is
//! cast with, and the once-per-step update of the delayed-scaling state. This is the
//! specification every backend meets: the CPU reference of the fp8 linear uses it directly, and
//! the CUDA kernels (`ferrotron-cuda`'s `fp8` module) are checked against it on a GPU.
//!
//! Why per-tensor scales at all: e4m3 spans 2⁻⁹ … 448 and e5m2 2⁻¹⁶ … 57344, far narrower than
//! bf16, so a tensor is multiplied by a scale before the cast that maps its largest magnitude
//! (amax) near the format's maximum, and the GEMM multiplies its result by the inverse scales.
//! *Delayed* scaling (Transformer Engine's `DelayedScaling`, Megatron's default) takes the scale
//! from the amaxes of earlier steps, so the cast needs no pass over the tensor first; *current*
//! scaling (`tensorwise`) measures the tensor's own amax right before casting it.
//!
//! The state of one linear layer is a row of `3 × (3 + history)` f32 numbers: for each of its
//! three cast tensors (input, weight, output gradient, [`Fp8Role`]) a block
//! `[scale, scale_inv, amax, history…]`, where `amax` is the running maximum of the current
//! step (every microbatch's casts max into it) and the history holds the amaxes of the last
//! steps, newest first. The update rolls `amax` into the history, computes the scale from the
//! history's newest or largest entry and clears `amax`. A scale is kept as it was when that
//! amax is zero (nothing seen) or not finite (an overflow upstream: the step will be refused by
//! the finiteness guard, and the scale must not follow it), and a scale that overflows f32
//! (a tiny amax) becomes f32's maximum, as Transformer Engine does.

/// An 8-bit float format (the OCP FP8 formats Hopper's tensor cores take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits, no infinities: ±448, finer steps.
    E4m3,
    /// 5 exponent bits, 2 mantissa bits: ±57344, the range gradients need.
    E5m2,
}

impl Fp8Format {
    /// The largest finite value.
    pub fn max(self) -> f32 {
        match self {
            Fp8Format::E4m3 => 448.0,
            Fp8Format::E5m2 => 57344.0,
        }
    }

    /// Mantissa bits.
    fn mantissa_bits(self) -> i32 {
        match self {
            Fp8Format::E4m3 => 3,
            Fp8Format::E5m2 => 2,
        }
    }

    /// Exponent of the smallest normal value (subnormals share its step).
    fn min_exponent(self) -> i32 {
        match self {
            Fp8Format::E4m3 => -6,
            Fp8Format::E5m2 => -14,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3 => "e4m3",
            Fp8Format::E5m2 => "e5m2",
        }
    }
}

/// The three tensors a linear layer casts, in the order of its state row's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Role {
    Input = 0,
    Weight = 1,
    GradOutput = 2,
}

impl Fp8Role {
    pub const ALL: [Fp8Role; 3] = [Fp8Role::Input, Fp8Role::Weight, Fp8Role::GradOutput];
}

/// Which amax of the history a delayed scale is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AmaxAlgo {
    MostRecent,
    Max,
}

/// How scales are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Scaling {
    /// From the amax history of earlier steps (updated once per optimizer step).
    Delayed { history: usize, algo: AmaxAlgo },
    /// From each tensor's own amax, measured just before the cast.
    Current,
}

/// An fp8 recipe: the formats of the forward and backward casts, the scaling, the margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fp8Settings {
    /// Inputs and weights.
    pub forward: Fp8Format,
    /// Output gradients.
    pub backward: Fp8Format,
    pub scaling: Fp8Scaling,
    /// Scales aim at `max / 2^margin`.
    pub margin: u32,
}

/// Offsets inside one role's block of a state row.
pub const SCALE: usize = 0;
pub const SCALE_INV: usize = 1;
pub const AMAX: usize = 2;
pub const HISTORY: usize = 3;

impl Fp8Settings {
    pub fn format(&self, role: Fp8Role) -> Fp8Format {
        match role {
            Fp8Role::GradOutput => self.backward,
            Fp8Role::Input | Fp8Role::Weight => self.forward,
        }
    }

    /// Entries of the amax history (one for current scaling, which keeps none).
    pub fn history(&self) -> usize {
        match self.scaling {
            Fp8Scaling::Delayed { history, .. } => history.max(1),
            Fp8Scaling::Current => 1,
        }
    }

    /// Floats per role block.
    pub fn block_width(&self) -> usize {
        HISTORY + self.history()
    }

    /// Floats per layer (state row).
    pub fn row_width(&self) -> usize {
        Fp8Role::ALL.len() * self.block_width()
    }

    /// Where `role`'s block starts in a row.
    pub fn block_offset(&self, role: Fp8Role) -> usize {
        role as usize * self.block_width()
    }

    /// `max / 2^margin` for `role`'s format: what an amax is scaled to.
    pub fn scaled_max(&self, role: Fp8Role) -> f32 {
        scaled_max(self.format(role), self.margin)
    }

    /// The state of `slots` layers before any step: every scale 1, no amax seen.
    pub fn initial_state(&self, slots: usize) -> Vec<f32> {
        let mut row = vec![0.0; self.row_width()];
        for role in Fp8Role::ALL {
            let at = self.block_offset(role);
            row[at + SCALE] = 1.0;
            row[at + SCALE_INV] = 1.0;
        }
        row.repeat(slots)
    }
}

/// `format.max() / 2^margin`, the target of a scaled amax.
pub fn scaled_max(format: Fp8Format, margin: u32) -> f32 {
    format.max() * (-(margin as f32)).exp2()
}

/// `x` rounded to the nearest value of `format` (ties to even), saturating at ±max (infinities
/// too), NaN kept: what `cvt.rn.satfinite` does on the GPU.
pub fn round_to_fp8(x: f32, format: Fp8Format) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = f64::from(x.abs());
    if a == 0.0 {
        return x;
    }
    let max = f64::from(format.max());
    if a >= max {
        return format.max().copysign(x);
    }
    // The exponent of `a` (all f32 values are normal f64s), clamped to the subnormal range.
    let exponent = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(format.min_exponent());
    let step = f64::from(exponent - format.mantissa_bits()).exp2();
    let rounded = ((a / step).round_ties_even() * step).min(max);
    (rounded as f32).copysign(x)
}

/// The larger of two amaxes, NaN winning (as the GPU's integer max on the float bits does).
pub fn amax_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// `max |x|` over `values`, NaN winning.
pub fn amax(values: &[f32]) -> f32 {
    values.iter().fold(0.0, |m, v| amax_max(m, v.abs()))
}

/// A delayed scale from `amax`: `scaled_max / amax`, the `old` scale where `amax` is zero or
/// not finite, f32's maximum where the quotient overflows.
pub fn delayed_scale(amax: f32, old: f32, scaled_max: f32) -> f32 {
    if !(amax.is_finite() && amax > 0.0) {
        return old;
    }
    finite_scale(scaled_max / amax)
}

/// A current (tensorwise) scale from the tensor's own `amax`: 1 where `amax` is zero or not
/// finite (Transformer Engine's `compute_scale_from_amax`), f32's maximum on overflow.
pub fn current_scale(amax: f32, scaled_max: f32) -> f32 {
    delayed_scale(amax, 1.0, scaled_max)
}

fn finite_scale(scale: f32) -> f32 {
    if scale.is_infinite() { f32::MAX } else { scale }
}

/// One role block's step-end update: `amax` rolled into the history (newest first), the scale
/// and its inverse recomputed, `amax` cleared.
pub fn update_block(block: &mut [f32], algo: AmaxAlgo, scaled_max: f32) {
    let amax = block[AMAX];
    let history = &mut block[HISTORY..];
    history.rotate_right(1);
    history[0] = amax;
    let basis = match algo {
        AmaxAlgo::MostRecent => amax,
        AmaxAlgo::Max => history.iter().copied().fold(0.0, amax_max),
    };
    let scale = delayed_scale(basis, block[SCALE], scaled_max);
    block[SCALE] = scale;
    block[SCALE_INV] = 1.0 / scale;
    block[AMAX] = 0.0;
}

/// The step-end update of a whole state (every layer's row, every role). Current scaling keeps
/// no state to update.
pub fn update_state(state: &mut [f32], settings: &Fp8Settings) {
    let Fp8Scaling::Delayed { algo, .. } = settings.scaling else {
        return;
    };
    for row in state.chunks_exact_mut(settings.row_width()) {
        for role in Fp8Role::ALL {
            let at = settings.block_offset(role);
            let block = &mut row[at..at + settings.block_width()];
            update_block(block, algo, settings.scaled_max(role));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delayed(history: usize, algo: AmaxAlgo) -> Fp8Settings {
        Fp8Settings {
            forward: Fp8Format::E4m3,
            backward: Fp8Format::E5m2,
            scaling: Fp8Scaling::Delayed { history, algo },
            margin: 0,
        }
    }

    #[test]
    fn grids_match_an_independent_implementation_of_the_cuda_conversion() {
        // Every f32 of a dense sweep over the formats' ranges, and the special values.
        let mut values: Vec<f32> = (-4000..=4000)
            .flat_map(|i| {
                let t = i as f32 / 4000.0;
                [t * 600.0, t * 70000.0, t * 1e-3, t * 2e-6, t * 3e-8]
            })
            .collect();
        values.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            448.0,
            464.0,
            465.0,
            57344.0,
        ]);
        values.extend([
            61440.0,
            1e30,
            f32::MIN_POSITIVE,
            2f32.powi(-10),
            2f32.powi(-17),
        ]);
        for x in values {
            let e4m3 = float8::F8E4M3::from_f32(x).to_f32();
            let e5m2 = float8::F8E5M2::from_f32(x).to_f32();
            assert_eq!(
                round_to_fp8(x, Fp8Format::E4m3).to_bits(),
                e4m3.to_bits(),
                "{x}"
            );
            assert_eq!(
                round_to_fp8(x, Fp8Format::E5m2).to_bits(),
                e5m2.to_bits(),
                "{x}"
            );
        }
        assert!(round_to_fp8(f32::NAN, Fp8Format::E4m3).is_nan());
    }

    #[test]
    fn grids_have_the_formats_extremes_and_round_ties_to_even() {
        let e4 = Fp8Format::E4m3;
        let e5 = Fp8Format::E5m2;
        assert_eq!(round_to_fp8(1e9, e4), 448.0);
        assert_eq!(round_to_fp8(-f32::INFINITY, e5), -57344.0);
        // smallest subnormals: 2^-9 and 2^-16; half of one rounds to even (zero)
        assert_eq!(round_to_fp8(2f32.powi(-9), e4), 2f32.powi(-9));
        assert_eq!(round_to_fp8(2f32.powi(-10), e4), 0.0);
        assert_eq!(round_to_fp8(2f32.powi(-16) * 1.5, e5), 2f32.powi(-15));
        // 1 + 1/16 lies halfway between 1 and 1.125 in e4m3: ties to the even mantissa
        assert_eq!(round_to_fp8(1.0625, e4), 1.0);
        assert_eq!(round_to_fp8(1.1875, e4), 1.25);
        assert_eq!(round_to_fp8(-3.3, e5), -3.5);
    }

    #[test]
    fn most_recent_takes_this_steps_amax_and_max_the_window() {
        let settings = delayed(3, AmaxAlgo::Max);
        let mut block = vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let step = |amax: f32, block: &mut Vec<f32>, algo| {
            block[AMAX] = amax;
            update_block(block, algo, settings.scaled_max(Fp8Role::Input));
            block[SCALE]
        };
        assert_eq!(step(4.0, &mut block, AmaxAlgo::Max), 112.0);
        assert_eq!(
            step(2.0, &mut block, AmaxAlgo::Max),
            112.0,
            "4 still in the window"
        );
        assert_eq!(&block[HISTORY..], &[2.0, 4.0, 0.0]);
        assert_eq!(step(1.0, &mut block, AmaxAlgo::Max), 112.0);
        assert_eq!(
            step(1.0, &mut block, AmaxAlgo::Max),
            224.0,
            "4 fell out of the window"
        );
        assert_eq!(step(8.0, &mut block, AmaxAlgo::MostRecent), 56.0);
        assert_eq!(block[SCALE_INV], 1.0 / 56.0);
        assert_eq!(block[AMAX], 0.0, "the next step starts from nothing");
    }

    #[test]
    fn margin_halves_the_target_per_unit() {
        assert_eq!(scaled_max(Fp8Format::E4m3, 2), 112.0);
        assert_eq!(
            delayed_scale(2.0, 1.0, scaled_max(Fp8Format::E5m2, 1)),
            14336.0
        );
    }

    #[test]
    fn overflow_keeps_the_old_scale_and_a_tiny_amax_saturates_it() {
        let max = Fp8Format::E4m3.max();
        assert_eq!(delayed_scale(f32::INFINITY, 3.0, max), 3.0);
        assert_eq!(delayed_scale(f32::NAN, 3.0, max), 3.0);
        assert_eq!(delayed_scale(0.0, 3.0, max), 3.0, "nothing seen: keep");
        assert_eq!(delayed_scale(1e-40, 3.0, max), f32::MAX);
        assert_eq!(current_scale(0.0, max), 1.0);
        assert_eq!(current_scale(f32::INFINITY, max), 1.0);
        assert_eq!(current_scale(4.0, max), 112.0);
        // A NaN amax in the window keeps the scale for as long as it stays there.
        let mut block = vec![5.0, 0.2, f32::NAN, 0.0, 0.0];
        update_block(&mut block, AmaxAlgo::Max, max);
        assert_eq!(block[SCALE], 5.0);
        block[AMAX] = 1.0;
        update_block(&mut block, AmaxAlgo::Max, max);
        assert_eq!(block[SCALE], 5.0, "NaN still in the window");
        block[AMAX] = 1.0;
        update_block(&mut block, AmaxAlgo::Max, max);
        assert_eq!(block[SCALE], 448.0);
    }

    #[test]
    fn amax_takes_magnitudes_and_nan_wins() {
        assert_eq!(amax(&[1.0, -3.0, 2.0]), 3.0);
        assert_eq!(amax(&[]), 0.0);
        assert!(amax(&[1.0, f32::NAN, 2.0]).is_nan());
        assert_eq!(amax(&[f32::NEG_INFINITY]), f32::INFINITY);
    }

    #[test]
    fn a_whole_state_updates_each_role_with_its_format() {
        let settings = delayed(2, AmaxAlgo::MostRecent);
        assert_eq!(settings.row_width(), 15);
        let mut state = settings.initial_state(2);
        assert_eq!(state.len(), 30);
        let width = settings.row_width();
        state[width + settings.block_offset(Fp8Role::Weight) + AMAX] = 2.0;
        state[width + settings.block_offset(Fp8Role::GradOutput) + AMAX] = 2.0;
        update_state(&mut state, &settings);
        let block = |row: usize, role| state[row * width + settings.block_offset(role) + SCALE];
        assert_eq!(block(0, Fp8Role::Weight), 1.0, "nothing seen");
        assert_eq!(block(1, Fp8Role::Input), 1.0);
        assert_eq!(block(1, Fp8Role::Weight), 224.0, "e4m3");
        assert_eq!(block(1, Fp8Role::GradOutput), 28672.0, "e5m2");
        let current = Fp8Settings {
            scaling: Fp8Scaling::Current,
            ..settings
        };
        let mut untouched = current.initial_state(1);
        untouched[AMAX] = 9.0;
        update_state(&mut untouched, &current);
        assert_eq!(untouched[AMAX], 9.0, "current scaling keeps no state");
    }
}
