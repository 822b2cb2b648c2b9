//! Rotary position embeddings in Megatron's (and Hugging Face LLaMA's) "rotate half" layout: the
//! first and second halves of each head's channels form the rotated pairs. burn's own
//! `RotaryEncoding` pairs adjacent channels instead, which would make checkpoints incompatible
//! with Megatron's, hence this small module. The tables are constants, not parameters.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ferrotron_parallel::FusedOps;

use crate::parallel::SequencePositions;

#[derive(Module, Debug)]
pub struct RotaryEmbedding<B: Backend> {
    /// `[positions, head_dim]`
    cos: Tensor<B, 2>,
    /// `[positions, head_dim]`
    sin: Tensor<B, 2>,
}

impl<B: Backend> RotaryEmbedding<B> {
    /// Tables for `positions` positions of `head_dim` (even) channels with base `theta`.
    pub fn new(head_dim: usize, positions: usize, theta: f64, device: &B::Device) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(positions * head_dim);
        let mut sin = Vec::with_capacity(positions * head_dim);
        for position in 0..positions {
            // Both halves use the same frequencies: channel i pairs with channel i + half.
            for channel in 0..head_dim {
                let pair = channel % half;
                let inverse_frequency = theta.powf(-(2.0 * pair as f64) / head_dim as f64);
                let angle = position as f64 * inverse_frequency;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
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
        let rope = RotaryEmbedding::<Cpu>::new(dim, 16, 10000.0, &device);
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
        let rope = RotaryEmbedding::<Cpu>::new(4, 2, 100.0, &device);
        let x = Tensor::<Cpu, 1>::from_floats([1.0, 0.0, 0.0, 0.0], &device);
        let rotated = rotated_everywhere(&rope, &x);
        let (c, s) = (1.0f32.cos(), 1.0f32.sin());
        let position1 = &rotated[4..8];
        assert!((position1[0] - c).abs() < 1e-6 && (position1[2] - s).abs() < 1e-6);
        assert!(position1[1].abs() < 1e-6 && position1[3].abs() < 1e-6);
    }
}
