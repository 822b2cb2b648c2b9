//! Where a rank-local tensor sits in the global (one-rank) tensor of the same name.
//!
//! This is the one description of a layout that model, optimizer and checkpoints share: the
//! model cuts its shards with [`ShardSpec::slice_of`] from the full single-rank initialisation,
//! and checkpoints store every shard under its global name with its spec, so a loader can
//! [`ShardSpec::place`] whatever shards exist into global tensors and cut a different layout's
//! shards from them (tp2·pp2 saved, tp1·dp4 resumed).

use burn::module::ParamId;
use burn::tensor::TensorData;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSpec {
    pub global_name: String,
    pub global_shape: Vec<usize>,
    /// Applied in order: each split cuts the tensor the previous ones left (two splits of one
    /// dim nest, e.g. experts over ep, then each expert's rows over etp).
    pub splits: Vec<Split>,
}

/// Dim `dim` is `parts` equal blocks (1 normally; 2 for a fused `[gate; up]`); each block is
/// cut into `count` equal pieces and this rank holds piece `index` of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Split {
    pub dim: usize,
    pub parts: usize,
    pub index: usize,
    pub count: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("shard of `{name}`: split {split:?} is invalid for global shape {shape:?}: {why}")]
    InvalidSplit {
        name: String,
        shape: Vec<usize>,
        split: Split,
        why: &'static str,
    },
    #[error("shard of `{name}`: expected a {what} of shape {expected:?}, got {actual:?}")]
    ShapeMismatch {
        name: String,
        what: &'static str,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error(
        "shard of `{name}`: the global buffer has {actual} elements, the global shape {expected}"
    )]
    BufferLength {
        name: String,
        expected: usize,
        actual: usize,
    },
    #[error("shard of `{name}`: cannot read the tensor data: {detail}")]
    Data { name: String, detail: String },
}

/// How a local parameter relates to the global model and how its gradient is reduced.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamRole {
    pub id: ParamId,
    pub shard: ShardSpec,
    /// An expert's weight: gradients reduced over `edp`, not `dp_cp`.
    pub expert: bool,
    /// Each tp rank holds a partial gradient (sequence parallel: norm weights, row-parallel
    /// biases, the router): gradients all-reduced over `tp`.
    pub tp_partial: bool,
    /// Replicated over tp: counted once (on tp rank 0) in the global grad norm.
    pub tp_duplicate: bool,
    /// The word embedding shared by first and last stage: reduced over the embedding group.
    pub tied_embedding: bool,
    pub no_weight_decay: bool,
}

impl ParamRole {
    /// A dense parameter with every flag off.
    pub fn new(id: ParamId, shard: ShardSpec) -> ParamRole {
        ParamRole {
            id,
            shard,
            expert: false,
            tp_partial: false,
            tp_duplicate: false,
            tied_embedding: false,
            no_weight_decay: false,
        }
    }
}

impl Split {
    /// Piece `index` of `count` along `dim`.
    pub fn new(dim: usize, index: usize, count: usize) -> Split {
        Split {
            dim,
            parts: 1,
            index,
            count,
        }
    }

    /// Piece `index` of `count` of each of `parts` fused blocks along `dim`.
    pub fn fused(dim: usize, parts: usize, index: usize, count: usize) -> Split {
        Split {
            dim,
            parts,
            index,
            count,
        }
    }

    /// The index in the split's input of local index `local` (`len` = the input's extent).
    fn source_index(&self, len: usize, local: usize) -> usize {
        let block = len / self.parts;
        let piece = block / self.count;
        let (part, within) = (local / piece, local % piece);
        part * block + self.index * piece + within
    }
}

impl ShardSpec {
    /// The whole tensor (no split): replicated parameters.
    pub fn full(global_name: impl Into<String>, global_shape: Vec<usize>) -> ShardSpec {
        ShardSpec {
            global_name: global_name.into(),
            global_shape,
            splits: Vec::new(),
        }
    }

    /// Adds a split (applied after the existing ones).
    pub fn with_split(mut self, split: Split) -> ShardSpec {
        self.splits.push(split);
        self
    }

    /// Whether this rank holds less than the whole tensor.
    pub fn is_split(&self) -> bool {
        self.splits.iter().any(|s| s.count > 1)
    }

    /// The shape of the local tensor.
    pub fn local_shape(&self) -> Result<Vec<usize>, ShardError> {
        let mut shape = self.global_shape.clone();
        for split in &self.splits {
            let invalid = |why| ShardError::InvalidSplit {
                name: self.global_name.clone(),
                shape: self.global_shape.clone(),
                split: *split,
                why,
            };
            let Some(&len) = shape.get(split.dim) else {
                return Err(invalid("dim out of range"));
            };
            if split.parts == 0 || split.count == 0 {
                return Err(invalid("parts and count must be at least 1"));
            }
            if split.index >= split.count {
                return Err(invalid("index must be below count"));
            }
            if !len.is_multiple_of(split.parts * split.count) {
                return Err(invalid("the dim is not divisible by parts × count"));
            }
            shape[split.dim] = len / split.count;
        }
        Ok(shape)
    }

