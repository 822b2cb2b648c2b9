//! NCCL settings the `recipe` binary defaults in its own environment, before anything runs.
//!
//! NVLink SHARP (NVLS) makes NCCL reduce inside the NVSwitch through multicast memory
//! (`cuMulticastCreate`); NCCL turns it on by itself on Hopper machines whose GPUs sit behind
//! NVSwitches. The shared GPU hosts this project is lent must not use it: their notes
//! (KINDS.md of the device pool) keep NVLink multicast off (`NCCL_NVLS_ENABLE=0`) because a
//! program that uses it can put the host's GPUs, which others share, out of service for a day or
//! more, and ask that the variable stay set also where a program starts others with its own
//! environment. So the binary sets `NCCL_NVLS_ENABLE=0` unless the variable is set: a value the
//! user chose always wins (`NCCL_NVLS_ENABLE=1` on a machine of one's own with working
//! multicast).
//!
//! Why the process environment, and why at the top of `main`: NCCL's per-communicator
//! configuration (`ncclConfig_t`) has no field that turns NVLS off, only the variable does, and
//! NCCL reads it from the environment when the first communicator is made. Setting the variable
//! once, first thing in `main`, covers every path: a single process, each rank of srun or
//! torchrun (each a `recipe` process of its own), and the ranks `--nproc-per-node` starts, which
//! inherit the launcher's environment. `std::env::set_var` is unsafe in Rust 2024 because
//! another thread may read the environment at the same moment; at the top of `main` no other
//! thread exists yet.
#![allow(unsafe_code)]

use std::ffi::OsString;

/// The variable that turns NVLink SHARP on or off.
pub(crate) const NVLS_ENABLE: &str = "NCCL_NVLS_ENABLE";

/// The defaults (variable, value) to set, given how the environment reads: those it lacks or
/// holds empty (NCCL reads an empty value as unset, and would then use NVLS where it can).
fn missing(var: impl Fn(&str) -> Option<OsString>) -> Vec<(&'static str, &'static str)> {
    [(NVLS_ENABLE, "0")]
        .into_iter()
        .filter(|(name, _)| var(name).is_none_or(|value| value.is_empty()))
        .collect()
}

/// Sets the NCCL defaults the environment lacks. Call first thing in `main`, before any thread
/// is started.
pub(crate) fn set_defaults() {
    for (name, value) in missing(|name| std::env::var_os(name)) {
        // SAFETY: called at the top of `main`, before this process starts any thread (the
        // allocator setting before it starts none), so nothing reads the environment while it
        // changes.
        unsafe { std::env::set_var(name, value) };
    }
}

/// Says at debug level (`RUST_LOG=ferrotron::nccl=debug`) what NCCL will read for NVLS.
pub(crate) fn log() {
    let value = std::env::var_os(NVLS_ENABLE).unwrap_or_default();
    tracing::debug!(target: "ferrotron::nccl", "{NVLS_ENABLE}={}", value.to_string_lossy());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvls_is_turned_off_only_when_the_user_did_not_choose() {
        assert_eq!(missing(|_| None), vec![(NVLS_ENABLE, "0")]);
        let chosen = |name: &str| (name == NVLS_ENABLE).then(|| OsString::from("1"));
        assert_eq!(missing(chosen), Vec::new());
        assert_eq!(
            missing(|_| Some(OsString::new())),
            vec![(NVLS_ENABLE, "0")],
            "an empty value chooses nothing"
        );
    }
}
