//! Tensors on disk as safetensors (f32, little-endian), named by parameter path, so the files
//! open in any safetensors reader (Python included) without our code. A shard file also carries
//! the [`ShardSpec`] of every tensor in the header's `__metadata__`, so it explains itself: which
//! global tensor each piece belongs to and where it sits.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use std::io::Read;

use burn::backend::Flex;
use burn::tensor::Tensor;
use ferrotron_parallel::ShardSpec;
use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::TrainError;
use crate::params::NamedTensor;

/// The `__metadata__` key holding the JSON list of the file's shard specs.
pub const SHARDS_METADATA_KEY: &str = "ferrotron.shards";

/// A rank-local piece of a global tensor: where it sits ([`ShardSpec`]) and its values
/// (f32, row-major in the local shape).
#[derive(Debug, Clone, PartialEq)]
pub struct ShardTensor {
    pub spec: ShardSpec,
    pub values: ShardValues,
}

/// A shard's values: read already, a range of a host buffer the optimizer shares with the save (an
/// offloaded group's master or moment, `crate::optim::offload`), or a range of a device buffer. The
/// last two are read when the values are needed: by an asynchronous save's writer thread, so the
/// snapshot copies nothing on the training thread. The next update, finding a host buffer shared,
/// writes its results into a new one (burn-flex's AdamW); a device buffer it waits for
/// ([`super::SnapshotGate`]): the writer reads those first, while the next step's forward and
/// backward run (`FusedOps::read_later`), so the state is updated in place as ever.
#[derive(Debug, Clone)]
pub enum ShardValues {
    Read(Vec<f32>),
    Host {
        buffer: Tensor<Flex, 1>,
        range: std::ops::Range<usize>,
    },
    Device(Arc<dyn DeviceShard>),
}

