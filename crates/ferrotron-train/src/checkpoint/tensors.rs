//! Tensors on disk as safetensors (f32, little-endian), named by parameter path, so the files
//! open in any safetensors reader (Python included) without our code.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::TrainError;
use crate::params::NamedTensor;

struct F32View<'a> {
    shape: &'a [usize],
    bytes: Vec<u8>,
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Write `tensors` to `path` as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[NamedTensor]) -> Result<(), TrainError> {
    let views = tensors.iter().map(|t| {
        let bytes = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (
            t.name.as_str(),
            F32View {
                shape: &t.shape,
                bytes,
            },
        )
    });
    let buffer = safetensors::serialize(views, None)
        .map_err(|e| TrainError::checkpoint(path, format!("cannot encode tensors: {e}")))?;
    std::fs::write(path, buffer).map_err(|e| TrainError::io("write", path, e))
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
