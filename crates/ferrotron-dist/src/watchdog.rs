//! One watchdog per process: the thing that guarantees a multi-rank run never waits without a
//! deadline.
//!
//! A TCP collective has its own deadline, but a GPU rank mostly waits where no deadline can be
//! passed: inside `cuStreamSynchronize` behind a NCCL kernel whose peer died or stopped. NCCL's
//! documented way out is another thread calling `ncclCommAbort`, which releases the stuck
//! kernel. That thread is this one. It watches
//! - every communicator's health ([`Watched`]): a peer's abort frame or NCCL's asynchronous
//!   error fails the world at once; a peer whose connection closed fails it while this process
//!   waits for anything (a peer that exits after the last collective is the normal end of a
//!   run, not a failure);
//! - every host wait in flight ([`Watchdog::waiting`]) against the distributed timeout
//!   (`parallel.distributed_timeout_minutes`, Megatron's `--distributed-timeout-minutes`); the
//!   deadline counts only waiting, so a rank busy with long host work (hashing a checkpoint)
//!   never trips its own, and its peers wait for it up to the timeout;
//! - the peers' heartbeats (sent by the TCP mesh every second from a thread of their own), so
//!   a timeout names the rank that stopped responding rather than only "it did not finish".
//!
//! On a failure it aborts every communicator of the process with the reason (the TCP mesh
//! forwards it to the peers, naming this rank). If the process is still alive [`STUCK_GRACE`]
//! after that, something holds it that the abort cannot release (a kernel that is not NCCL's, a
//! rank hung in its own work), and the watchdog ends the process with the reason: a rank ends,
//! it never hangs. A panic hook ([`abort_on_panic`])
//! aborts the world too, so a panicking rank's peers learn why at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

/// How long a process may live on after its world was aborted before the watchdog ends it.
pub const STUCK_GRACE: Duration = Duration::from_secs(10);
/// How long an ending process may take to exit before it is aborted (SIGABRT): a stuck
/// handler that ends the process with [`end_process`] never needs it.
const LAST_RESORT: Duration = Duration::from_secs(5);
/// How often the watchdog looks.
const PERIOD: Duration = Duration::from_millis(50);
/// A peer silent for this long is named as stalled when a deadline passes.
pub const SILENT_AFTER: Duration = Duration::from_secs(5);

/// What a communicator reports to the watchdog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Fine,
    /// A peer's connection ended: a failure only while this process waits for something.
    PeerGone(String),
    /// The world is failing (a peer's abort, NCCL's asynchronous error).
    Failed(String),
}

/// A communicator the watchdog watches and aborts.
pub trait Watched: Send + Sync {
    fn health(&self) -> Health;
    /// Fails every wait on it, now and later, with `reason` (idempotent; callable from another
    /// thread while one is blocked in it).
    fn abort(&self, reason: &str);
    /// Peers not heard from for at least `quiet`, with how long they have been silent.
    fn silent_peers(&self, _quiet: Duration) -> Vec<(u32, Duration)> {
        Vec::new()
    }
    /// Tells the peers this rank is done (its run ended): its leaving is not their failure.
    fn leave(&self) {}
}

/// What the watchdog does with a process that outlived the abort: by default, print the reason
/// and exit 1; the CLI puts its own message here.
pub type StuckHandler = Box<dyn Fn(&str) + Send + Sync>;

struct Wait {
    what: String,
    since: Instant,
}

#[derive(Default)]
struct State {
    watched: Vec<Weak<dyn Watched>>,
    waits: BTreeMap<u64, Wait>,
    next_wait: u64,
    /// The first failure's reason and when the world was aborted for it.
    failed: Option<(String, Instant)>,
    thread: bool,
}

/// The process's watchdog ([`global`]); tests make their own.
pub struct Watchdog {
    state: Mutex<State>,
    changed: Condvar,
    armed: AtomicBool,
    timeout_ms: std::sync::atomic::AtomicU64,
    rank: AtomicU32,
    on_stuck: Mutex<Option<StuckHandler>>,
    stuck_grace: Duration,
    /// How long an ending process may take before it is aborted; `None` in tests.
    last_resort: Option<Duration>,
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog {
            state: Mutex::default(),
            changed: Condvar::new(),
            armed: AtomicBool::new(false),
            timeout_ms: std::sync::atomic::AtomicU64::new(crate::DEFAULT_TIMEOUT.as_millis() as u64),
            rank: AtomicU32::new(0),
            on_stuck: Mutex::new(None),
            stuck_grace: STUCK_GRACE,
            last_resort: Some(LAST_RESORT),
        }
    }
}

