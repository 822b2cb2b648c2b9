//! `recipe run --nproc-per-node N`: one process per local rank, started and watched by this one,
//! as torchrun's `--nproc-per-node` does.
//!
//! A GPU rank must be a process of its own (one CUDA context and one communicator each), so a
//! machine of several GPUs needs a launcher; srun is one on clusters, and this is the one for a
//! single machine. The children are `recipe run` itself with torchrun's variables (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), so a child takes exactly the path
//! of a torchrun or srun rank and nothing here knows about training.
//!
//! What the launcher owns is the world's lifetime:
//! - logs: every child's lines reach this terminal whole, rank 0's as they are (it is the rank
//!   that reports) and the others' prefixed `rank N: `;
//! - signals: the children run in a process group of their own, so a Ctrl-C reaches this
//!   process alone, which forwards it to every rank as SIGTERM (each finishes its step, saves
//!   its shard of the checkpoint and exits; a second signal is forwarded again, and the ranks
//!   then exit at once, as a single run does);
//! - its own death: each rank asks the kernel for a SIGUSR1 when the launcher dies
//!   (`PR_SET_PDEATHSIG`), so a SIGKILLed launcher does not leave ranks training unwatched;
//!   they save and exit as on a forwarded signal (SIGUSR1, because the kernel sends it again
//!   for each thread of the dying launcher, and a repeated SIGTERM means "exit now");
//! - failure: when one rank exits unsuccessfully the others normally fail fast on their own
//!   (their connections to it close); any still running after a grace period are killed, and
//!   the launcher exits with the first failing rank's code and says which rank it was.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// Why the local launcher could not start or follow its ranks.
#[derive(Debug, thiserror::Error)]
pub enum LocalLaunchError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the launcher that started this rank (pid {0}) is gone")]
    LauncherGone(i32),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LocalLaunchError {
    let what = what.into();
    move |source| LocalLaunchError::Io { what, source }
}

/// How long the other ranks may take to end on their own once one has failed.
const FAILURE_GRACE: Duration = Duration::from_secs(5);
/// How often the children and the signal flag are looked at.
const POLL: Duration = Duration::from_millis(20);
/// The flag this launcher reads; every other argument goes to the children unchanged.
const FLAG: &str = "--nproc-per-node";
/// Set on every rank the launcher starts: the launcher's pid, for [`follow_launcher`].
const LAUNCHER_PID: &str = "FERROTRON_LAUNCHER_PID";

/// In a rank this launcher started: be sent SIGUSR1 (save and stop) when the launcher dies.
/// Nothing elsewhere.
pub fn follow_launcher() -> Result<(), LocalLaunchError> {
    let Some(launcher) = std::env::var(LAUNCHER_PID)
        .ok()
        .and_then(|pid| pid.parse::<i32>().ok())
    else {
        return Ok(());
    };
    rustix::process::set_parent_process_death_signal(Some(Signal::USR1))
        .map_err(|errno| io("asking to be stopped with the launcher")(errno.into()))?;
    // The launcher may have died before the request took effect: nobody would send it then.
    let parent = Pid::as_raw(rustix::process::getppid());
    if parent != launcher {
        return Err(LocalLaunchError::LauncherGone(launcher));
    }
    Ok(())
}

/// The command line of a child: this process's arguments without `--nproc-per-node`.
pub fn child_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut kept = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == FLAG {
            args.next();
        } else if !arg
            .to_str()
            .is_some_and(|a| a.starts_with(&format!("{FLAG}=")))
        {
            kept.push(arg);
        }
    }
    kept
}

/// Start `nproc` ranks of this program with `args` on this machine, relay their output and
/// signals, and wait for them: the first rank that failed, if one did.
pub fn launch(nproc: u32, args: &[OsString]) -> Result<Option<Failure>, LocalLaunchError> {
    let program =
        std::env::current_exe().map_err(io("finding the recipe binary to start ranks"))?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(io("finding a free port for the ranks' rendezvous"))?
        .port();
    let signalled = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&signalled))
            .map_err(io("installing the SIGTERM/SIGINT handlers"))?;
    }
    let mut ranks = Vec::new();
    for rank in 0..nproc {
        match Rank::start(&program, args, rank, nproc, port) {
            Ok(child) => ranks.push(child),
            Err(err) => {
                for started in &mut ranks {
                    started.signal(Signal::KILL);
                }
                return Err(err);
            }
        }
    }
    let outcome = supervise(&mut ranks, &signalled);
    for rank in ranks {
        rank.finish_output();
    }
    Ok(outcome)
}