/// Values in a device buffer, read as f32 when asked (behind the device's queued work).
pub trait DeviceShard: std::fmt::Debug + Send + Sync {
    fn len(&self) -> usize;
    /// Copies the values off the device, keeping them for [`DeviceShard::read`]: after it the
    /// device buffer may change.
    fn fetch(&self);
    /// The values (fetched first if they were not); a device range is read once (a snapshot's
    /// values are the buffer's at the save, which a second read after the next update would
    /// not see).
    fn read(&self) -> Vec<f32>;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ShardValues {
    pub fn len(&self) -> usize {
        match self {
            ShardValues::Read(values) => values.len(),
            ShardValues::Host { range, .. } => range.len(),
            ShardValues::Device(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 (a host or device range is read now).
    pub fn to_vec(&self) -> Vec<f32> {
        match self {
            ShardValues::Read(values) => values.clone(),
            ShardValues::Host { buffer, range } => buffer
                .clone()
                .slice(range.clone())
                .into_data()
                .convert::<f32>()
                .to_vec()
                .expect("a buffer converted to f32 reads back as f32"),
            ShardValues::Device(values) => values.read(),
        }
    }

    /// Device values copied off the device (not yet into host values: [`Self::read_device`]).
    pub(crate) fn fetch_device(&self) {
        if let ShardValues::Device(values) = self {
            values.fetch();
        }
    }

    /// Device values read into host memory, letting go of the device buffer.
    pub(crate) fn read_device(&mut self) {
        if let ShardValues::Device(values) = self {
            *self = ShardValues::Read(values.read());
        }
    }
}

impl From<Vec<f32>> for ShardValues {
    fn from(values: Vec<f32>) -> Self {
        ShardValues::Read(values)
    }
}

impl PartialEq for ShardValues {
    fn eq(&self, other: &Self) -> bool {
        self.to_vec() == other.to_vec()
    }
}

/// One tensor as the writer streams it: its f32 values as little-endian bytes, borrowed where
/// they are in memory already (no copy of a checkpoint's state before the write: the file is
/// written tensor by tensor from the values themselves), made per tensor otherwise.
struct F32View<'a> {
    shape: &'a [usize],
    values: Values<'a>,
}

enum Values<'a> {
    Slice(&'a [f32]),
    Shard(&'a ShardValues),
}

/// `values` as the file's little-endian bytes: the values themselves on a little-endian host.
fn le_bytes(values: &[f32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self.values {
            Values::Slice(values) => le_bytes(values),
            Values::Shard(ShardValues::Read(values)) => le_bytes(values),
            Values::Shard(shard) => Cow::Owned(le_bytes(&shard.to_vec()).into_owned()),
        }
    }
    fn data_len(&self) -> usize {
        4 * match self.values {
            Values::Slice(values) => values.len(),
            Values::Shard(shard) => shard.len(),
        }
    }
}

/// Write `tensors` to `path` as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[NamedTensor]) -> Result<(), TrainError> {
    let views = tensors.iter().map(|t| {
        (
            t.name.as_str(),
            F32View {
                shape: &t.shape,
                values: Values::Slice(&t.values),
            },
        )
    });
    write_views(path, views, None)
}

/// Write shards to `path`, each under its global name, with their specs in the header. A rank
/// holds at most one piece of a global tensor, so a repeated name is a caller's bug, refused.
pub fn write_shard_file(path: &Path, shards: &[ShardTensor]) -> Result<(), TrainError> {
    let mut shapes = Vec::with_capacity(shards.len());
    let mut seen = std::collections::HashSet::new();
    for shard in shards {
        let name = &shard.spec.global_name;
        if !seen.insert(name.as_str()) {
            return Err(TrainError::checkpoint(
                path,
                format!("two shards of {name} from one rank"),
            ));
        }
        let shape = shard
            .spec
            .local_shape()
            .map_err(|e| TrainError::checkpoint(path, e.to_string()))?;
        if shape.iter().product::<usize>() != shard.values.len() {
            return Err(TrainError::checkpoint(
                path,
                format!(
                    "{name}: {} values for a shard of shape {shape:?}",
                    shard.values.len()
                ),
            ));
        }
        shapes.push(shape);
    }
    let specs: Vec<&ShardSpec> = shards.iter().map(|s| &s.spec).collect();
    let json = serde_json::to_string(&specs).expect("shard specs serialize");
    let metadata = HashMap::from([(SHARDS_METADATA_KEY.to_owned(), json)]);
    let views = shards.iter().zip(&shapes).map(|(shard, shape)| {
        (
            shard.spec.global_name.as_str(),
            F32View {
                shape,
                values: Values::Shard(&shard.values),
            },
        )
    });
    write_views(path, views, Some(metadata))
}

/// The shard specs recorded in a shard file's header, reading only the header.
pub fn read_shard_specs(path: &Path) -> Result<Vec<ShardSpec>, TrainError> {
    let mut file = std::fs::File::open(path).map_err(|e| TrainError::io("open", path, e))?;
    let mut length = [0u8; 8];
    file.read_exact(&mut length)
        .map_err(|e| TrainError::io("read the header of", path, e))?;
    let length = usize::try_from(u64::from_le_bytes(length))
        .ok()
        .filter(|&n| n <= 100_000_000)
        .ok_or_else(|| TrainError::checkpoint(path, "not a safetensors file (header length)"))?;
    let mut header = vec![0u8; length];
    file.read_exact(&mut header)
        .map_err(|e| TrainError::io("read the header of", path, e))?;
    let header: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| TrainError::checkpoint(path, format!("invalid safetensors header: {e}")))?;
    let specs = header
        .pointer(&format!("/__metadata__/{SHARDS_METADATA_KEY}"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| {
            TrainError::checkpoint(path, format!("no {SHARDS_METADATA_KEY} in the header"))
        })?;
    serde_json::from_str(specs)
        .map_err(|e| TrainError::checkpoint(path, format!("invalid shard specs: {e}")))
}

/// Streams `views` into `path`: the header, then each tensor's bytes in turn.
fn write_views<'a>(
    path: &Path,
    views: impl Iterator<Item = (&'a str, F32View<'a>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(), TrainError> {
    safetensors::serialize_to_file(views, metadata, path).map_err(|e| match e {
        safetensors::SafeTensorError::IoError(io) => TrainError::io("write", path, io),
        other => TrainError::checkpoint(path, format!("cannot encode tensors: {other}")),
    })
}

/// Read every tensor of a safetensors file (f32 only), by name.
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, NamedTensor>, TrainError> {
    let buffer = std::fs::read(path).map_err(|e| TrainError::io("read", path, e))?;
    let file = SafeTensors::deserialize(&buffer)
        .map_err(|e| TrainError::checkpoint(path, format!("not a valid safetensors file: {e}")))?;
    let mut out = HashMap::with_capacity(file.len());
    for (name, view) in file.iter() {
        if view.dtype() != Dtype::F32 {
            return Err(TrainError::checkpoint(
                path,
                format!("tensor {name} is {:?}; checkpoints hold f32", view.dtype()),
            ));
        }
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(
            name.to_owned(),
            NamedTensor {
                name: name.to_owned(),
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_names_shapes_and_bits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.safetensors");
        let tensors = vec![
            NamedTensor {
                name: "layers.0.attn.qkv.weight".into(),
                shape: vec![2, 3],
                values: vec![1.0, -2.5, 3.25, f32::MIN_POSITIVE, 0.1, -0.0],
            },
            NamedTensor {
                name: "final_norm.bias".into(),
                shape: vec![1],
                values: vec![7.0],
            },
        ];
        write_safetensors(&path, &tensors).expect("write");
        let read = read_safetensors(&path).expect("read");
        for tensor in &tensors {
            let got = &read[&tensor.name];
            assert_eq!(got.shape, tensor.shape);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.values), bits(&tensor.values));
        }
    }

    /// The streamed shard file is, byte for byte, what safetensors makes of the same f32
    /// tensors in one buffer: values read already (borrowed) and a range of a host buffer (made
    /// per tensor) alike.
    #[test]
    fn a_streamed_shard_file_is_safetensors_serialize_byte_for_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("shard.safetensors");
        let spec = |name: &str, shape: Vec<usize>| ShardSpec {
            global_name: name.into(),
            global_shape: shape,
            splits: Vec::new(),
        };
        let host: Vec<f32> = (0..10).map(|i| i as f32 * 0.5 - 1.0).collect();
        let buffer = Tensor::<Flex, 1>::from_floats(host.as_slice(), &Default::default());
        let shards = vec![
            ShardTensor {
                spec: spec("b.weight", vec![2, 3]),
                values: ShardValues::Read(vec![1.0, -2.5, 3.25, f32::MIN_POSITIVE, 0.1, -0.0]),
            },
            ShardTensor {
                spec: spec("a.exp_avg", vec![4]),
                values: ShardValues::Host {
                    buffer,
                    range: 3..7,
                },
            },
        ];
        write_shard_file(&path, &shards).expect("write");
        let specs: Vec<&ShardSpec> = shards.iter().map(|s| &s.spec).collect();
        let metadata = HashMap::from([(
            SHARDS_METADATA_KEY.to_owned(),
            serde_json::to_string(&specs).expect("json"),
        )]);
        let owned: Vec<(String, Vec<usize>, Vec<u8>)> = shards
            .iter()
            .map(|s| {
                let bytes = s
                    .values
                    .to_vec()
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                (
                    s.spec.global_name.clone(),
                    s.spec.global_shape.clone(),
                    bytes,
                )
            })
            .collect();
        let views = owned.iter().map(|(name, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), bytes)
                .expect("a view");
            (name.as_str(), view)
        });
        let want = safetensors::serialize(views, Some(metadata)).expect("serialize");
        assert_eq!(std::fs::read(&path).expect("read"), want);
        assert_eq!(
            read_safetensors(&path).expect("read")["a.exp_avg"].values,
            host[3..7]
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.safetensors");
        std::fs::write(&path, b"not tensors").expect("write");
        let err = read_safetensors(&path).expect_err("invalid");
        assert!(
            err.to_string().contains("not a valid safetensors file"),
            "{err}"
        );
    }
}
