//! How the processes of a [`crate::TcpComm`] world find each other and talk.
//!
//! Rendezvous is torchrun's: rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank
//! opens a listener of its own on any free port, connects to rank 0 (retrying until rank 0 is
//! up) and says who it is; rank 0 answers everyone with the table of addresses (each rank's as
//! rank 0 saw it, so the interface that routes is the one used); then rank `i` connects to
//! every rank `0 < j < i` and accepts the ranks above it. The result is a full mesh of one TCP
//! connection per pair, which suits the small CPU worlds this serves and keeps collectives
//! direct (no ring to stall on a slow member).
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
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::tcp_comm::TcpConfig;
use crate::tcp_comm_wire::{Channel, Frame, Header, MAGIC, VERSION};
use crate::watchdog::{Health, Watched};

/// How often a process tells its peers it is alive.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// Why a TCP world could not be formed.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    #[error("rank {rank} is outside a world of {world_size}")]
    BadRank { rank: u32, world_size: u32 },
    #[error("rank 0 cannot listen on port {port}: {source}")]
    Listen { port: u16, source: io::Error },
    #[error("cannot resolve the master address {address}: {source}")]
    Resolve { address: String, source: io::Error },
    #[error(
        "rank {rank} could not reach rank 0 at {address} within {after:?} (is rank 0 running? MASTER_ADDR/MASTER_PORT agree?): {source}"
    )]
    Unreachable {
        rank: u32,
        address: String,
        after: Duration,
        source: io::Error,
    },
    #[error(
        "rendezvous at {address} timed out after {after:?}: {} did not connect",
        crate::error::RankList(missing)
    )]
    Timeout {
        address: String,
        after: Duration,
        missing: Vec<u32>,
    },
    #[error("rendezvous at {address}: {detail}")]
    Protocol { address: String, detail: String },
    #[error("rendezvous at {address}: connection to rank {peer} failed: {source}")]
    Io {
        address: String,
        peer: u32,
        source: io::Error,
    },
}

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
    let streams = if world_size == 1 {
        vec![None]
    } else if rank == 0 {
        let listener = match listener {
            Some(listener) => listener,
            None => TcpListener::bind(("0.0.0.0", config.master_port)).map_err(|source| {
                TcpError::Listen {
                    port: config.master_port,
                    source,
                }
            })?,
        };
        serve(config, &address, &listener)?
    } else {
        join(config, &address)?
    };
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

/// The greeting a rank sends on every connection it opens.
struct Hello {
    world_size: u32,
    rank: u32,
    /// The port of the sender's own listener (0 when sent to a peer other than rank 0).
    port: u16,
}

impl Hello {
    fn write(&self, stream: &mut TcpStream) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(18);
        for word in [MAGIC, VERSION, self.world_size, self.rank] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(&self.port.to_le_bytes());
        stream.write_all(&bytes)
    }

    /// `Ok(None)` for a connection that does not speak this protocol (a stray client).
    fn read(stream: &mut TcpStream) -> io::Result<Option<Hello>> {
        let mut bytes = [0u8; 18];
        stream.read_exact(&mut bytes)?;
        let word = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&bytes[4 * i..4 * i + 4]);
            u32::from_le_bytes(w)
        };
        if word(0) != MAGIC || word(1) != VERSION {
            return Ok(None);
        }
        Ok(Some(Hello {
            world_size: word(2),
            rank: word(3),
            port: u16::from_le_bytes([bytes[16], bytes[17]]),
        }))
    }
}