/// Of the ranks found failed in one poll (rank order), the one to blame: a rank killed by a
/// signal before one that exited with an error, since a peer's death makes the others exit with
/// an error (a closed connection) within the same poll interval, never die of a signal.
fn root_cause(failed: &[(u32, ExitStatus)]) -> Option<u32> {
    failed
        .iter()
        .find(|(_, status)| status.signal().is_some())
        .or(failed.first())
        .map(|(rank, _)| *rank)
}

/// Wait for every rank; the first unsuccessful one, if any.
fn supervise(ranks: &mut [Rank], signalled: &AtomicBool) -> Option<Failure> {
    let mut first_failure: Option<u32> = None;
    let mut kill_at: Option<Instant> = None;
    while ranks.iter().any(|rank| rank.status.is_none()) {
        if signalled.swap(false, Ordering::SeqCst) {
            for rank in ranks.iter_mut() {
                rank.signal(Signal::TERM);
            }
        }
        let mut failed_now = Vec::new();
        for rank in ranks.iter_mut() {
            let Some(status) = rank.poll() else { continue };
            if !status.success() {
                failed_now.push((rank.rank, status));
            }
        }
        if first_failure.is_none()
            && let Some(rank) = root_cause(&failed_now)
        {
            first_failure = Some(rank);
            kill_at = Some(Instant::now() + FAILURE_GRACE);
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            kill_at = None;
            for rank in ranks.iter_mut().filter(|rank| rank.status.is_none()) {
                rank.signal(Signal::KILL);
                rank.killed_after_grace = true;
            }
        }
        std::thread::sleep(POLL);
    }
    let first = first_failure?;
    let outcome = |rank: &Rank| Outcome {
        rank: rank.rank,
        status: rank.status.unwrap_or_default(),
        killed_after_grace: rank.killed_after_grace,
    };
    Some(Failure {
        first: outcome(&ranks[first as usize]),
        others: ranks
            .iter()
            .filter(|rank| rank.rank != first)
            .map(outcome)
            .collect(),
    })
}

/// One child process and the threads relaying its output.
struct Rank {
    rank: u32,
    child: Child,
    status: Option<ExitStatus>,
    /// Still running when the grace period after another rank's failure ended.
    killed_after_grace: bool,
    relays: Vec<JoinHandle<()>>,
}

impl Rank {
    fn start(
        program: &std::path::Path,
        args: &[OsString],
        rank: u32,
        nproc: u32,
        port: u16,
    ) -> Result<Rank, LocalLaunchError> {
        let (rank_text, size) = (rank.to_string(), nproc.to_string());
        let mut child = Command::new(program)
            .args(args)
            .envs([
                ("RANK", rank_text.as_str()),
                ("LOCAL_RANK", rank_text.as_str()),
                ("WORLD_SIZE", size.as_str()),
                ("LOCAL_WORLD_SIZE", size.as_str()),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.to_string().as_str()),
                (LAUNCHER_PID, std::process::id().to_string().as_str()),
            ])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io(format!("starting rank {rank} ({})", program.display())))?;
        let prefix = if rank == 0 {
            String::new()
        } else {
            format!("rank {rank}: ")
        };
        let mut relays = Vec::new();
        if let Some(out) = child.stdout.take() {
            relays.push(relay(out, prefix.clone(), || Box::new(std::io::stdout())));
        }
        if let Some(err) = child.stderr.take() {
            relays.push(relay(err, prefix, || Box::new(std::io::stderr())));
        }
        Ok(Rank {
            rank,
            child,
            status: None,
            killed_after_grace: false,
            relays,
        })
    }

    /// The exit status once the child has ended (reaped once, then remembered).
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
            return self.status;
        }
        None
    }

    fn signal(&mut self, signal: Signal) {
        if self.status.is_none() {
            // The child may have exited since the last poll; the next poll reaps it.
            let _ = kill_process(Pid::from_child(&self.child), signal);
        }
    }

    fn finish_output(self) {
        for relay in self.relays {
            let _ = relay.join();
        }
    }
}

