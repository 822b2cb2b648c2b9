//! The memory a rank reports as `memory_bytes` (progress line, `/metrics`, JSONL): on the CPU the
//! process's resident memory, on a GPU the device memory its tensors hold. Telemetry does not
//! know the backends, so the launcher hands the loop a [`MemoryProbe`] for the device it chose.
//!
//! Resident memory is read from `/proc/self/status` (`VmRSS`, already in kB) rather than `statm`
//! so no page size, and hence no `libc` call, is needed.

use std::fmt;
use std::sync::Arc;

/// How to read the memory in use by this rank, at every logged step.
#[derive(Clone)]
pub struct MemoryProbe {
    what: &'static str,
    read: Arc<dyn Fn() -> u64 + Send + Sync>,
    device: Option<DeviceMemory>,
}

/// Free and total bytes of a rank's GPU as the driver sees them (what NCCL's buffers and the
/// allocator's pool leave), read where a run wants them logged (around its first step: issue
/// 44, NCCL allocating its connections while the pool holds the device).
#[derive(Clone)]
struct DeviceMemory {
    rank: u32,
    read: Arc<dyn Fn() -> Option<(u64, u64)> + Send + Sync>,
}

impl MemoryProbe {
    /// This process's resident memory (the CPU backend's tensors live there).
    pub fn process() -> MemoryProbe {
        MemoryProbe::new("process resident memory", process_memory_bytes)
    }

    /// `read` (cheap: called at every logged step), described as `what`.
    pub fn new(what: &'static str, read: impl Fn() -> u64 + Send + Sync + 'static) -> MemoryProbe {
        MemoryProbe {
            what,
            read: Arc::new(read),
            device: None,
        }
    }

    /// This probe, also reading the free and total bytes of global rank `rank`'s GPU
    /// (`read`: `None` when the driver cannot tell) for [`MemoryProbe::log_device`].
    pub fn with_device(
        self,
        rank: u32,
        read: impl Fn() -> Option<(u64, u64)> + Send + Sync + 'static,
    ) -> MemoryProbe {
        MemoryProbe {
            device: Some(DeviceMemory {
                rank,
                read: Arc::new(read),
            }),
            ..self
        }
    }

    /// Logs the GPU's free and total memory at info level, saying `when`; nothing without a
    /// GPU. Reading it does not wait for the device.
    pub fn log_device(&self, when: &str) {
        let Some(device) = &self.device else {
            return;
        };
        if let Some((free, total)) = (device.read)() {
            tracing::info!(
                rank = device.rank,
                free_mib = free >> 20,
                total_mib = total >> 20,
                "device memory {when}"
            );
        }
    }

    pub fn bytes(&self) -> u64 {
        (self.read)()
    }

    pub fn what(&self) -> &'static str {
        self.what
    }
}

impl fmt::Debug for MemoryProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryProbe({})", self.what)
    }
}

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
    fn only_a_probe_with_a_device_reads_it_when_logging() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let reads = Arc::new(AtomicU32::new(0));
        MemoryProbe::new("fixed", || 42).log_device("before the first step");
        let counted = reads.clone();
        let probe = MemoryProbe::new("fixed", || 42).with_device(3, move || {
            counted.fetch_add(1, Ordering::Relaxed);
            Some((1 << 30, 80 << 30))
        });
        probe.log_device("before the first step");
        probe.clone().log_device("after queueing the first step");
        assert_eq!(reads.load(Ordering::Relaxed), 2);
        assert_eq!(probe.bytes(), 42);
    }

    #[test]
    fn a_probe_reads_what_it_was_given() {
        let probe = MemoryProbe::new("fixed", || 42);
        assert_eq!((probe.bytes(), probe.what()), (42, "fixed"));
        assert_eq!(format!("{probe:?}"), "MemoryProbe(fixed)");
        assert!(MemoryProbe::process().bytes() > 0 || !cfg!(target_os = "linux"));
    }

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
