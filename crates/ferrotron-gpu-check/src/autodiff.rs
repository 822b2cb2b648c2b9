//! One end-to-end row: gradients of a small MLP with a softmax cross-entropy loss through
//! `Autodiff<B>`. The per-op rows test forward kernels; this row tests that the backward graph
//! burn builds from them (transposed matmuls, broadcast-sum of the bias, gather of the targets)
//! lands on the same numbers as the CPU.

use burn::backend::Autodiff;
use burn::tensor::activation::{gelu, log_softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// Host inputs of the MLP row: x, w1, b1, w2, targets.
pub(crate) struct MlpInputs {
    pub x: TensorData,
    pub w1: TensorData,
    pub b1: TensorData,
    pub w2: TensorData,
    pub targets: TensorData,
}

impl MlpInputs {
    /// The same inputs with every float tensor passed through `convert` (targets untouched).
    pub(crate) fn in_dtype(&self, convert: impl Fn(TensorData) -> TensorData) -> Self {
        Self {
            x: convert(self.x.clone()),
            w1: convert(self.w1.clone()),
            b1: convert(self.b1.clone()),
            w2: convert(self.w2.clone()),
            targets: self.targets.clone(),
        }
    }
}

/// Returns the loss followed by the flattened gradients of w1, b1, w2 and x, as one f32 vector.
pub(crate) fn mlp_gradients<B: Backend>(inputs: &MlpInputs, device: &B::Device) -> TensorData {
    type A<B> = Autodiff<B>;
    // Keep the inputs' dtype (burn would otherwise convert to the device's default float).
    let at = (device, inputs.x.dtype);
    let x = Tensor::<A<B>, 2>::from_data(inputs.x.clone(), at).require_grad();
    let w1 = Tensor::<A<B>, 2>::from_data(inputs.w1.clone(), at).require_grad();
    let b1 = Tensor::<A<B>, 1>::from_data(inputs.b1.clone(), at).require_grad();
    let w2 = Tensor::<A<B>, 2>::from_data(inputs.w2.clone(), at).require_grad();
    let targets = Tensor::<A<B>, 2, Int>::from_data(inputs.targets.clone(), device);

    let hidden = gelu(x.clone().matmul(w1.clone()) + b1.clone().unsqueeze::<2>());
    let logits = hidden.matmul(w2.clone());
    let picked = log_softmax(logits, 1).gather(1, targets);
    let loss = picked.mean().neg();
    let grads = loss.backward();

    let flat = |t: Tensor<B, 2>| t.reshape([-1]);
    let parts = vec![
        loss.inner().reshape([1]),
        flat(w1.grad(&grads).expect("w1 takes part in the loss")),
        b1.grad(&grads).expect("b1 takes part in the loss"),
        flat(w2.grad(&grads).expect("w2 takes part in the loss")),
        flat(x.grad(&grads).expect("x takes part in the loss")),
    ];
    Tensor::cat(parts, 0).into_data()
}
