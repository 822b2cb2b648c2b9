//! The process allocator: mimalloc, told to keep what it frees.
//!
//! Training on the CPU allocates and frees logits-sized buffers every microbatch. glibc's
//! allocator returned them to the kernel and page-faulted them back in (a third of a step in
//! `perf`); mimalloc with its defaults still purges freed memory after 10 ms, so every step paid
//! the faults again (`clear_page` 10 % of a shakespeare-tiny step in `perf`; tools/README.md). With
//! purging off the pages stay mapped, as PyTorch's caching allocators keep theirs: ten steps on
//! one thread of the 2-core CI machine took 0.19 s of system time instead of 1.18 s (1,199 minor
//! faults instead of 13,279), for 630 MiB peak resident memory instead of 536.
#![allow(unsafe_code)]

use libmimalloc_sys::mi_option_t;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in the `mi_option_e` enum of the mimalloc 3 header the crate builds
/// (`c_src/mimalloc/v3/include/mimalloc.h`); libmimalloc-sys 0.1.49 does not name it. The test
/// below fails if the number names another option (the freed block is then purged).
const PURGE_DELAY: mi_option_t = 15;

/// Never return freed memory to the OS (purge delay −1). Call first thing in `main`.
pub(crate) fn keep_freed_memory() {
    // SAFETY: `mi_option_set` only stores an option value; mimalloc reads it on its next purge.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's resident memory, from `/proc/self/status`.
    fn resident_bytes() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .expect("a VmRSS line");
        let kib: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .expect("VmRSS in kB");
        kib * 1024
    }

    /// How much of a freed, touched 256 MiB block left the resident set once mimalloc was told
    /// to collect everything it could.
    fn released_after_free() -> u64 {
        let block = vec![1u8; 256 << 20];
        let before = resident_bytes();
        drop(block);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: asks mimalloc to collect and purge what it may; no memory is touched.
        unsafe { libmimalloc_sys::mi_collect(true) };
        before.saturating_sub(resident_bytes())
    }

    #[test]
    fn freed_memory_stays_resident() {
        keep_freed_memory();
        let released = released_after_free();
        assert!(released < 64 << 20, "{released} bytes went back to the OS");
    }
}
