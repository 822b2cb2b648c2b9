//! How the processes of a [`crate::TcpComm`] world talk once they found each other
//! (`crate::tcp_comm_rendezvous`): a full mesh of one TCP connection per pair, which suits the
//! small CPU worlds this serves and keeps collectives direct (no ring to stall on a slow
//! member).
//!
//! One reader thread per connection drains frames into per-(group, channel, sender) queues as
//! they come, so a send never waits for the receiver to post its receive: no schedule can
//! deadlock on socket buffers, and frames from different groups cannot overtake each other's
//! order. A connection that ends marks that peer closed; a wait on a closed peer with an empty
//! queue fails at once (a dead process is an error, not a hang), and an `Abort` frame from a
//! failing peer fails every wait of the world.
//!
//! A thread of its own sends every peer a heartbeat each [`HEARTBEAT`], and the readers note
//! when each peer was last heard, so the process watchdog (`crate::watchdog`) can name a peer
//! that stopped (`SIGSTOP`, a hung kernel driver, a swapped-out node) when a deadline passes:
//! a busy rank still beats, a stopped one does not.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::tcp_comm::TcpConfig;
use crate::tcp_comm_rendezvous::{TcpError, form};
use crate::tcp_comm_wire::{Channel, Frame, Header};
use crate::watchdog::{Health, Watched};

/// How often a process tells its peers it is alive.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// Why a wait for a frame ended without one.
pub(crate) enum WaitError {
    TimedOut,
    /// The peer's connection ended (the text says how).
    Closed(String),
    /// The world is failing (the text says which rank and why).
    Aborted(String),
}

type QueueKey = (u64, Channel, u32);

#[derive(Default)]
struct InboxState {
    queues: HashMap<QueueKey, VecDeque<Frame>>,
    closed: HashMap<u32, String>,
    aborted: Option<String>,
    /// When each peer's last frame (of any kind) arrived.
    heard: HashMap<u32, Instant>,
    /// Peers that said they are done (a `Bye`): their connection closing is the end of a run.
    left: std::collections::HashSet<u32>,
}

/// Frames received and not yet consumed, shared with the reader threads.
#[derive(Default)]
struct Inbox {
    state: Mutex<InboxState>,
    changed: Condvar,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut InboxState)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }
}

struct Link {
    writer: Mutex<TcpStream>,
    /// A handle for shutting the connection down when the world is dropped.
    control: TcpStream,
}

/// One process's end of a world: a connection per peer and the frames that came in.
pub(crate) struct Mesh {
    pub rank: u32,
    pub world_size: u32,
    pub timeout: Duration,
    links: Vec<Option<Link>>,
    inbox: Arc<Inbox>,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.leave();
        for link in self.links.iter().flatten() {
            let _ = link.control.shutdown(Shutdown::Both);
        }
    }
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mesh(rank {} of {})", self.rank, self.world_size)
    }
}

impl Mesh {
    /// Writes one whole frame to `peer` (global rank).
    pub(crate) fn send(&self, peer: u32, frame: &[u8]) -> Result<(), String> {
        let Some(Some(link)) = self.links.get(peer as usize) else {
            return Err(format!(
                "rank {peer} has no connection from rank {}",
                self.rank
            ));
        };
        let mut writer = link.writer.lock().unwrap_or_else(PoisonError::into_inner);
        writer.write_all(frame).map_err(|e| lost_peer(peer, &e))
    }

