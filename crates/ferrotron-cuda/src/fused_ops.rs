//! [`FusedOps`] for [`Cuda`]: attention on cuDNN's fused flash-attention engines (bf16/f16,
//! head dims 64 and 128, causal or not, grouped K/V unrepeated, dropout by cuDNN's Philox from
//! the device's seed and a fresh counter range, regenerated in the backward).
//!
//! `FERROTRON_ATTENTION=composed` keeps burn's composition (today's arithmetic); f32 inputs and
//! other head dims always take it (cuDNN's fused attention has no f32 path). With cuDNN
//! missing, the first fused call stops with an error naming what to install.

use std::sync::OnceLock;

use burn::tensor::ops::FloatTensor;
use ferrotron_parallel::{
    AttentionGrads, AttentionSaved, AttentionSpec, FusedOps, composed_attention,
};

use crate::backend::Cuda;
use crate::backend::convert::ok;
use crate::cudnn;

/// Whether fused attention is switched on (`FERROTRON_ATTENTION` unset or `cudnn`).
pub fn fused_attention_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("FERROTRON_ATTENTION").as_deref(),
            Ok("composed") | Ok("off") | Ok("0")
        )
    })
}

impl FusedOps for Cuda {
    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> FloatTensor<Self> {
        // A plain (non-autodiff) backend runs inference: dropout is off, as in burn's Dropout.
        let spec = AttentionSpec {
            dropout: 0.0,
            ..spec
        };
        if Self::has_attention_kernel(&query, &key, &value, &spec) {
            Self::attention_kernel_forward(query, key, value, spec).output
        } else {
            composed_attention::<Self>(query, key, value, spec)
        }
    }

    fn has_attention_kernel(
        query: &FloatTensor<Self>,
        key: &FloatTensor<Self>,
        value: &FloatTensor<Self>,
        spec: &AttentionSpec,
    ) -> bool {
        fused_attention_enabled() && spec.dropout < 1.0 && cudnn::supports(query, key, value)
    }

    fn attention_kernel_forward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionSaved<Self> {
        let scale = spec.scale_for(query.shape()[3]) as f32;
        let f = ok(cudnn::sdpa_forward(
            &query,
            &key,
            &value,
            spec.causal,
            scale,
            spec.dropout as f32,
        ));
        AttentionSaved {
            output: f.output,
            stats: f.stats,
            rng: f.rng,
        }
    }

    fn attention_kernel_backward(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        saved: AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: AttentionSpec,
    ) -> AttentionGrads<Self> {
        let scale = spec.scale_for(query.shape()[3]) as f32;
        let forward = cudnn::SdpaForward {
            output: saved.output,
            stats: saved.stats,
            rng: saved.rng,
        };
        let (dq, dk, dv) = ok(cudnn::sdpa_backward(
            &query,
            &key,
            &value,
            &forward,
            &grad_output,
            spec.causal,
            scale,
            spec.dropout as f32,
        ));
        AttentionGrads {
            query: dq,
            key: dk,
            value: dv,
        }
    }
}