/// Copy `source` to the sink line by line, each line whole and prefixed (a rank's own lines
/// that already carry its prefix keep theirs once).
fn relay(
    source: impl Read + Send + 'static,
    prefix: String,
    sink: fn() -> Box<dyn Write>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let mut out = sink();
            let prefixed = prefix.is_empty() || line.starts_with(prefix.as_bytes());
            // A closed terminal or pipe: the rank still runs; its lines have nowhere to go.
            let _ = if prefixed {
                out.write_all(&line)
            } else {
                out.write_all(prefix.as_bytes())
                    .and_then(|()| out.write_all(&line))
            };
            let _ = out.flush();
        }
    })
}

/// How one rank ended.
#[derive(Debug)]
struct Outcome {
    rank: u32,
    status: ExitStatus,
    killed_after_grace: bool,
}

impl Outcome {
    fn describe(&self) -> String {
        let rank = self.rank;
        if self.killed_after_grace {
            return format!(
                "rank {rank} was still running after {}s and was killed",
                FAILURE_GRACE.as_secs()
            );
        }
        match (self.status.code(), self.status.signal()) {
            (Some(0), _) => format!("rank {rank} finished"),
            (Some(code), _) => format!("rank {rank} exited with code {code}"),
            (None, Some(signal)) => format!("rank {rank} was killed by signal {signal}"),
            (None, None) => format!("rank {rank} ended abnormally"),
        }
    }
}

/// The first rank that did not exit successfully, and how the others ended.
#[derive(Debug)]
pub struct Failure {
    first: Outcome,
    others: Vec<Outcome>,
}

impl Failure {
    pub fn describe(&self) -> String {
        let others: Vec<String> = self.others.iter().map(Outcome::describe).collect();
        format!("{}; then {}", self.first.describe(), others.join(", "))
    }

    /// The failing rank's own exit code; none for a rank killed by a signal.
    pub fn code(&self) -> Option<u8> {
        self.first
            .status
            .code()
            .and_then(|code| u8::try_from(code).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_rank_killed_by_a_signal_is_blamed_before_one_that_exited_in_the_same_poll() {
        let (exited, killed) = (ExitStatus::from_raw(1 << 8), ExitStatus::from_raw(9));
        assert_eq!(root_cause(&[(0, exited), (1, killed)]), Some(1));
        assert_eq!(root_cause(&[(0, exited), (2, exited)]), Some(0));
        assert_eq!(root_cause(&[]), None);
    }

    #[test]
    fn the_flag_is_taken_out_of_the_childrens_arguments() {
        assert_eq!(
            child_args(args(&["run", "r.yaml", "--nproc-per-node", "4", "--force"])),
            args(&["run", "r.yaml", "--force"])
        );
        assert_eq!(
            child_args(args(&["run", "--nproc-per-node=2", "r.yaml"])),
            args(&["run", "r.yaml"])
        );
    }

    #[test]
    fn a_failure_says_which_rank_and_keeps_its_code() {
        let outcome = |rank: u32, raw: i32, killed_after_grace: bool| Outcome {
            rank,
            status: ExitStatus::from_raw(raw),
            killed_after_grace,
        };
        let diverged = Failure {
            first: outcome(1, 3 << 8, false),
            others: vec![outcome(0, 1 << 8, false)],
        };
        assert_eq!(diverged.code(), Some(3));
        assert_eq!(
            diverged.describe(),
            "rank 1 exited with code 3; then rank 0 exited with code 1"
        );
        let killed = Failure {
            first: outcome(1, 9, false),
            others: vec![outcome(0, 0, false), outcome(2, 9, true)],
        };
        assert_eq!(killed.code(), None);
        assert_eq!(
            killed.describe(),
            "rank 1 was killed by signal 9; then rank 0 finished, rank 2 was still running after \
             5s and was killed"
        );
    }
}
