//! Reading tensors out of safetensors files one at a time: the header is parsed once and each
//! tensor is read from its byte range, so neither side of a conversion ever holds more than the
//! tensor at hand (a 70B model converts on a machine with less memory than the model).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::HfError;

/// Headers above this are not safetensors files (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100_000_000;

/// One tensor's entry in a safetensors header.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Entry {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data_offsets: [u64; 2],
}

/// A safetensors file opened for reading tensors by name.
#[derive(Debug)]
pub(crate) struct TensorFile {
    path: PathBuf,
    data_start: u64,
    pub entries: HashMap<String, Entry>,
}

impl TensorFile {
    pub(crate) fn open(path: &Path) -> Result<Self, HfError> {
        let mut file = File::open(path).map_err(|e| HfError::io("open", path, e))?;
        let mut length = [0u8; 8];
        file.read_exact(&mut length)
            .map_err(|e| HfError::io("read the header of", path, e))?;
        let length = u64::from_le_bytes(length);
        if length > MAX_HEADER {
            return Err(HfError::tensors(
                path,
                "not a safetensors file (header length)",
            ));
        }
        let mut header = vec![0u8; length as usize];
        file.read_exact(&mut header)
            .map_err(|e| HfError::io("read the header of", path, e))?;
        let mut header: HashMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| HfError::tensors(path, format!("invalid safetensors header: {e}")))?;
        header.remove("__metadata__");
        let entries = header
            .into_iter()
            .map(|(name, value)| {
                serde_json::from_value(value)
                    .map(|entry| (name.clone(), entry))
                    .map_err(|e| HfError::tensors(path, format!("{name}: invalid entry: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(TensorFile {
            path: path.to_path_buf(),
            data_start: 8 + length,
            entries,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Tensor `name` as f32 (F32, BF16 and F16 are read; bf16/f16 widen exactly).
    pub(crate) fn read_f32(&self, name: &str) -> Result<Vec<f32>, HfError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| HfError::tensors(&self.path, format!("no tensor {name}")))?;
        let width = match entry.dtype.as_str() {
            "F32" => 4,
            "BF16" | "F16" => 2,
            other => {
                return Err(HfError::tensors(
                    &self.path,
                    format!("{name} is {other}; F32, BF16 and F16 are read"),
                ));
            }
        };
        let [start, end] = entry.data_offsets;
        let numel: usize = entry.shape.iter().product();
        if end < start || (end - start) as usize != numel * width {
            return Err(HfError::tensors(
                &self.path,
                format!(
                    "{name}: {} bytes for shape {:?}",
                    end.saturating_sub(start),
                    entry.shape
                ),
            ));
        }
        let mut file = File::open(&self.path).map_err(|e| HfError::io("open", &self.path, e))?;
        file.seek(SeekFrom::Start(self.data_start + start))
            .map_err(|e| HfError::io("seek in", &self.path, e))?;
        let mut bytes = vec![0u8; numel * width];
        file.read_exact(&mut bytes)
            .map_err(|e| HfError::io("read", &self.path, e))?;
        Ok(match entry.dtype.as_str() {
            "F32" => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            "BF16" => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }
}