/// The watchdog of this process.
pub fn global() -> &'static Arc<Watchdog> {
    static GLOBAL: OnceLock<Arc<Watchdog>> = OnceLock::new();
    GLOBAL.get_or_init(|| Arc::new(Watchdog::default()))
}

/// A host wait in flight; dropping it ends the wait.
#[must_use = "the wait is watched while this lives"]
pub struct Waiting<'a> {
    dog: Option<(&'a Watchdog, u64)>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some((dog, id)) = self.dog {
            dog.lock().waits.remove(&id);
            dog.changed.notify_all();
        }
    }
}

impl Watchdog {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching (idempotent): this process is `rank` of a world whose waits end after
    /// `timeout`. Until armed, waits are not tracked and nothing is polled.
    pub fn arm(self: &Arc<Self>, rank: u32, timeout: Duration) {
        self.rank.store(rank, Ordering::Relaxed);
        self.set_timeout(timeout);
        self.armed.store(true, Ordering::Release);
        let mut state = self.lock();
        if !state.thread {
            state.thread = true;
            let dog = Arc::downgrade(self);
            std::thread::Builder::new()
                .name("ferrotron-watchdog".to_owned())
                .spawn(move || watch_loop(&dog))
                .expect("the watchdog thread starts");
        }
    }

    /// Whether [`Watchdog::arm`] was called.
    pub fn armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Replaces what happens to a wait still blocked [`STUCK_GRACE`] after the abort.
    pub fn on_stuck(&self, handler: StuckHandler) {
        *self.on_stuck.lock().unwrap_or_else(PoisonError::into_inner) = Some(handler);
    }

    /// Watches `comm` until it is dropped, and aborts it with the others.
    pub fn watch(&self, comm: Weak<dyn Watched>) {
        let mut state = self.lock();
        state.watched.retain(|w| w.strong_count() > 0);
        state.watched.push(comm);
    }

    /// Marks a host wait (`what`, e.g. "copying the loss to the host") in flight until the
    /// returned guard drops; nothing when the watchdog is not armed.
    pub fn waiting(&self, what: impl Into<String>) -> Waiting<'_> {
        if !self.armed() {
            return Waiting { dog: None };
        }
        let mut state = self.lock();
        let id = state.next_wait;
        state.next_wait += 1;
        state.waits.insert(
            id,
            Wait {
                what: what.into(),
                since: Instant::now(),
            },
        );
        Waiting {
            dog: Some((self, id)),
        }
    }

    /// This rank's run ended: the peers are told (a rank that finishes while another still
    /// writes its last checkpoint is no failure of that one), and the watchdog stops watching.
    pub fn leave(&self) {
        self.armed.store(false, Ordering::Release);
        let watched: Vec<Arc<dyn Watched>> = {
            let state = self.lock();
            state.watched.iter().filter_map(Weak::upgrade).collect()
        };
        for comm in watched {
            comm.leave();
        }
    }

    /// Why the world failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.lock()
            .failed
            .as_ref()
            .map(|(reason, _)| reason.clone())
    }

    /// Fails the world: every watched communicator is aborted with `reason` (the first reason
    /// is kept; later calls abort again, which is harmless). An armed watchdog also starts the
    /// reaper: if the process still lives [`STUCK_GRACE`] later, it is ended. The reaper is a
    /// thread of its own because an abort may itself block (a NCCL abort behind a stuck
    /// stream), and nothing may keep the process from ending.
    pub fn abort_all(self: &Arc<Self>, reason: &str) {
        let (watched, first) = {
            let mut state = self.lock();
            let first = state.failed.is_none();
            if first {
                state.failed = Some((reason.to_owned(), Instant::now()));
            }
            state.watched.retain(|w| w.strong_count() > 0);
            let watched: Vec<Arc<dyn Watched>> =
                state.watched.iter().filter_map(Weak::upgrade).collect();
            (watched, first)
        };
        if first && self.armed() {
            let dog = Arc::downgrade(self);
            let grace = self.stuck_grace;
            let _ = std::thread::Builder::new()
                .name("ferrotron-watchdog-reaper".to_owned())
                .spawn(move || {
                    std::thread::sleep(grace);
                    if let Some(dog) = dog.upgrade() {
                        dog.stuck(&dog.stuck_reason());
                    }
                });
        }
        let reason = self.failure().unwrap_or_else(|| reason.to_owned());
        for comm in watched {
            comm.abort(&reason);
        }
        self.changed.notify_all();
    }

    /// Why a process alive after the grace is being ended: the failure, and what holds it.
    fn stuck_reason(&self) -> String {
        let state = self.lock();
        let reason = state
            .failed
            .as_ref()
            .map_or_else(String::new, |(reason, _)| reason.clone());
        let still = match state.waits.values().min_by_key(|w| w.since) {
            Some(wait) => format!("{} did not return after the abort", wait.what),
            None => format!("the rank did not end within {:?}", self.stuck_grace),
        };
        format!("{reason} ({still})")
    }

    /// One look: the failure to abort for, if any.
    fn inspect(&self) -> Verdict {
        let (watched, oldest, failed) = {
            let mut state = self.lock();
            state.watched.retain(|w| w.strong_count() > 0);
            let watched: Vec<_> = state.watched.iter().filter_map(Weak::upgrade).collect();
            let oldest = state
                .waits
                .values()
                .min_by_key(|w| w.since)
                .map(|w| (w.what.clone(), w.since));
            (watched, oldest, state.failed.clone())
        };
        if failed.is_some() {
            // Aborted already; the reaper ends the process if it does not end by itself.
            return Verdict::Fine;
        }
        for comm in &watched {
            match comm.health() {
                Health::Failed(reason) => return Verdict::Abort(reason),
                Health::PeerGone(reason) if oldest.is_some() => return Verdict::Abort(reason),
                _ => {}
            }
        }
        let timeout = self.timeout();
        match oldest {
            Some((what, since)) if since.elapsed() >= timeout => {
                let silent: Vec<(u32, Duration)> = watched
                    .iter()
                    .flat_map(|comm| comm.silent_peers(SILENT_AFTER))
                    .collect();
                Verdict::Abort(timeout_reason(
                    self.rank.load(Ordering::Relaxed),
                    &what,
                    timeout,
                    &silent,
                ))
            }
            _ => Verdict::Fine,
        }
    }

    fn stuck(&self, reason: &str) {
        // `exit` runs the CUDA driver's teardown, which could itself wait on the blocked
        // stream: if the process still lives a few seconds on, it is aborted.
        if let Some(after) = self.last_resort {
            let _ = std::thread::Builder::new()
                .name("ferrotron-watchdog-last-resort".to_owned())
                .spawn(move || {
                    std::thread::sleep(after);
                    std::process::abort();
                });
        }
        let handler = self.on_stuck.lock().unwrap_or_else(PoisonError::into_inner);
        match handler.as_ref() {
            Some(handler) => handler(reason),
            None => {
                eprintln!("error: {reason}");
                end_process(1);
            }
        }
    }
}

