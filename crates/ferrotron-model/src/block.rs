//! One pre-norm transformer layer, Megatron's order: x + drop(attn(norm(x))), then
//! x + drop(ffn(norm(x))). The attention is grouped-query (`attention`) or, with `model.mla`,
//! multi-latent (`latent_attention`: its own parameter names, so a layer holds one of the two);
//! the feed-forward part is dense or a mixture of experts, chosen per layer by `layer_freq`.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use ferrotron_ops::{Fp8Linear, Fp8Residual};
use ferrotron_parallel::{ParallelContext, ParallelOps, ParamRole};

use crate::attention::SelfAttention;
use crate::init::scaled_std;
use crate::mla::MultiLatentAttention;
use crate::mlp::{Mlp, MlpShape};
use crate::moe::{MoeLayer, MoeStats};
use crate::norm::Norm;
use crate::parallel::{Placement, SequencePositions, TensorParallel, cut_module, roles_of};
use crate::{ModelConfig, ModelError};

/// Both variants live once per layer for the model's lifetime, so their size difference costs
/// nothing worth boxing for (and burn's `Module` derive does not see through a `Box`).
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum FeedForward<B: Backend> {
    Dense(Mlp<B>),
    Moe(MoeLayer<B>),
}

#[derive(Module, Debug)]
pub struct TransformerBlock<B: Backend> {
    input_norm: Norm<B>,
    /// Grouped-query attention; `None` with multi-latent attention.
    attention: Option<SelfAttention<B>>,
    /// Multi-latent attention (`ModelConfig.mla`).
    latent_attention: Option<MultiLatentAttention<B>>,
    pre_mlp_norm: Norm<B>,
    feed_forward: FeedForward<B>,
    hidden_dropout: Dropout,
}

impl<B: Backend> TransformerBlock<B> {
    pub fn new(config: &ModelConfig, index: usize, device: &B::Device) -> Self {
        let norm = || {
            Norm::new(
                config.normalization,
                config.hidden_size,
                config.norm_epsilon,
                device,
            )
        };
        let input_norm = norm();
        let (attention, latent_attention) = match &config.mla {
            None => (Some(SelfAttention::new(config, device)), None),
            Some(mla) => (None, Some(MultiLatentAttention::new(config, mla, device))),
        };
        let pre_mlp_norm = norm();
        let feed_forward = match &config.moe {
            Some(moe) if config.is_moe_layer(index) => {
                FeedForward::Moe(MoeLayer::new(config, moe, device))
            }
            _ => FeedForward::Dense(Mlp::new(
                &MlpShape {
                    hidden: config.hidden_size,
                    ffn: config.ffn_hidden_size,
                    activation: config.activation,
                    bias: config.add_bias_linear,
                    std: config.init_method_std,
                    output_std: scaled_std(config.init_method_std, config.num_layers),
                },
                device,
            )),
        };
        TransformerBlock {
            input_norm,
            attention,
            latent_attention,
            pre_mlp_norm,
            feed_forward,
            hidden_dropout: DropoutConfig::new(config.hidden_dropout).init(),
        }
    }

    /// This rank's part of a full one-rank layer.
    pub fn shard(&self, ctx: &ParallelContext, tp: &TensorParallel) -> Result<Self, ModelError> {
        let replicated = |_: &str| Placement::replicated(tp);
        let feed_forward = match &self.feed_forward {
            FeedForward::Dense(mlp) => FeedForward::Dense(mlp.shard(tp)?),
            FeedForward::Moe(moe) => FeedForward::Moe(moe.shard(ctx)?),
        };
        Ok(TransformerBlock {
            input_norm: cut_module(&self.input_norm, replicated)?,
            attention: self
                .attention
                .as_ref()
                .map(|attention| attention.shard(tp, &ctx.cp))
                .transpose()?,
            latent_attention: self
                .latent_attention
                .as_ref()
                .map(|attention| attention.shard(tp, &ctx.cp))
                .transpose()?,
            pre_mlp_norm: cut_module(&self.pre_mlp_norm, replicated)?,
            feed_forward,
            hidden_dropout: self.hidden_dropout.clone(),
        })
    }

