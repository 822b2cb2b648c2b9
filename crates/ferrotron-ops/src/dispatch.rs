//! "Kernel or composed", written once: every fused op runs a backend's kernel where the backend
//! says it has one for these inputs, and the composed default (burn ops: the arithmetic the model
//! had before the op) otherwise. Both paths take the same inputs, so the macro names them once.

/// `kernel(args)` where `has_kernel`, else `composed(args)`; `args` are moved into the one path
/// that runs.
///
/// `has_kernel` is the backend's answer for these inputs (`FusedOps::has_*_kernel`, on CUDA
/// with the op's switch), `kernel` the node or kernel that serves them, `composed` the composed
/// default:
///
/// ```ignore
/// kernel_or_composed!(B::has_gelu_kernel(&x.primitive), gelu_node::<B, C>, composed_gelu::<Self>, (x))
/// ```
#[macro_export]
macro_rules! kernel_or_composed {
    ($has_kernel:expr, $kernel:expr, $composed:expr, ($($arg:expr),* $(,)?) $(,)?) => {
        if $has_kernel {
            ($kernel)($($arg),*)
        } else {
            ($composed)($($arg),*)
        }
    };
}
