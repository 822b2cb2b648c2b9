//! The environment switches that turn one of the backend's own paths back to burn's
//! composition (`FERROTRON_ATTENTION`, `FERROTRON_FUSED`, `FERROTRON_VECTOR_MAPS`,
//! `FERROTRON_GROUPED_GEMM`): each read
//! once per process, on first use, and off for the values `composed`, `off` or `0`.

use std::sync::OnceLock;

/// Whether a switch's value turns its path off.
fn is_off(value: Option<&str>) -> bool {
    matches!(value, Some("composed" | "off" | "0"))
}

/// Whether the path behind `var` is on, read into `cell` the first time.
pub(crate) fn enabled(cell: &'static OnceLock<bool>, var: &str) -> bool {
    *cell.get_or_init(|| !is_off(std::env::var(var).ok().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composed_off_and_zero_switch_a_path_off_and_anything_else_leaves_it_on() {
        for off in ["composed", "off", "0"] {
            assert!(is_off(Some(off)), "{off}");
        }
        for on in [None, Some("cudnn"), Some("1"), Some("")] {
            assert!(!is_off(on), "{on:?}");
        }
    }
}