/// Accepts one connection, polling so the wait is bounded by `deadline`.
fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                return Ok(Some((stream, peer)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads the greeting of a connection just accepted, bounded by a few seconds.
fn greeting(stream: &mut TcpStream, world_size: u32) -> Result<Option<Hello>, String> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let hello = match Hello::read(stream) {
        Ok(Some(hello)) => hello,
        Ok(None) | Err(_) => return Ok(None),
    };
    if hello.world_size != world_size {
        return Err(format!(
            "rank {} was started with a world of {}, this one has {world_size} ranks",
            hello.rank, hello.world_size
        ));
    }
    if hello.rank == 0 || hello.rank >= world_size {
        return Err(format!(
            "a peer claims rank {} in a world of {world_size}",
            hello.rank
        ));
    }
    Ok(Some(hello))
}

/// Rank 0: wait for every other rank, then send everyone the address table.
fn serve(
    config: &TcpConfig,
    address: &str,
    listener: &TcpListener,
) -> Result<Vec<Option<TcpStream>>, TcpError> {
    let n = config.world_size as usize;
    let deadline = Instant::now() + config.connect_timeout;
    let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut table: Vec<Option<SocketAddr>> = vec![None; n];
    let protocol = |detail: String| TcpError::Protocol {
        address: address.to_owned(),
        detail,
    };
    while streams.iter().skip(1).any(Option::is_none) {
        let accepted = accept_until(listener, deadline).map_err(|source| TcpError::Listen {
            port: config.master_port,
            source,
        })?;
        let Some((mut stream, peer_addr)) = accepted else {
            let missing = (1..n)
                .filter(|&r| streams[r].is_none())
                .map(|r| r as u32)
                .collect();
            return Err(TcpError::Timeout {
                address: address.to_owned(),
                after: config.connect_timeout,
                missing,
            });
        };
        let Some(hello) = greeting(&mut stream, config.world_size).map_err(protocol)? else {
            continue;
        };
        let r = hello.rank as usize;
        if streams[r].is_some() {
            return Err(protocol(format!("two processes claim rank {r}")));
        }
        table[r] = Some(SocketAddr::new(peer_addr.ip(), hello.port));
        streams[r] = Some(stream);
    }
    advertise_routable(&mut table, &streams);
    let mut encoded = Vec::new();
    for entry in table.iter().skip(1).flatten() {
        let ip = entry.ip().to_string();
        encoded.push(ip.len() as u8);
        encoded.extend_from_slice(ip.as_bytes());
        encoded.extend_from_slice(&entry.port().to_le_bytes());
    }
    for (r, stream) in streams.iter_mut().enumerate().skip(1) {
        if let Some(stream) = stream {
            stream.write_all(&encoded).map_err(|source| TcpError::Io {
                address: address.to_owned(),
                peer: r as u32,
                source,
            })?;
        }
    }
    Ok(streams)
}

/// Ranks on rank 0's own node may have connected over loopback (Debian maps the host name to
/// 127.0.1.1), and a loopback address means nothing to ranks on other nodes. Those ranks
/// listen on every interface, so rank 0's own routable address (as a remote rank reached it)
/// reaches them as well. On a single node every address stays loopback, which is right there.
fn advertise_routable(table: &mut [Option<SocketAddr>], streams: &[Option<TcpStream>]) {
    let routable = streams
        .iter()
        .flatten()
        .filter_map(|stream| stream.local_addr().ok())
        .map(|local| local.ip())
        .find(|ip| !ip.is_loopback());
    if let Some(ip) = routable {
        replace_loopback(table, ip);
    }
}

fn replace_loopback(table: &mut [Option<SocketAddr>], ip: IpAddr) {
    for entry in table.iter_mut().flatten() {
        if entry.ip().is_loopback() {
            entry.set_ip(ip);
        }
    }
}

/// Connects to `address`, retrying until `deadline` (the listener may not be up yet).
fn connect_retrying(targets: &[SocketAddr], deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for target in targets {
            match TcpStream::connect_timeout(target, Duration::from_secs(5)) {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Ranks above 0: register with rank 0, learn the table, connect to the ranks below, accept
/// the ranks above.
fn join(config: &TcpConfig, address: &str) -> Result<Vec<Option<TcpStream>>, TcpError> {
    let (rank, n) = (config.rank, config.world_size as usize);
    let deadline = Instant::now() + config.connect_timeout;
    let io_error = |peer: u32| {
        move |source| TcpError::Io {
            address: address.to_owned(),
            peer,
            source,
        }
    };
    let listener =
        TcpListener::bind(("0.0.0.0", 0)).map_err(|source| TcpError::Listen { port: 0, source })?;
    let port = listener.local_addr().map_err(io_error(rank))?.port();
    let targets: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|source| TcpError::Resolve {
            address: address.to_owned(),
            source,
        })?
        .collect();
    let mut master =
        connect_retrying(&targets, deadline).map_err(|source| TcpError::Unreachable {
            rank,
            address: address.to_owned(),
            after: config.connect_timeout,
            source,
        })?;
    let world_size = config.world_size;
    Hello {
        world_size,
        rank,
        port,
    }
    .write(&mut master)
    .map_err(io_error(0))?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    master
        .set_read_timeout(Some(remaining.max(Duration::from_secs(1))))
        .map_err(io_error(0))?;
    let mut table = vec![None; n];
    for entry in table.iter_mut().skip(1) {
        let mut len = [0u8; 1];
        master.read_exact(&mut len).map_err(io_error(0))?;
        let mut ip = vec![0u8; usize::from(len[0])];
        master.read_exact(&mut ip).map_err(io_error(0))?;
        let mut peer_port = [0u8; 2];
        master.read_exact(&mut peer_port).map_err(io_error(0))?;
        let ip: IpAddr = String::from_utf8_lossy(&ip)
            .parse()
            .map_err(|e| TcpError::Protocol {
                address: address.to_owned(),
                detail: format!("rank 0 sent a bad address table: {e}"),
            })?;
        *entry = Some(SocketAddr::new(ip, u16::from_le_bytes(peer_port)));
    }
    let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    streams[0] = Some(master);
    for (peer, entry) in table.iter().enumerate().take(rank as usize).skip(1) {
        let Some(target) = entry else { continue };
        let mut stream = connect_retrying(&[*target], deadline).map_err(io_error(peer as u32))?;
        Hello {
            world_size,
            rank,
            port: 0,
        }
        .write(&mut stream)
        .map_err(io_error(peer as u32))?;
        streams[peer] = Some(stream);
    }
    while (rank as usize + 1..n).any(|r| streams[r].is_none()) {
        let missing = || {
            (rank as usize + 1..n)
                .filter(|&r| streams[r].is_none())
                .map(|r| r as u32)
                .collect::<Vec<_>>()
        };
        let accepted = accept_until(&listener, deadline).map_err(io_error(rank))?;
        let Some((mut stream, _)) = accepted else {
            return Err(TcpError::Timeout {
                address: address.to_owned(),
                after: config.connect_timeout,
                missing: missing(),
            });
        };
        let hello =
            greeting(&mut stream, config.world_size).map_err(|detail| TcpError::Protocol {
                address: address.to_owned(),
                detail,
            })?;
        match hello {
            Some(hello) if hello.rank > rank && streams[hello.rank as usize].is_none() => {
                streams[hello.rank as usize] = Some(stream);
            }
            _ => continue,
        }
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_entries_get_the_routable_address_and_the_others_stay() {
        let addr = |text: &str| text.parse::<SocketAddr>().ok();
        let mut table = vec![
            None,
            addr("127.0.1.1:4001"),
            addr("10.0.0.7:4002"),
            addr("127.0.0.1:4003"),
        ];
        replace_loopback(&mut table, "10.0.0.1".parse().expect("an IP"));
        assert_eq!(
            table,
            [
                None,
                addr("10.0.0.1:4001"),
                addr("10.0.0.7:4002"),
                addr("10.0.0.1:4003")
            ]
        );
    }

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
