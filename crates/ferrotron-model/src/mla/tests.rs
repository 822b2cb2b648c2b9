//! Multi-latent attention against transformers' `DeepseekV3Attention` and Megatron-Core's
//! `MLASelfAttention` (numbers from `tools/mla_reference.py`) and against its definition
//! written out in plain loops here.

use burn::module::Param;
use burn::tensor::{Distribution, Tensor, TensorData};
use ferrotron_recipe::{Mla, RopeScaling};
use serde_json::Value;

use super::*;
use crate::norm::Norm;
use crate::tests::{Cpu, build, config, mla_model, values};

fn positions(seq: usize) -> SequencePositions<Cpu> {
    SequencePositions::new(seq, 0, 1, &Default::default()).expect("one cp rank")
}

fn set_linear(linear: &mut Linear<Cpu>, values: Vec<f32>, shape: [usize; 2]) {
    let tensor = Tensor::from_data(TensorData::new(values, shape), &Default::default());
    linear.weight = Param::from_tensor(tensor);
}

fn set_norm(norm: &mut Option<Norm<Cpu>>, values: Vec<f32>) {
    let Some(Norm::Rms(norm)) = norm else {
        panic!("an RMSNorm latent norm");
    };
    let len = values.len();
    norm.gamma = Param::from_tensor(Tensor::from_data(
        TensorData::new(values, [len]),
        &Default::default(),
    ));
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

fn size(value: &Value) -> u32 {
    value.as_u64().expect("a size") as u32
}

/// Our layer with transformers' weights (`[out, in]`, transposed into burn's `[in, out]`).
fn layer_from_fixture(case: &Value) -> MultiLatentAttention<Cpu> {
    let mut model = mla_model();
    model.hidden_size = size(&case["hidden"]);
    model.num_attention_heads = size(&case["heads"]);
    model.norm_epsilon = 1e-6;
    model.rotary_base = case["rotary_base"].as_f64().expect("base");
    model.max_position_embeddings = Some(16);
    model.rope_scaling = (!case["rope_scaling"].is_null()).then(|| {
        serde_json::from_value::<RopeScaling>(case["rope_scaling"].clone()).expect("scaling")
    });
    model.mla = Some(Mla {
        q_lora_rank: case["q_lora_rank"].as_u64().map(|r| r as u32),
        kv_lora_rank: size(&case["kv_lora_rank"]),
        qk_head_dim: size(&case["qk_head_dim"]),
        qk_pos_emb_head_dim: size(&case["qk_pos_emb_head_dim"]),
        v_head_dim: size(&case["v_head_dim"]),
    });
    let config = config(&model);
    let mla = config.mla.expect("mla");
    let mut layer = MultiLatentAttention::<Cpu>::new(&config, &mla, &Default::default());
    let weights = case["weights"].as_object().expect("weights");
    for (name, weight) in weights {
        let shape: Vec<usize> = weight["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        let values = floats(&weight["values"]);
        let transposed = || {
            let (rows, columns) = (shape[0], shape[1]);
            let mut out = vec![0.0; values.len()];
            for r in 0..rows {
                for c in 0..columns {
                    out[c * rows + r] = values[r * columns + c];
                }
            }
            (out, [columns, rows])
        };
        let linear = match name.as_str() {
            "q_a_layernorm.weight" => {
                set_norm(&mut layer.q_layernorm, values);
                continue;
            }
            "kv_a_layernorm.weight" => {
                set_norm(&mut layer.kv_layernorm, values);
                continue;
            }
            "q_proj.weight" => layer.linear_q_proj.as_mut().expect("q_proj"),
            "q_a_proj.weight" => layer.linear_q_down_proj.as_mut().expect("q_a_proj"),
            "q_b_proj.weight" => layer.linear_q_up_proj.as_mut().expect("q_b_proj"),
            "kv_a_proj_with_mqa.weight" => &mut layer.linear_kv_down_proj,
            "kv_b_proj.weight" => &mut layer.linear_kv_up_proj,
            "o_proj.weight" => &mut layer.linear_proj,
            other => panic!("unexpected transformers tensor {other}"),
        };
        let (values, shape) = transposed();
        set_linear(linear, values, shape);
    }
    layer
}

/// transformers' `DeepseekV3Attention` (with `rope_interleave`, eager, f32) and Megatron-Core's
/// `MLASelfAttention` on the same weights and input: outputs within 1e-5 of each, the softmax
/// scale (mscale² with YaRN) to the last bits.
#[test]
fn matches_transformers_and_megatron() {
    let cases: Vec<Value> = serde_json::from_str(include_str!("reference.json")).expect("fixture");
    assert_eq!(cases.len(), 2);
    for case in cases {
        let layer = layer_from_fixture(&case);
        for (reference, scale, output) in [
            ("transformers", "softmax_scale", "output"),
            ("Megatron", "megatron_softmax_scale", "megatron_output"),
        ] {
            let what = format!("q_lora_rank {}, {reference}", case["q_lora_rank"]);
            let scale = case[scale].as_f64().expect("scale");
            assert!(
                (layer.softmax_scale - scale).abs() < 1e-12,
                "{what}: scale {} vs {scale}",
                layer.softmax_scale
            );
            let shape: Vec<usize> = case["shape"]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dim") as usize)
                .collect();
            let shape = [shape[0], shape[1], shape[2]];
            let x = Tensor::<Cpu, 3>::from_data(
                TensorData::new(floats(&case["input"]), shape),
                &Default::default(),
            );
            let ours = values(layer.forward(x, &positions(shape[1])));
            let theirs = floats(&case[output]);
            assert_eq!(ours.len(), theirs.len());
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert!((a - b).abs() <= 1e-5, "{what}: element {i}: {a} vs {b}");
            }
        }
    }
}

/// `[rows, columns]` row-major values of a linear's weight.
fn weight(linear: &Linear<Cpu>) -> (Vec<f64>, usize) {
    let columns = linear.weight.val().dims()[1];
    let values = values(linear.weight.val()).into_iter().map(f64::from);
    (values.collect(), columns)
}

/// `x [in] · w [in, out]`.
fn times(x: &[f64], (w, columns): &(Vec<f64>, usize)) -> Vec<f64> {
    (0..*columns)
        .map(|c| {
            x.iter()
                .enumerate()
                .map(|(r, v)| v * w[r * columns + c])
                .sum()
        })
        .collect()
}

fn rms_norm(x: &[f64], gamma: &[f64], epsilon: f64) -> Vec<f64> {
    let mean_square = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inverse = 1.0 / (mean_square + epsilon).sqrt();
    x.iter().zip(gamma).map(|(v, g)| v * inverse * g).collect()
}

/// DeepSeek's rotary embedding as defined: channels `(2i, 2i+1)` form pair `i`, rotated by
/// `position · base^(−2i/d)`.
fn rotate_pairs(x: &[f64], position: usize, base: f64) -> Vec<f64> {
    let d = x.len();
    let mut out = x.to_vec();
    for pair in 0..d / 2 {
        let angle = position as f64 * base.powf(-(2.0 * pair as f64) / d as f64);
        let (a, b) = (x[2 * pair], x[2 * pair + 1]);
        out[2 * pair] = a * angle.cos() - b * angle.sin();
        out[2 * pair + 1] = b * angle.cos() + a * angle.sin();
    }
    out
}

/// The layer's output from its definition, token by token in f64 (no scaling of the rotary
/// frequencies: the scale is `1/sqrt(q_head_dim)`).
fn by_definition(layer: &MultiLatentAttention<Cpu>, x: &[f64], shape: [usize; 3]) -> Vec<f64> {
    let [batch, seq, hidden] = shape;
    let MlaConfig {
        kv_lora_rank,
        qk_head_dim,
        qk_pos_emb_head_dim: rope,
        v_head_dim,
        ..
    } = layer.dims;
    let heads = layer.num_heads;
    let gamma = |norm: &Option<Norm<Cpu>>| -> Vec<f64> {
        match norm {
            Some(Norm::Rms(norm)) => values(norm.gamma.val())
                .into_iter()
                .map(f64::from)
                .collect(),
            _ => panic!("RMSNorm latent norms"),
        }
    };
    let (q_gamma, kv_gamma) = (gamma(&layer.q_layernorm), gamma(&layer.kv_layernorm));
    let q_down = weight(layer.linear_q_down_proj.as_ref().expect("q latent"));
    let q_up = weight(layer.linear_q_up_proj.as_ref().expect("q latent"));
    let kv_down = weight(&layer.linear_kv_down_proj);
    let kv_up = weight(&layer.linear_kv_up_proj);
    let proj = weight(&layer.linear_proj);
    let q_head = qk_head_dim + rope;
    let scale = 1.0 / (q_head as f64).sqrt();
    let mut out = Vec::new();
    for b in 0..batch {
        // Per token: every head's query and key (rotated) and value.
        let mut queries = Vec::new();
        let mut keys = Vec::new();
        let mut vals = Vec::new();
        for t in 0..seq {
            let token = &x[(b * seq + t) * hidden..(b * seq + t + 1) * hidden];
            let q = times(&rms_norm(&times(token, &q_down), &q_gamma, 1e-6), &q_up);
            let kv = times(token, &kv_down);
            let latent = rms_norm(&kv[..kv_lora_rank], &kv_gamma, 1e-6);
            let k_rope = rotate_pairs(&kv[kv_lora_rank..], t, 10000.0);
            let kv = times(&latent, &kv_up);
            let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
            for h in 0..heads {
                let q = &q[h * q_head..(h + 1) * q_head];
                let mut query = q[..qk_head_dim].to_vec();
                query.extend(rotate_pairs(&q[qk_head_dim..], t, 10000.0));
                let kv = &kv[h * (qk_head_dim + v_head_dim)..(h + 1) * (qk_head_dim + v_head_dim)];
                let mut key = kv[..qk_head_dim].to_vec();
                key.extend(&k_rope);
                qs.push(query);
                ks.push(key);
                vs.push(kv[qk_head_dim..].to_vec());
            }
            queries.push(qs);
            keys.push(ks);
            vals.push(vs);
        }
        for (t, query) in queries.iter().enumerate() {
            let mut context = Vec::new();
            for (h, query) in query.iter().enumerate() {
                let scores: Vec<f64> = keys[..=t]
                    .iter()
                    .map(|key| scale * query.iter().zip(&key[h]).map(|(a, b)| a * b).sum::<f64>())
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                context.extend((0..v_head_dim).map(|c| {
                    let sum: f64 = weights.iter().zip(&vals).map(|(w, v)| w * v[h][c]).sum();
                    sum / total
                }));
            }
            out.extend(times(&context, &proj));
        }
    }
    out
}

/// The layer against its definition: latents, norms, per-head split `[nope | rope]` of queries
/// and `[k_nope | v]` of the key/value up projection, one rotary key shared by every head,
/// DeepSeek's interleaved pairs rotated, causal softmax with the value's own head dim.
#[test]
fn matches_its_definition_written_out() {
    let device = Default::default();
    let mut model = mla_model();
    model.norm_epsilon = 1e-6;
    model.init_method_std = 0.3;
    let config = config(&model);
    Cpu::seed(&device, 3);
    let mut layer = MultiLatentAttention::<Cpu>::new(&config, &config.mla.expect("mla"), &device);
    // Norm weights other than one, so a norm applied in the wrong place shows.
    let perturbed = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| 1.0 + 0.1 * ((i as f32 + seed) * 1.7).sin())
            .collect()
    };
    set_norm(&mut layer.q_layernorm, perturbed(12, 0.0));
    set_norm(&mut layer.kv_layernorm, perturbed(8, 5.0));
    let shape = [2, 6, 16];
    let x = Tensor::<Cpu, 3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let expected = by_definition(
        &layer,
        &values(x.clone())
            .into_iter()
            .map(f64::from)
            .collect::<Vec<_>>(),
        shape,
    );
    let ours = values(layer.forward(x, &positions(6)));
    assert_eq!(ours.len(), expected.len());
    let size = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(size > 1e-2, "a output large enough to compare ({size})");
    for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
        assert!(
            (f64::from(*a) - b).abs() <= 1e-5 * size,
            "element {i}: {a} vs {b}"
        );
    }
}

