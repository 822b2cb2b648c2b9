//! Rotary position embeddings in Megatron's (and Hugging Face LLaMA's) "rotate half" layout: the
//! first and second halves of each head's channels form the rotated pairs. burn's own
//! `RotaryEncoding` pairs adjacent channels instead, which would make checkpoints incompatible
//! with Megatron's, hence this small module. The tables are constants, not parameters, built on
//! the host in f64 so every backend (CPU and CUDA) reads the same numbers.
//!
//! Scaled variants (`model.rope_scaling`) change only the inverse frequencies and, for YaRN, a
//! factor on cos and sin, exactly as transformers' `_compute_llama3_parameters`,
//! `_compute_linear_scaling_rope_parameters` and `_compute_yarn_parameters` do (Megatron-Core's
//! `RotaryEmbedding._apply_scaling`, `seq_len_interpolation_factor` and `YarnRotaryEmbedding`
//! compute the same; one difference: for YaRN with `mscale ≠ 1` and `mscale_all_dim` 0,
//! Megatron's temperature is `0.1·mscale·ln(factor) + 1` while transformers ignores `mscale`
//! unless `mscale_all_dim` is non-zero. This follows Megatron; the two agree for every
//! published configuration). Linear scaling divides the frequencies by the factor, which is
//! dividing the positions by it.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ferrotron_ops::FusedOps;
use ferrotron_recipe::{RopeScaling, RopeScalingType};

use crate::parallel::SequencePositions;

#[derive(Module, Debug)]
pub struct RotaryEmbedding<B: Backend> {
    /// `[positions, head_dim]`
    cos: Tensor<B, 2>,
    /// `[positions, head_dim]`
    sin: Tensor<B, 2>,
}

impl<B: Backend> RotaryEmbedding<B> {
    /// Tables for `positions` positions of `head_dim` (even) channels with base `theta`, the
    /// frequencies scaled by `scaling` where given.
    pub fn new(
        head_dim: usize,
        positions: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
        device: &B::Device,
    ) -> Self {
        let inverse_frequencies = inverse_frequencies(head_dim, theta, scaling);
        let temperature = scaling.map_or(1.0, attention_factor);
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(positions * head_dim);
        let mut sin = Vec::with_capacity(positions * head_dim);
        for position in 0..positions {
            // Both halves use the same frequencies: channel i pairs with channel i + half.
            for channel in 0..head_dim {
                let angle = position as f64 * inverse_frequencies[channel % half];
                cos.push((angle.cos() * temperature) as f32);
                sin.push((angle.sin() * temperature) as f32);
            }
        }
        let shape = [positions, head_dim];
        RotaryEmbedding {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
        }
    }

    /// Rotate `x` of shape `[batch, heads, seq, head_dim]`, row i by the global position of
    /// this rank's token i.
    pub fn apply(&self, x: Tensor<B, 4>, positions: &SequencePositions<B>) -> Tensor<B, 4> {
        let [_, _, seq, head_dim] = x.dims();
        let half = head_dim / 2;
        let cos = positions.rows(self.cos.clone(), 0..seq).unsqueeze::<4>();
        let sin = positions.rows(self.sin.clone(), 0..seq).unsqueeze::<4>();
        let first = x.clone().slice_dim(3, 0..half);
        let second = x.clone().slice_dim(3, half..head_dim);
        let rotated = Tensor::cat(vec![second.neg(), first], 3);
        x * cos + rotated * sin
    }

    /// Rotate the query and key slots of the packed projection `[batch, seq, groups, slots,
    /// head_dim]` in place of splitting it (one node and kernel pair on a GPU; see
    /// `FusedOps::fused_rope_qkv`), row i by the global position of this rank's token i.
    pub fn apply_packed(&self, qkv: Tensor<B, 5>, positions: &SequencePositions<B>) -> Tensor<B, 5>
    where
        B: FusedOps,
    {
        let seq = qkv.dims()[1];
        let (cos, sin) = self.packed_tables(positions, seq);
        Tensor::from_primitive(TensorPrimitive::Float(B::fused_rope_qkv(
            qkv.into_primitive().tensor(),
            cos.into_primitive().tensor(),
            sin.into_primitive().tensor(),
        )))
    }

