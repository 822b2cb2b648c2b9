use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::Tensor;

use super::*;

/// Every float parameter as (dotted path, values), in visiting order.
fn named_params<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<f32>)> {
    struct Names {
        path: Vec<String>,
        found: Vec<(String, Vec<f32>)>,
    }
    impl<B: Backend> ModuleVisitor<B> for Names {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_owned());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.found.push((self.path.join("."), values(param.val())));
        }
    }
    let mut names = Names {
        path: Vec::new(),
        found: Vec::new(),
    };
    module.visit(&mut names);
    names.found
}

fn find<'a>(params: &'a [(String, Vec<f32>)], suffix: &str) -> &'a [f32] {
    params
        .iter()
        .find(|(name, _)| name.ends_with(suffix))
        .map(|(_, v)| v.as_slice())
        .unwrap_or_else(|| panic!("no parameter ends with {suffix}: {params:?}"))
}

fn std_dev(values: &[f32]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    (values
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt()
}

#[test]
fn init_follows_megatron() {
    let mut model = gpt2_model();
    model.hidden_size = 64;
    model.ffn_hidden_size = Some(256);
    model.num_layers = 8;
    let params = named_params(&build::<Cpu>(&model, 11));
    let std = 0.02;
    let scaled = std / (2.0f64 * 8.0).sqrt();
    for (suffix, expected) in [
        ("embedding.weight", std),
        ("position_embedding.weight", std),
        ("layers.0.attention.qkv.weight", std),
        ("layers.0.attention.proj.weight", scaled),
        ("layers.0.feed_forward.Dense.fc1.weight", std),
        ("layers.7.feed_forward.Dense.fc2.weight", scaled),
    ] {
        let measured = std_dev(find(&params, suffix));
        assert!(
            (measured - expected).abs() < 0.12 * expected,
            "{suffix}: std {measured}, expected {expected}"
        );
    }
    for suffix in ["attention.qkv.bias", "attention.proj.bias", "fc2.bias"] {
        assert!(find(&params, suffix).iter().all(|&v| v == 0.0), "{suffix}");
    }
    assert!(
        find(&params, "final_norm.Layer.gamma")
            .iter()
            .all(|&v| v == 1.0)
    );
    assert!(
        find(&params, "final_norm.Layer.beta")
            .iter()
            .all(|&v| v == 0.0)
    );
}

#[test]
fn init_is_a_function_of_the_seed() {
    let a = named_params(&build::<Cpu>(&moe_model(), 5));
    let b = named_params(&build::<Cpu>(&moe_model(), 5));
    let c = named_params(&build::<Cpu>(&moe_model(), 6));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn training_and_inference_copies_share_parameters() {
    let train = build::<CpuAutodiff>(&gpt2_model(), 2);
    let eval = train.valid();
    assert_eq!(named_params(&train), named_params(&eval));
    assert_eq!(
        train.no_weight_decay_params(),
        eval.no_weight_decay_params()
    );
}
