//! How the processes of a [`crate::TcpComm`] world find each other.
//!
//! Rendezvous is torchrun's: rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank
//! opens a listener of its own on any free port, connects to rank 0 (retrying until rank 0 is
//! up) and says who it is; rank 0 answers each in kind and, once all have come, sends everyone
//! the table of addresses (each rank's as rank 0 saw it, so the interface that routes is the
//! one used); then rank `i` connects to every rank `0 < j < i` and accepts the ranks above it.
//!
//! Every wait is bounded by the connect deadline, and nothing read is trusted before it proved
//! to be a rank of this world. Launchers (ours, torchrun's `--standalone`, this repository's
//! tests) pick `MASTER_PORT` by binding port 0 and letting go, so it lies in the ephemeral
//! range; a rank connecting there before rank 0 binds it can be connected to itself. Such a
//! connection is dropped and retried, and rank 0 retries a bind that such a socket held for an
//! instant, rather than the one waiting out the deadline and the other failing.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use crate::tcp_comm::TcpConfig;
use crate::tcp_comm_wire::{MAGIC, VERSION};

/// How long rank 0 retries binding a port that is in use: long enough for a rank that reached
/// itself on that port to let go, short enough that a port taken for good fails promptly.
const BIND_GRACE: Duration = Duration::from_secs(2);

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

/// Every rank's connection to every other (`None` at this rank's own place): the rendezvous.
/// `listener` is rank 0's when the caller bound it already.
pub(crate) fn form(
    config: &TcpConfig,
    address: &str,
    listener: Option<TcpListener>,
) -> Result<Vec<Option<TcpStream>>, TcpError> {
    if config.world_size == 1 {
        Ok(vec![None])
    } else if config.rank == 0 {
        let listener = match listener {
            Some(listener) => listener,
            None => bind_master(config.master_port, BIND_GRACE)?,
        };
        serve(config, address, &listener)
    } else {
        join(config, address)
    }
}

/// Binds rank 0's listener, retrying for `grace` while the port is in use.
fn bind_master(port: u16, grace: Duration) -> Result<TcpListener, TcpError> {
    let deadline = Instant::now() + grace;
    loop {
        match TcpListener::bind(("0.0.0.0", port)) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(source) => return Err(TcpError::Listen { port, source }),
        }
    }
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
        Hello {
            world_size: config.world_size,
            rank: 0,
            port: config.master_port,
        }
        .write(&mut stream)
        .map_err(|source| TcpError::Io {
            address: address.to_owned(),
            peer: r as u32,
            source,
        })?;
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

/// A connection whose two ends are one socket. Before rank 0 listens, a connect to a port of
/// the ephemeral range can be given that very port as its source, and TCP's simultaneous open
/// then connects the socket to itself: it echoes the greeting back, and it holds the port rank 0
/// is about to bind.
fn is_self_connection(stream: &TcpStream) -> bool {
    matches!((stream.local_addr(), stream.peer_addr()), (Ok(local), Ok(peer)) if local == peer)
}

/// Connects to `address`, retrying until `deadline` (the listener may not be up yet).
fn connect_retrying(targets: &[SocketAddr], deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for target in targets {
            match TcpStream::connect_timeout(target, Duration::from_secs(5)) {
                Ok(stream) if is_self_connection(&stream) => {
                    last = io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "nothing listens there yet (the connection reached itself)",
                    );
                }
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

/// Connects to rank 0, says who this rank is and waits for rank 0 to answer in kind, with the
/// read bounded by `deadline`. Anything else at `MASTER_ADDR:MASTER_PORT` (another service, or
/// a rank of a world that took the port first) is refused at once, naming what answered,
/// instead of being read as the address table until the deadline.
fn greet_rank_zero(
    config: &TcpConfig,
    address: &str,
    targets: &[SocketAddr],
    port: u16,
    deadline: Instant,
) -> Result<TcpStream, TcpError> {
    let rank = config.rank;
    let mut master =
        connect_retrying(targets, deadline).map_err(|source| TcpError::Unreachable {
            rank,
            address: address.to_owned(),
            after: config.connect_timeout,
            source,
        })?;
    let io_error = |source| TcpError::Io {
        address: address.to_owned(),
        peer: 0,
        source,
    };
    Hello {
        world_size: config.world_size,
        rank,
        port,
    }
    .write(&mut master)
    .map_err(io_error)?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    master
        .set_read_timeout(Some(remaining.max(Duration::from_secs(1))))
        .map_err(io_error)?;
    let protocol = |detail: String| TcpError::Protocol {
        address: address.to_owned(),
        detail,
    };
    match Hello::read(&mut master).map_err(io_error)? {
        Some(reply) if reply.rank == 0 && reply.world_size == config.world_size => Ok(master),
        Some(reply) if reply.rank == 0 => Err(protocol(format!(
            "rank 0 was started with a world of {}, this rank has {}",
            reply.world_size, config.world_size
        ))),
        Some(reply) => Err(protocol(format!(
            "the process listening there is rank {} of a world of {}, not rank 0",
            reply.rank, reply.world_size
        ))),
        None => Err(protocol(
            "the process listening there is not a ferrotron rank 0 (it answered with other bytes)"
                .to_owned(),
        )),
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
    let mut master = greet_rank_zero(config, address, &targets, port, deadline)?;
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
            world_size: config.world_size,
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

    /// TCP's simultaneous open, made on purpose: a socket bound to a port connecting to that
    /// same port is connected to itself, as a rank's connect can be by chance.
    #[test]
    fn a_connection_to_itself_is_told_from_one_to_a_listener() {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a socket");
        let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        socket.bind(&any.into()).expect("bound");
        let own = socket
            .local_addr()
            .expect("bound")
            .as_socket()
            .expect("IPv4");
        socket.connect(&own.into()).expect("connected to itself");
        assert!(is_self_connection(&socket.into()));

        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let target = listener.local_addr().expect("bound");
        let stream = TcpStream::connect(target).expect("connected");
        assert!(!is_self_connection(&stream));
    }

    #[test]
    fn rank_zero_binds_a_port_let_go_within_the_grace_and_names_one_held() {
        let holder = TcpListener::bind("0.0.0.0:0").expect("a port");
        let port = holder.local_addr().expect("bound").port();
        let err = bind_master(port, Duration::from_millis(100)).expect_err("the port is held");
        assert!(
            err.to_string()
                .starts_with(&format!("rank 0 cannot listen on port {port}: ")),
            "{err}"
        );
        let release = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            drop(holder);
        });
        bind_master(port, Duration::from_secs(5)).expect("bound once the holder let go");
        release.join().expect("the holder thread ends");
    }
}