    /// The `cos` and `sin` rows `[seq, head_dim]` of a packed projection's `seq` positions.
    pub(crate) fn packed_tables(
        &self,
        positions: &SequencePositions<B>,
        seq: usize,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        (
            positions.rows(self.cos.clone(), 0..seq),
            positions.rows(self.sin.clone(), 0..seq),
        )
    }

    /// Positions the tables cover.
    pub fn positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

/// The `head_dim / 2` inverse frequencies `theta^(−2i/head_dim)`, scaled by `scaling`.
pub(crate) fn inverse_frequencies(
    head_dim: usize,
    theta: f64,
    scaling: Option<&RopeScaling>,
) -> Vec<f64> {
    let unscaled = (0..head_dim / 2).map(|pair| theta.powf(-(2.0 * pair as f64) / head_dim as f64));
    let Some(scaling) = scaling else {
        return unscaled.collect();
    };
    let factor = scaling.factor;
    match scaling.scaling_type {
        RopeScalingType::Linear => unscaled.map(|f| f / factor).collect(),
        RopeScalingType::Llama3 => {
            let context = f64::from(scaling.original_max_position_embeddings());
            let (low, high) = (scaling.low_freq_factor(), scaling.high_freq_factor());
            let (low_wavelength, high_wavelength) = (context / low, context / high);
            unscaled
                .map(|f| {
                    let wavelength = 2.0 * std::f64::consts::PI / f;
                    if wavelength < high_wavelength {
                        f
                    } else if wavelength > low_wavelength {
                        f / factor
                    } else {
                        let smooth = (context / wavelength - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        RopeScalingType::Yarn => {
            let (low, high) = yarn_correction_range(scaling, head_dim, theta);
            let high = if low == high { high + 0.001 } else { high };
            unscaled
                .enumerate()
                .map(|(pair, f)| {
                    let ramp = ((pair as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    f / factor * (1.0 - extrapolation) + f * extrapolation
                })
                .collect()
        }
    }
}

/// YaRN's band of pairs `[low, high]` between kept (below) and interpolated (above)
/// frequencies, rounded outwards and clamped as Megatron's `_yarn_find_correction_range`.
fn yarn_correction_range(scaling: &RopeScaling, head_dim: usize, theta: f64) -> (f64, f64) {
    let context = f64::from(scaling.original_max_position_embeddings());
    let dim = head_dim as f64;
    let pair_of = |rotations: f64| {
        dim * (context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
    };
    let low = pair_of(scaling.beta_fast()).floor().max(0.0);
    let high = pair_of(scaling.beta_slow()).ceil().min(dim - 1.0);
    (low, high)
}

/// The factor on cos and sin: YaRN's attention temperature (Megatron's
/// `_yarn_get_concentration_factor`), 1 for the other types.
pub(crate) fn attention_factor(scaling: &RopeScaling) -> f64 {
    let mscale = |scale: f64| {
        if scaling.factor <= 1.0 {
            1.0
        } else {
            0.1 * scale * scaling.factor.ln() + 1.0
        }
    };
    match scaling.scaling_type {
        RopeScalingType::Yarn => mscale(scaling.mscale()) / mscale(scaling.mscale_all_dim()),
        RopeScalingType::Llama3 | RopeScalingType::Linear => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Distribution;

    use super::*;
    use crate::tests::{Cpu, values};

    /// The same vector at every position, rotated: `[1, 1, positions, dim]`.
    fn rotated_everywhere(rope: &RotaryEmbedding<Cpu>, v: &Tensor<Cpu, 1>) -> Vec<f32> {
        let [dim] = v.dims();
        let positions = rope.positions();
        let x = v
            .clone()
            .reshape([1, 1, 1, dim])
            .expand([1, 1, positions, dim]);
        let at = SequencePositions::new(positions, 0, 1, &v.device()).expect("one cp rank");
        values(rope.apply(x, &at))
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn scores_depend_only_on_relative_position() {
        let device = Default::default();
        let dim = 8;
        let rope = RotaryEmbedding::<Cpu>::new(dim, 16, 10000.0, None, &device);
        let q = Tensor::<Cpu, 1>::random([dim], Distribution::Normal(0.0, 1.0), &device);
        let k = Tensor::<Cpu, 1>::random([dim], Distribution::Normal(0.0, 1.0), &device);
        let q_rot = rotated_everywhere(&rope, &q);
        let k_rot = rotated_everywhere(&rope, &k);
        let at = |rows: &[f32], p: usize| rows[p * dim..(p + 1) * dim].to_vec();
        let score = |m, n| dot(&at(&q_rot, m), &at(&k_rot, n));
        assert!((score(3, 1) - score(12, 10)).abs() < 1e-4);
        assert!((score(7, 7) - score(0, 0)).abs() < 1e-4);
        assert!(
            (score(9, 2) - score(3, 1)).abs() > 1e-4,
            "offset should matter"
        );
        // Rotation preserves length, and position 0 is the identity.
        let q_raw = values(q);
        assert!((dot(&at(&q_rot, 5), &at(&q_rot, 5)) - dot(&q_raw, &q_raw)).abs() < 1e-4);
        assert_eq!(at(&q_rot, 0), q_raw);
    }

    #[test]
    fn rotate_half_pairs_channel_i_with_i_plus_half() {
        // theta^0 = 1 for pair 0: at position 1 channels (0, 2) of a 4-channel head rotate by
        // 1 radian; pair 1 (channels 1, 3) by 1/theta radians.
        let device = Default::default();
        let rope = RotaryEmbedding::<Cpu>::new(4, 2, 100.0, None, &device);
        let x = Tensor::<Cpu, 1>::from_floats([1.0, 0.0, 0.0, 0.0], &device);
        let rotated = rotated_everywhere(&rope, &x);
        let (c, s) = (1.0f32.cos(), 1.0f32.sin());
        let position1 = &rotated[4..8];
        assert!((position1[0] - c).abs() < 1e-6 && (position1[2] - s).abs() < 1e-6);
        assert!(position1[1].abs() < 1e-6 && position1[3].abs() < 1e-6);
    }

    /// Inverse frequencies and the cos/sin factor against transformers' own functions
    /// (`tools/rope_scaling_reference.py`), which compute in f32: relative 1e-6.
    #[test]
    fn scaled_frequencies_match_transformers() {
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(include_str!("rope_scaling_reference.json")).expect("fixture");
        assert_eq!(cases.len(), 6);
        for case in cases {
            let scaling: RopeScaling =
                serde_json::from_value(case["rope_scaling"].clone()).expect("recipe spelling");
            let head_dim = case["head_dim"].as_u64().expect("head_dim") as usize;
            let theta = case["theta"].as_f64().expect("theta");
            let ours = inverse_frequencies(head_dim, theta, Some(&scaling));
            let theirs: Vec<f64> = serde_json::from_value(case["inv_freq"].clone()).expect("freqs");
            assert_eq!(ours.len(), theirs.len());
            for (pair, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs(),
                    "{scaling:?} pair {pair}: {a} vs transformers {b}"
                );
            }
            let factor = case["attention_factor"].as_f64().expect("factor");
            assert!(
                (attention_factor(&scaling) - factor).abs() < 1e-12,
                "{scaling:?}: {} vs {factor}",
                attention_factor(&scaling)
            );
        }
    }

    /// Linear scaling is position interpolation: position `p` of the scaled table is position
    /// `p / factor` of the unscaled one; YaRN's temperature multiplies both tables.
    #[test]
    fn linear_scaling_interpolates_positions_and_yarn_scales_the_tables() {
        let device = Default::default();
        let linear: RopeScaling =
            serde_json::from_value(serde_json::json!({"type": "linear", "factor": 2.0}))
                .expect("linear");
        let scaled = RotaryEmbedding::<Cpu>::new(8, 8, 10000.0, Some(&linear), &device);
        let plain = RotaryEmbedding::<Cpu>::new(8, 4, 10000.0, None, &device);
        let scaled_cos = values(scaled.cos.clone());
        let plain_cos = values(plain.cos.clone());
        for p in 0..4 {
            assert_eq!(
                scaled_cos[2 * p * 8..(2 * p + 1) * 8],
                plain_cos[p * 8..(p + 1) * 8]
            );
        }
        let yarn: RopeScaling = serde_json::from_value(
            serde_json::json!({"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4}),
        )
        .expect("yarn");
        let scaled = RotaryEmbedding::<Cpu>::new(8, 1, 10000.0, Some(&yarn), &device);
        let expected = 0.1 * 16f64.ln() + 1.0;
        for c in values(scaled.cos) {
            assert!((f64::from(c) - expected).abs() < 1e-6, "{c} vs {expected}");
        }
    }
}