/// Every MLA tensor under the names and shapes the checkpoint and HF code map, no fused QKV.
#[test]
fn parameters_are_named_the_megatron_way() {
    let model = build::<Cpu>(&mla_model(), 1);
    let shapes: Vec<(String, Vec<usize>)> = model
        .param_roles()
        .into_iter()
        .filter(|role| role.shard.global_name.starts_with("layers.0."))
        .map(|role| (role.shard.global_name, role.shard.global_shape))
        .collect();
    let expected = [
        ("layers.0.input_norm.Rms.gamma", vec![16]),
        (
            "layers.0.latent_attention.linear_q_down_proj.weight",
            vec![16, 12],
        ),
        ("layers.0.latent_attention.q_layernorm.Rms.gamma", vec![12]),
        (
            "layers.0.latent_attention.linear_q_up_proj.weight",
            vec![12, 4 * 10],
        ),
        (
            "layers.0.latent_attention.linear_kv_down_proj.weight",
            vec![16, 8 + 4],
        ),
        ("layers.0.latent_attention.kv_layernorm.Rms.gamma", vec![8]),
        (
            "layers.0.latent_attention.linear_kv_up_proj.weight",
            vec![8, 4 * (6 + 5)],
        ),
        (
            "layers.0.latent_attention.linear_proj.weight",
            vec![4 * 5, 16],
        ),
        ("layers.0.pre_mlp_norm.Rms.gamma", vec![16]),
        ("layers.0.feed_forward.Dense.fc1.weight", vec![16, 64]),
        ("layers.0.feed_forward.Dense.fc2.weight", vec![32, 16]),
    ];
    let expected: Vec<(String, Vec<usize>)> = expected
        .into_iter()
        .map(|(name, shape)| (name.to_owned(), shape))
        .collect();
    assert_eq!(shapes, expected);

    let mut full_rank = mla_model();
    if let Some(mla) = full_rank.mla.as_mut() {
        mla.q_lora_rank = None;
    }
    full_rank.qk_layernorm = false;
    full_rank.add_bias_linear = true;
    let names: Vec<String> = build::<Cpu>(&full_rank, 1)
        .param_roles()
        .into_iter()
        .map(|role| role.shard.global_name)
        .filter(|name| name.starts_with("layers.0.latent_attention."))
        .collect();
    assert_eq!(
        names,
        [
            "layers.0.latent_attention.linear_q_proj.weight",
            "layers.0.latent_attention.linear_kv_down_proj.weight",
            "layers.0.latent_attention.linear_kv_up_proj.weight",
            "layers.0.latent_attention.linear_proj.weight",
            "layers.0.latent_attention.linear_proj.bias",
        ]
    );
}

