//! Resident memory of this process, the `memory_bytes` a CPU run can report.
//!
//! Read from `/proc/self/status` (`VmRSS`, already in kB) rather than `statm` so no page size, and
//! hence no `libc` call, is needed.

/// Resident set size of this process in bytes; 0 where `/proc` is unavailable (non-Linux).
pub fn process_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| resident_bytes(&status))
        .unwrap_or(0)
}

fn resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let mut fields = line["VmRSS:".len()..].split_whitespace();
    let kibibytes: u64 = fields.next()?.parse().ok()?;
    (fields.next() == Some("kB")).then(|| kibibytes.saturating_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\trecipe\nVmPeak:\t  900 kB\nVmRSS:\t  2048 kB\nThreads:\t3\n";
        assert_eq!(resident_bytes(status), Some(2048 * 1024));
        assert_eq!(resident_bytes("Name:\trecipe\n"), None);
        assert_eq!(resident_bytes("VmRSS:\t12 pages\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_grows_when_it_touches_memory() {
        let before = process_memory_bytes();
        assert!(before > 0);
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = process_memory_bytes();
        assert!(block.iter().all(|&byte| byte == 1));
        assert!(after >= before + (32 << 20), "{before} -> {after}");
    }
}
