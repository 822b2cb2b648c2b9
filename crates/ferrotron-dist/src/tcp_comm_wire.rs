//! The bytes [`crate::TcpComm`] puts on a socket: frame headers and element encodings.
//!
//! Every frame carries the signature of the collective that sent it (op, dtype, length, reduce
//! op, root), so the receiver can check that both sides called the same thing, exactly as the
//! thread rendezvous compares deposits: a schedule bug across processes is a `Mismatch` error
//! naming both calls, not a misread buffer. Numbers are little-endian; the workspace forbids
//! `unsafe`, so elements are converted value by value (through `Any`, because the
//! [`Element`] trait has no byte view), which costs far less than the network does.

use std::any::{Any, TypeId};
use std::io::{self, Read};

use half::bf16;

use crate::element::{DType, Element, ReduceOp};
use crate::rendezvous::Signature;

/// "FTRN": the first bytes of every rendezvous greeting, so a stray connection is recognised.
pub(crate) const MAGIC: u32 = 0x4654_524e;
/// Bumped whenever the frame or greeting layout changes; peers of different versions refuse.
pub(crate) const VERSION: u32 = 3;

/// The operations a frame can belong to; the index is the wire code.
const OPS: [&str; 9] = [
    "all_reduce",
    "all_reduce (gather)",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "all_to_all",
    "barrier",
    "new_group",
    "send",
];

const NONE: u64 = u64::MAX;

/// Which queue a frame lands in at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    /// Part of a collective; collectives of one group are matched in call order.
    Collective,
    /// `send`/`recv`, matched in order per sender, independently of collectives.
    PointToPoint,
    /// The sender is failing; the payload is why (UTF-8).
    Abort,
    /// The sender is alive (sent every [`crate::tcp_comm_mesh::HEARTBEAT`]; no payload).
    Heartbeat,
    /// The sender is done with the world (its run ended): its connection closing next is not a
    /// failure.
    Bye,
}

impl Channel {
    fn code(self) -> u8 {
        match self {
            Channel::Collective => 0,
            Channel::PointToPoint => 1,
            Channel::Abort => 2,
            Channel::Heartbeat => 3,
            Channel::Bye => 4,
        }
    }

    fn from_code(code: u8) -> io::Result<Channel> {
        match code {
            0 => Ok(Channel::Collective),
            1 => Ok(Channel::PointToPoint),
            2 => Ok(Channel::Abort),
            3 => Ok(Channel::Heartbeat),
            4 => Ok(Channel::Bye),
            other => Err(invalid(format!("unknown frame kind {other}"))),
        }
    }
}

/// A frame's fixed-size head.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Header {
    pub channel: Channel,
    /// [`group_key`] of the sending communicator.
    pub group: u64,
    pub signature: Signature,
    /// Elements in the payload (all-to-all sends differ per peer, so it is separate from `len`).
    pub count: u64,
    pub payload_bytes: u64,
}

pub(crate) const HEADER_BYTES: usize = 4 + 8 * 5;

/// A received frame.
#[derive(Debug)]
pub(crate) struct Frame {
    pub header: Header,
    pub payload: Vec<u8>,
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// A 64-bit FNV-1a of a group's name and members: how frames name their group.
pub(crate) fn group_key(name: &str, members: &[u32]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(name.as_bytes());
    feed(&[0xff]);
    for member in members {
        feed(&member.to_le_bytes());
    }
    hash
}

fn dtype_code(dtype: Option<DType>) -> u8 {
    match dtype {
        None => 0,
        Some(DType::F32) => 1,
        Some(DType::F64) => 2,
        Some(DType::Bf16) => 3,
        Some(DType::I32) => 4,
        Some(DType::I64) => 5,
        Some(DType::U32) => 6,
    }
}

fn dtype_from_code(code: u8) -> io::Result<Option<DType>> {
    Ok(match code {
        0 => None,
        1 => Some(DType::F32),
        2 => Some(DType::F64),
        3 => Some(DType::Bf16),
        4 => Some(DType::I32),
        5 => Some(DType::I64),
        6 => Some(DType::U32),
        other => return Err(invalid(format!("unknown element type {other}"))),
    })
}

fn optional(value: Option<usize>) -> u64 {
    value.map_or(NONE, |v| v as u64)
}

fn from_optional(value: u64) -> Option<usize> {
    (value != NONE).then_some(value as usize)
}

impl Header {
    /// Starts a frame: the header followed by room for `payload_bytes`.
    pub(crate) fn frame(&self) -> Vec<u8> {
        let op = OPS
            .iter()
            .position(|&op| op == self.signature.op)
            .unwrap_or(OPS.len()) as u8;
        let reduce = match self.signature.reduce {
            None => 0,
            Some(ReduceOp::Sum) => 1,
            Some(ReduceOp::Max) => 2,
        };
        let mut out = Vec::with_capacity(HEADER_BYTES + self.payload_bytes as usize);
        out.extend_from_slice(&[
            self.channel.code(),
            op,
            dtype_code(self.signature.dtype),
            reduce,
        ]);
        for word in [
            self.group,
            optional(self.signature.len),
            optional(self.signature.root),
            self.count,
            self.payload_bytes,
        ] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out
    }

