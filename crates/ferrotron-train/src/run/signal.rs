//! Graceful stop on SIGTERM/SIGINT. Schedulers (Slurm, Kubernetes) send SIGTERM before they
//! kill a job; the loop polls this flag between steps, finishes the step in flight, saves a
//! checkpoint and exits 0, so preemption costs at most one step. A second Ctrl-C exits at once.
//! SIGUSR1 stops the same way but never exits at once, however often it comes: it is the
//! signal Slurm's `--signal=USR1@T` sends ahead of a time limit, and the one a rank started by
//! `recipe run --nproc-per-node` receives when its launcher dies (the kernel may deliver that
//! once per thread of the dying launcher).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};

use crate::TrainError;

/// Set when a stop was requested (by a signal or by [`StopFlag::request`]).
#[derive(Debug, Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    /// A flag nothing sets but [`StopFlag::request`] (library use, tests).
    pub fn new() -> Self {
        StopFlag::default()
    }

    /// A flag set by SIGTERM, SIGINT and SIGUSR1; a second SIGINT/SIGTERM while the flag is
    /// already set terminates the process with exit code 130.
    pub fn on_signals() -> Result<Self, TrainError> {
        let flag = StopFlag::new();
        for signal in [SIGINT, SIGTERM] {
            // Order matters: the conditional shutdown checks the flag before the second
            // handler sets it, so only a repeated signal exits immediately.
            signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag.0))
                .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&flag.0)))
                .map_err(|e| TrainError::Config(format!("cannot install signal handlers: {e}")))?;
        }
        signal_hook::flag::register(SIGUSR1, Arc::clone(&flag.0))
            .map_err(|e| TrainError::Config(format!("cannot install signal handlers: {e}")))?;
        Ok(flag)
    }

    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigterm_sets_the_flag() {
        let flag = StopFlag::on_signals().expect("handlers install");
        assert!(!flag.requested());
        signal_hook::low_level::raise(SIGTERM).expect("raise works");
        assert!(flag.requested());
    }

    #[test]
    fn request_sets_the_flag() {
        let flag = StopFlag::new();
        let clone = flag.clone();
        clone.request();
        assert!(flag.requested());
    }
}