    /// Roles of this layer's parameters, named under `prefix` (`layers.<global index>`).
    pub fn param_roles(
        &self,
        prefix: &str,
        ctx: &ParallelContext,
        tp: &TensorParallel,
    ) -> Vec<ParamRole> {
        let replicated = |_: &str| Placement::replicated(tp);
        let mut roles = roles_of(
            &self.input_norm,
            &format!("{prefix}.input_norm"),
            replicated,
        );
        if let Some(attention) = &self.attention {
            roles.extend(roles_of(
                attention,
                &format!("{prefix}.attention"),
                |name| SelfAttention::<B>::placement(name, tp),
            ));
        }
        if let Some(attention) = &self.latent_attention {
            roles.extend(roles_of(
                attention,
                &format!("{prefix}.latent_attention"),
                |name| MultiLatentAttention::<B>::placement(name, tp),
            ));
        }
        roles.extend(roles_of(
            &self.pre_mlp_norm,
            &format!("{prefix}.pre_mlp_norm"),
            replicated,
        ));
        match &self.feed_forward {
            FeedForward::Dense(mlp) => roles.extend(roles_of(
                mlp,
                &format!("{prefix}.feed_forward.Dense"),
                |name| mlp.placement(name, tp),
            )),
            FeedForward::Moe(moe) => {
                roles.extend(moe.param_roles(&format!("{prefix}.feed_forward.Moe"), ctx));
            }
        }
        roles
    }

    /// The linears that take fp8 GEMMs, by path under the layer: attention's two (multi-latent
    /// attention's four or five), a dense MLP's two, and with `experts` a one-rank MoE layer's
    /// routed experts (`MoeLayer::fp8_linears`; otherwise they keep the 16-bit grouped GEMM).
    pub(crate) fn fp8_linears(&self, experts: bool) -> Vec<String> {
        let mut names: Vec<String> = match &self.latent_attention {
            Some(mla) => mla
                .linear_names()
                .into_iter()
                .map(|name| format!("latent_attention.{name}"))
                .collect(),
            None => vec!["attention.qkv".to_owned(), "attention.proj".to_owned()],
        };
        match &self.feed_forward {
            FeedForward::Dense(_) => {
                names
                    .extend(["feed_forward.Dense.fc1", "feed_forward.Dense.fc2"].map(String::from));
            }
            FeedForward::Moe(moe) if experts => names.extend(
                moe.fp8_linears()
                    .into_iter()
                    .map(|name| format!("feed_forward.Moe.{name}")),
            ),
            FeedForward::Moe(_) => {}
        }
        names
    }

    /// The same layer with the handles of [`Self::fp8_linears`], in that order.
    pub(crate) fn with_fp8(self, handles: Vec<Fp8Linear>) -> Self {
        let mut handles = handles.into_iter();
        let mut next = || handles.next().expect("one fp8 handle per fp8 linear");
        let attention = self
            .attention
            .map(|attention| attention.with_fp8(next(), next()));
        let latent_attention = self.latent_attention.map(|mla| {
            let count = mla.linear_names().len();
            mla.with_fp8((0..count).map(|_| next()).collect())
        });
        let feed_forward = match self.feed_forward {
            FeedForward::Dense(mlp) => FeedForward::Dense(mlp.with_fp8(next(), next())),
            FeedForward::Moe(moe) => FeedForward::Moe(moe.with_fp8(handles.collect())),
        };
        TransformerBlock {
            attention,
            latent_attention,
            feed_forward,
            ..self
        }
    }

    pub(crate) fn moe(&self) -> Option<&MoeLayer<B>> {
        match &self.feed_forward {
            FeedForward::Moe(moe) => Some(moe),
            FeedForward::Dense(_) => None,
        }
    }