    pub(crate) fn read(reader: &mut impl Read) -> io::Result<Header> {
        let mut bytes = [0u8; HEADER_BYTES];
        reader.read_exact(&mut bytes)?;
        let word = |i: usize| {
            let start = 4 + 8 * i;
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[start..start + 8]);
            u64::from_le_bytes(w)
        };
        let op = OPS
            .get(usize::from(bytes[1]))
            .copied()
            .unwrap_or("an unknown operation");
        let reduce = match bytes[3] {
            0 => None,
            1 => Some(ReduceOp::Sum),
            2 => Some(ReduceOp::Max),
            other => return Err(invalid(format!("unknown reduce op {other}"))),
        };
        Ok(Header {
            channel: Channel::from_code(bytes[0])?,
            group: word(0),
            signature: Signature {
                op,
                dtype: dtype_from_code(bytes[2])?,
                len: from_optional(word(1)),
                reduce,
                root: from_optional(word(2)),
            },
            count: word(3),
            payload_bytes: word(4),
        })
    }
}

/// Bytes per element of `dtype`.
pub(crate) fn element_bytes(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::I32 | DType::U32 => 4,
        DType::F64 | DType::I64 => 8,
        DType::Bf16 => 2,
    }
}

/// Fixed-width little-endian conversion of the element types.
trait LeBytes: Sized + 'static {
    const WIDTH: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! le_bytes {
    ($($ty:ty),*) => {$(
        impl LeBytes for $ty {
            const WIDTH: usize = std::mem::size_of::<$ty>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$ty>()];
                raw.copy_from_slice(bytes);
                <$ty>::from_le_bytes(raw)
            }
        }
    )*};
}

le_bytes!(f32, f64, bf16, i32, i64, u32);

fn encode_if<U: LeBytes>(boxed: Box<dyn Any>, out: &mut Vec<u8>) -> Result<(), Box<dyn Any>> {
    let values = boxed.downcast::<Vec<U>>()?;
    for value in *values {
        value.put(out);
    }
    Ok(())
}

/// Appends `values` to `out`, little-endian.
pub(crate) fn encode<T: Element>(values: &[T], out: &mut Vec<u8>) {
    out.reserve(values.len() * element_bytes(T::DTYPE));
    let boxed: Box<dyn Any> = Box::new(values.to_vec());
    // Exactly one arm matches: `Element` is implemented for these six types only.
    let _unmatched = encode_if::<f32>(boxed, out)
        .or_else(|b| encode_if::<f64>(b, out))
        .or_else(|b| encode_if::<bf16>(b, out))
        .or_else(|b| encode_if::<i32>(b, out))
        .or_else(|b| encode_if::<i64>(b, out))
        .or_else(|b| encode_if::<u32>(b, out));
}

fn decode_if<T: 'static, U: LeBytes>(bytes: &[u8]) -> Option<Vec<T>> {
    if TypeId::of::<T>() != TypeId::of::<U>() {
        return None;
    }
    let values: Vec<U> = bytes.chunks_exact(U::WIDTH).map(U::get).collect();
    let boxed: Box<dyn Any> = Box::new(values);
    boxed.downcast::<Vec<T>>().ok().map(|values| *values)
}

/// Decodes a payload of `T`s; `None` when its length is not a whole number of elements.
pub(crate) fn decode<T: Element>(bytes: &[u8]) -> Option<Vec<T>> {
    if !bytes.len().is_multiple_of(element_bytes(T::DTYPE)) {
        return None;
    }
    decode_if::<T, f32>(bytes)
        .or_else(|| decode_if::<T, f64>(bytes))
        .or_else(|| decode_if::<T, bf16>(bytes))
        .or_else(|| decode_if::<T, i32>(bytes))
        .or_else(|| decode_if::<T, i64>(bytes))
        .or_else(|| decode_if::<T, u32>(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_round_trip_through_bytes() {
        fn round_trip<T: Element + PartialEq>(values: &[T]) {
            let mut bytes = Vec::new();
            encode(values, &mut bytes);
            assert_eq!(bytes.len(), values.len() * element_bytes(T::DTYPE));
            assert_eq!(decode::<T>(&bytes).as_deref(), Some(values));
        }
        round_trip(&[1.5f32, -0.0, f32::MAX]);
        round_trip(&[1e300f64, -2.0]);
        round_trip(&[bf16::from_f32(3.25), bf16::from_f32(-1.0)]);
        round_trip(&[i32::MIN, 7]);
        round_trip(&[i64::MAX, -9]);
        round_trip(&[u32::MAX, 0]);
        assert!(decode::<f32>(&[0, 1, 2]).is_none());
    }

    #[test]
    fn headers_round_trip() {
        let header = Header {
            channel: Channel::Collective,
            group: group_key("dp", &[0, 2]),
            signature: Signature {
                op: "all_reduce",
                dtype: Some(DType::Bf16),
                len: Some(7),
                reduce: Some(ReduceOp::Max),
                root: None,
            },
            count: 3,
            payload_bytes: 6,
        };
        let bytes = header.frame();
        assert_eq!(bytes.len(), HEADER_BYTES);
        assert_eq!(Header::read(&mut bytes.as_slice()).ok(), Some(header));
    }

    #[test]
    fn group_keys_tell_names_and_members_apart() {
        let dp = group_key("dp", &[0, 2]);
        assert_ne!(dp, group_key("dp_cp", &[0, 2]));
        assert_ne!(dp, group_key("dp", &[2, 0]));
        assert_eq!(dp, group_key("dp", &[0, 2]));
    }
}