    /// For every dim, the global index of each local index.
    fn index_maps(&self) -> Result<Vec<Vec<usize>>, ShardError> {
        self.local_shape()?;
        let mut maps: Vec<Vec<usize>> = self
            .global_shape
            .iter()
            .map(|&n| (0..n).collect())
            .collect();
        for split in &self.splits {
            let map = &mut maps[split.dim];
            let len = map.len();
            *map = (0..len / split.count)
                .map(|local| map[split.source_index(len, local)])
                .collect();
        }
        Ok(maps)
    }

    /// Calls `copy(local_offset, global_offset, len)` for every contiguous run of the shard,
    /// offsets and lengths in elements, in local order.
    fn for_each_run(&self, mut copy: impl FnMut(usize, usize, usize)) -> Result<(), ShardError> {
        let maps = self.index_maps()?;
        let rank = maps.len();
        // The trailing dims held whole are one contiguous run in both tensors.
        let whole = (0..rank)
            .rev()
            .take_while(|&d| maps[d].len() == self.global_shape[d])
            .count();
        let split_dims = rank - whole;
        let run: usize = self.global_shape[split_dims..].iter().product();
        let mut global_strides = vec![run; split_dims];
        for d in (0..split_dims.saturating_sub(1)).rev() {
            global_strides[d] = global_strides[d + 1] * self.global_shape[d + 1];
        }
        let local_count: usize = maps[..split_dims].iter().map(Vec::len).product();
        if local_count == 0 || run == 0 {
            return Ok(());
        }
        let mut index = vec![0usize; split_dims];
        for step in 0..local_count {
            let global: usize = (0..split_dims)
                .map(|d| maps[d][index[d]] * global_strides[d])
                .sum();
            copy(step * run, global, run);
            for d in (0..split_dims).rev() {
                index[d] += 1;
                if index[d] < maps[d].len() {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(())
    }

    /// Cuts this shard out of the global tensor, keeping its dtype.
    pub fn slice_of(&self, global: &TensorData) -> Result<TensorData, ShardError> {
        let actual = global.shape.to_vec();
        if actual != self.global_shape {
            return Err(ShardError::ShapeMismatch {
                name: self.global_name.clone(),
                what: "global tensor",
                expected: self.global_shape.clone(),
                actual,
            });
        }
        let width = global.dtype.size();
        let bytes = global.as_bytes();
        if bytes.len() != width * global.num_elements() {
            return Err(ShardError::Data {
                name: self.global_name.clone(),
                detail: format!("{:?} data is not one value per element", global.dtype),
            });
        }
        let local_shape = self.local_shape()?;
        let mut out = vec![0u8; width * local_shape.iter().product::<usize>()];
        self.for_each_run(|local, global, len| {
            out[local * width..(local + len) * width]
                .copy_from_slice(&bytes[global * width..(global + len) * width]);
        })?;
        Ok(TensorData::from_bytes_vec(out, local_shape, global.dtype))
    }

    /// Cuts this shard out of a flat f32 global buffer (row-major in `global_shape`).
    pub fn slice_of_f32(&self, global: &[f32]) -> Result<Vec<f32>, ShardError> {
        self.check_global_len(global.len())?;
        let local_shape = self.local_shape()?;
        let mut out = vec![0.0f32; local_shape.iter().product()];
        self.for_each_run(|local, g, len| {
            out[local..local + len].copy_from_slice(&global[g..g + len]);
        })?;
        Ok(out)
    }

    /// Writes the local tensor (any float dtype, converted to f32) into its place in `global`,
    /// a row-major f32 buffer of `global_shape`.
    pub fn place(&self, local: &TensorData, global: &mut [f32]) -> Result<(), ShardError> {
        let expected = self.local_shape()?;
        let actual = local.shape.to_vec();
        if actual != expected {
            return Err(ShardError::ShapeMismatch {
                name: self.global_name.clone(),
                what: "local tensor",
                expected,
                actual,
            });
        }
        let values = local
            .clone()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|err| ShardError::Data {
                name: self.global_name.clone(),
                detail: format!("{err:?}"),
            })?;
        self.place_f32(&values, global)
    }

    /// [`ShardSpec::place`] for a flat f32 local buffer (row-major in the local shape).
    pub fn place_f32(&self, local: &[f32], global: &mut [f32]) -> Result<(), ShardError> {
        self.check_global_len(global.len())?;
        let local_shape = self.local_shape()?;
        let expected: usize = local_shape.iter().product();
        if local.len() != expected {
            return Err(ShardError::ShapeMismatch {
                name: self.global_name.clone(),
                what: "local buffer",
                expected: local_shape,
                actual: vec![local.len()],
            });
        }
        self.for_each_run(|l, g, len| {
            global[g..g + len].copy_from_slice(&local[l..l + len]);
        })
    }

    fn check_global_len(&self, actual: usize) -> Result<(), ShardError> {
        let expected: usize = self.global_shape.iter().product();
        if actual != expected {
            return Err(ShardError::BufferLength {
                name: self.global_name.clone(),
                expected,
                actual,
            });
        }
        Ok(())
    }
}