    pub(crate) fn map_moe(self, update: impl FnOnce(MoeLayer<B>) -> MoeLayer<B>) -> Self {
        let feed_forward = match self.feed_forward {
            FeedForward::Moe(moe) => FeedForward::Moe(update(moe)),
            dense => dense,
        };
        TransformerBlock {
            feed_forward,
            ..self
        }
    }
}

/// What a sublayer (attention, MLP) hands its block: its output, or, where its fp8 node took
/// the residual add with dropout in, the block's next hidden state.
pub(crate) enum Sublayer<B: Backend> {
    Output(Tensor<B, 3>),
    WithResidual(Tensor<B, 3>),
}

impl<B: ParallelOps> TransformerBlock<B> {
    /// `[batch, seq, hidden]` → same shape, plus routing statistics for an MoE layer. `seq` is
    /// this rank's part of the sequence with sequence parallelism.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        positions: &SequencePositions<B>,
    ) -> (Tensor<B, 3>, Option<MoeStats<B>>) {
        let x = self.attention_block(x, positions);
        self.feed_forward_block(x)
    }

    /// The layer's first half: norm, attention, dropout and the residual add.
    pub(crate) fn attention_block(
        &self,
        x: Tensor<B, 3>,
        positions: &SequencePositions<B>,
    ) -> Tensor<B, 3> {
        let attended = match (&self.attention, &self.latent_attention) {
            (Some(attention), _) => attention.forward_normed(
                x.clone(),
                &self.input_norm,
                positions,
                self.fp8_residual(&x),
            ),
            (None, Some(mla)) => {
                Sublayer::Output(mla.forward(self.input_norm.forward(x.clone()), positions))
            }
            (None, None) => unreachable!("a layer holds one kind of attention"),
        };
        self.add_residual(attended, x)
    }

    /// The layer's second half: norm, MLP or experts, dropout and the residual add (a dense
    /// layer's is what `recompute.modules: [mlp]` re-runs).
    pub(crate) fn feed_forward_block(
        &self,
        x: Tensor<B, 3>,
    ) -> (Tensor<B, 3>, Option<MoeStats<B>>) {
        let (transformed, stats) = match &self.feed_forward {
            FeedForward::Dense(mlp) => {
                let residual = self.fp8_residual(&x);
                (
                    mlp.forward_normed(x.clone(), &self.pre_mlp_norm, residual),
                    None,
                )
            }
            FeedForward::Moe(moe) => {
                let (out, stats) = moe.forward(self.pre_mlp_norm.forward(x.clone()));
                (Sublayer::Output(out), Some(stats))
            }
        };
        (self.add_residual(transformed, x), stats)
    }

    /// The residual add a sublayer's fp8 node may take in (`Sublayer::WithResidual`): where the
    /// hidden dropout is live and the backend runs it as a kernel.
    fn fp8_residual(&self, x: &Tensor<B, 3>) -> Option<Fp8Residual<B>> {
        let prob = self.hidden_dropout.prob;
        let residual = x.clone().into_primitive().tensor();
        (prob > 0.0 && B::ad_enabled(&x.device()) && B::has_dropout_add_kernel(&residual, prob))
            .then_some(Fp8Residual { residual, prob })
    }

    /// The block's next hidden state from a sublayer's result and the residual.
    fn add_residual(&self, sublayer: Sublayer<B>, residual: Tensor<B, 3>) -> Tensor<B, 3> {
        match sublayer {
            Sublayer::Output(out) => self.dropout_add(out, residual),
            Sublayer::WithResidual(next) => next,
        }
    }

    /// `residual + dropout(x)` as one fused op (burn's `Dropout` and add, without a kernel).
    fn dropout_add(&self, x: Tensor<B, 3>, residual: Tensor<B, 3>) -> Tensor<B, 3> {
        Tensor::from_primitive(TensorPrimitive::Float(B::fused_dropout_add(
            x.into_primitive().tensor(),
            residual.into_primitive().tensor(),
            self.hidden_dropout.prob,
        )))
    }
}