    /// The next frame of `group` on `channel` from `peer`, waiting until `deadline`.
    pub(crate) fn take(
        &self,
        group: u64,
        channel: Channel,
        peer: u32,
        deadline: Instant,
    ) -> Result<Frame, WaitError> {
        let mut state = self.inbox.lock();
        loop {
            if let Some(frame) = state
                .queues
                .get_mut(&(group, channel, peer))
                .and_then(VecDeque::pop_front)
            {
                return Ok(frame);
            }
            if let Some(reason) = &state.aborted {
                return Err(WaitError::Aborted(reason.clone()));
            }
            if let Some(reason) = state.closed.get(&peer) {
                return Err(WaitError::Closed(reason.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::TimedOut);
            }
            state = self
                .inbox
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Of `peers`, those with nothing queued for `group` on `channel` (who did not arrive).
    pub(crate) fn missing(&self, group: u64, channel: Channel, peers: &[u32]) -> Vec<u32> {
        let state = self.inbox.lock();
        peers
            .iter()
            .copied()
            .filter(|&peer| {
                state
                    .queues
                    .get(&(group, channel, peer))
                    .is_none_or(VecDeque::is_empty)
            })
            .collect()
    }

    /// Fails every wait in this process and tells every peer (best effort) why.
    pub(crate) fn abort(&self, reason: &str) {
        let first = {
            let mut state = self.inbox.lock();
            let first = state.aborted.is_none();
            state.aborted.get_or_insert_with(|| reason.to_owned());
            first
        };
        self.inbox.changed.notify_all();
        if !first {
            return;
        }
        self.tell_everyone(Channel::Abort, reason.as_bytes());
    }

    /// Sends a frame of `channel` (outside any group) with `payload` to every peer, best effort.
    fn tell_everyone(&self, channel: Channel, payload: &[u8]) {
        let header = Header {
            channel,
            group: 0,
            signature: crate::rendezvous::Signature {
                op: "barrier",
                dtype: None,
                len: None,
                reduce: None,
                root: None,
            },
            count: 0,
            payload_bytes: payload.len() as u64,
        };
        let mut frame = header.frame();
        frame.extend_from_slice(payload);
        for peer in 0..self.world_size {
            if peer != self.rank {
                let _ = self.send(peer, &frame);
            }
        }
    }

    /// Tells every peer this process is done with the world (once; again is harmless), so its
    /// connection closing next is not taken for a failure.
    pub(crate) fn leave(&self) {
        self.tell_everyone(Channel::Bye, &[]);
    }

    /// Beats every [`HEARTBEAT`] until the mesh is dropped (from a thread of its own).
    pub(crate) fn beat_while_alive(mesh: std::sync::Weak<Mesh>) {
        let _ = thread::Builder::new()
            .name("tcp-comm-heartbeat".to_owned())
            .spawn(move || {
                while let Some(mesh) = mesh.upgrade() {
                    mesh.tell_everyone(Channel::Heartbeat, &[]);
                    drop(mesh);
                    thread::sleep(HEARTBEAT);
                }
            });
    }

    /// Why this process's world is failing, if it is.
    pub(crate) fn aborted(&self) -> Option<String> {
        self.inbox.lock().aborted.clone()
    }
}

impl Watched for Mesh {
    fn health(&self) -> Health {
        let state = self.inbox.lock();
        if let Some(reason) = &state.aborted {
            return Health::Failed(reason.clone());
        }
        match state
            .closed
            .iter()
            .filter(|(peer, _)| !state.left.contains(peer))
            .min_by_key(|(peer, _)| **peer)
        {
            Some((_, reason)) => Health::PeerGone(reason.clone()),
            None => Health::Fine,
        }
    }

    /// The peers' readers say which rank the reason came from.
    fn abort(&self, reason: &str) {
        Mesh::abort(self, reason);
    }

    fn leave(&self) {
        Mesh::leave(self);
    }

    fn silent_peers(&self, quiet: Duration) -> Vec<(u32, Duration)> {
        let state = self.inbox.lock();
        state
            .heard
            .iter()
            .filter(|(peer, _)| !state.closed.contains_key(peer))
            .map(|(&peer, at)| (peer, at.elapsed()))
            .filter(|(_, silent)| *silent >= quiet)
            .collect()
    }
}

/// Forms the world: rendezvous, mesh, reader threads.
pub(crate) fn connect(config: &TcpConfig, listener: Option<TcpListener>) -> Result<Mesh, TcpError> {
    let (rank, world_size) = (config.rank, config.world_size);
    if rank >= world_size {
        return Err(TcpError::BadRank { rank, world_size });
    }
    let address = format!("{}:{}", config.master_addr, config.master_port);
    let streams = form(config, &address, listener)?;
    let inbox = Arc::new(Inbox::default());
    let now = Instant::now();
    inbox.update(|state| {
        state.heard = (0..world_size)
            .filter(|&p| p != rank)
            .map(|p| (p, now))
            .collect();
    });
    let mut links = Vec::with_capacity(streams.len());
    for (peer, stream) in streams.into_iter().enumerate() {
        let Some(stream) = stream else {
            links.push(None);
            continue;
        };
        let io_error = |source| TcpError::Io {
            address: address.clone(),
            peer: peer as u32,
            source,
        };
        stream.set_nodelay(true).map_err(io_error)?;
        stream.set_read_timeout(None).map_err(io_error)?;
        stream
            .set_write_timeout(Some(config.timeout))
            .map_err(io_error)?;
        let reader = stream.try_clone().map_err(io_error)?;
        let control = stream.try_clone().map_err(io_error)?;
        let inbox = inbox.clone();
        thread::Builder::new()
            .name(format!("tcp-comm-rx-{peer}"))
            .spawn(move || read_frames(reader, peer as u32, &inbox))
            .map_err(io_error)?;
        links.push(Some(Link {
            writer: Mutex::new(stream),
            control,
        }));
    }
    Ok(Mesh {
        rank,
        world_size,
        timeout: config.timeout,
        links,
        inbox,
    })
}

/// What a failed read or write of `peer`'s connection says. A peer that exits closes its end;
/// one that is killed may leave unread data behind, and then the kernel resets the connection;
/// a write racing the peer's death finds the pipe broken. All three are the peer gone.
fn lost_peer(peer: u32, e: &io::Error) -> String {
    if matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    ) {
        format!("rank {peer} closed its connection (exited or failed)")
    } else {
        format!("the connection to rank {peer} failed: {e}")
    }
}

/// A reader thread: frames from `peer` into the inbox until the connection ends.
fn read_frames(mut stream: TcpStream, peer: u32, inbox: &Inbox) {
    let reason = loop {
        let header = match Header::read(&mut stream) {
            Ok(header) => header,
            Err(e) => break lost_peer(peer, &e),
        };
        let mut payload = vec![0u8; header.payload_bytes as usize];
        if let Err(e) = stream.read_exact(&mut payload) {
            break format!("the connection to rank {peer} failed mid-message: {e}");
        }
        if header.channel == Channel::Bye {
            inbox.update(|state| {
                state.left.insert(peer);
            });
            continue;
        }
        if header.channel == Channel::Heartbeat {
            inbox.update(|state| {
                state.heard.insert(peer, Instant::now());
            });
            continue;
        }
        if header.channel == Channel::Abort {
            let why = String::from_utf8_lossy(&payload).into_owned();
            inbox.update(|state| {
                state
                    .aborted
                    .get_or_insert_with(|| format!("rank {peer} failed: {why}"));
            });
            continue;
        }
        let key = (header.group, header.channel, peer);
        inbox.update(|state| {
            state.heard.insert(peer, Instant::now());
            state
                .queues
                .entry(key)
                .or_default()
                .push_back(Frame { header, payload })
        });
    };
    inbox.update(|state| {
        state.closed.entry(peer).or_insert(reason);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gone_reads_the_same_whether_read_or_written() {
        for kind in [
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
        ] {
            assert_eq!(
                lost_peer(3, &io::Error::from(kind)),
                "rank 3 closed its connection (exited or failed)"
            );
        }
        let other = lost_peer(3, &io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(
            other.starts_with("the connection to rank 3 failed: "),
            "{other}"
        );
    }
}