enum Verdict {
    Fine,
    Abort(String),
}

/// "rank 0 waited 600s for …; rank 3 has been silent for 598s (stopped or hung)".
fn timeout_reason(rank: u32, what: &str, timeout: Duration, silent: &[(u32, Duration)]) -> String {
    let mut silent = silent.to_vec();
    silent.sort_by_key(|&(peer, _)| peer);
    silent.dedup_by_key(|(peer, _)| *peer);
    let blame = if silent.is_empty() {
        "every peer is alive (a rank may be in long host work or issue another collective)"
            .to_owned()
    } else {
        let names: Vec<String> = silent
            .iter()
            .map(|(peer, quiet)| format!("rank {peer} has been silent for {}s", quiet.as_secs()))
            .collect();
        format!("{} (stopped or hung)", names.join(", "))
    };
    format!(
        "rank {rank} waited {timeout:?} (parallel.distributed_timeout_minutes) for {what}; {blame}"
    )
}

fn watch_loop(dog: &Weak<Watchdog>) {
    loop {
        let Some(dog) = dog.upgrade() else { return };
        if !dog.armed() {
            return;
        }
        if let Verdict::Abort(reason) = dog.inspect() {
            tracing::error!(reason, "the watchdog aborts this rank's communicators");
            dog.abort_all(&reason);
        }
        let state = dog.lock();
        let _ = dog
            .changed
            .wait_timeout(state, PERIOD)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// Chains a panic hook that aborts the world with the panic's message and location, so the
/// peers of a panicking rank stop at once naming it (its own catch turns the panic into the
/// run's error as before).
pub fn abort_on_panic(dog: &'static Arc<Watchdog>) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if dog.armed() {
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            let place = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            dog.abort_all(&format!("panicked{place}: {message}"));
        }
        previous(info);
    }));
}

#[cfg(test)]
#[path = "watchdog_tests.rs"]
mod tests;

/// Ends a stuck process with `code` at once. `std::process::exit` runs the exit handlers,
/// among them the CUDA driver's teardown, which waits for a stream the abort could not release
/// (measured on an H100: the process then lives until [`LAST_RESORT`] aborts it, SIGABRT
/// instead of `code`); `_exit` hands the process to the kernel, which frees the device.
pub fn end_process(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    #[allow(unsafe_code)]
    // SAFETY: `_exit` takes no pointers and never returns; nothing after it runs.
    unsafe {
        libc::_exit(code)
    }
}