/// Megatron's init: normal(0, std) projections, std/sqrt(2·layers) for `linear_proj`, unit
/// latent norms.
#[test]
fn initialisation_is_megatrons() {
    let mut model = mla_model();
    model.hidden_size = 64;
    model.num_attention_heads = 8;
    model.init_method_std = 0.5;
    if let Some(mla) = model.mla.as_mut() {
        mla.q_lora_rank = Some(64);
        mla.kv_lora_rank = 64;
    }
    let config = config(&model);
    let device = Default::default();
    Cpu::seed(&device, 11);
    let layer = MultiLatentAttention::<Cpu>::new(&config, &config.mla.expect("mla"), &device);
    let std = |linear: &Linear<Cpu>| {
        let v = values(linear.weight.val());
        (v.iter().map(|x| f64::from(x * x)).sum::<f64>() / v.len() as f64).sqrt()
    };
    for (name, linear, expected) in [
        ("q down", layer.linear_q_down_proj.as_ref().expect("q"), 0.5),
        ("q up", layer.linear_q_up_proj.as_ref().expect("q"), 0.5),
        ("kv down", &layer.linear_kv_down_proj, 0.5),
        ("kv up", &layer.linear_kv_up_proj, 0.5),
        ("proj", &layer.linear_proj, 0.5 / 2.0),
    ] {
        let measured = std(linear);
        assert!(
            (measured - expected).abs() < 0.05 * expected,
            "{name}: std {measured}, expected {expected}"
        );
    }
    for norm in [&layer.q_layernorm, &layer.kv_layernorm] {
        let Some(Norm::Rms(norm)) = norm else {
            panic!("latent norms")
        };
        assert!(values(norm.gamma.val()).iter().all(|&g| g == 1.0));
    }
}
