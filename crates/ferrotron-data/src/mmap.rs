//! The crate's only `unsafe`: mapping a file read-only. Mapping is what lets a loader serve
//! millions of tokens per second from datasets larger than memory, as Megatron does with
//! `numpy.memmap`.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::DataError;

/// Maps `path` read-only. The bytes are only valid while nobody truncates or rewrites the file;
/// datasets and index caches are written to a temporary name and renamed into place, so a file
/// being mapped is never modified by this program.
#[allow(unsafe_code)]
pub(crate) fn map_file(path: &Path) -> Result<Mmap, DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    // SAFETY: read-only mapping of a file this program never writes in place (see above).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, e))?;
    Ok(map)
}
