//! A queued step's statistics, left on the device until the loop needs them, and the one read
//! that brings every queued step's values to the host together.
//!
//! Reading a device value waits for every kernel queued before it (on a GPU a stream
//! synchronisation), so a step that read its loss per microbatch and its gradient norm before
//! clipping would stall the queue several times a step. Instead each step leaves its values on
//! the device ([`DeviceValues`]) with what turns them into [`StepStats`], and the loop reads
//! when it logs, evaluates, saves or stops: every step queued since the last read, and the
//! ranks' agreement on stopping, in one host read ([`read_together`]).

use std::any::Any;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use crate::run::host_read::read_to_host;
use crate::{StepStats, TrainError};

/// Values left on the device, to be read with others in one host read. The backend is erased
/// (the loop drives a rank as a trait object); one rank's values are all of one backend.
pub(crate) struct DeviceValues {
    /// The `Vec<Tensor<I, 1>>` of f32 parts, in order.
    parts: Box<dyn Any>,
    /// How many values the parts hold together.
    len: usize,
    /// Reads the parts of several [`DeviceValues`] of this backend with one host read.
    read: ReadParts,
}

/// [`read_parts`] for one backend.
type ReadParts = fn(Vec<Box<dyn Any>>) -> Result<Vec<f32>, TrainError>;

impl DeviceValues {
    /// `parts` (1-D, any float dtype), read later as f32 in order.
    pub(crate) fn new<I: Backend>(parts: Vec<Tensor<I, 1>>) -> Self {
        let parts: Vec<Tensor<I, 1>> = parts.into_iter().map(|p| p.cast(DType::F32)).collect();
        let len = parts.iter().map(|p| p.dims()[0]).sum();
        DeviceValues {
            parts: Box::new(parts),
            len,
            read: read_parts::<I>,
        }
    }
}

/// The parts of several [`DeviceValues`], concatenated on the device and read at once.
fn read_parts<I: Backend>(values: Vec<Box<dyn Any>>) -> Result<Vec<f32>, TrainError> {
    let mut parts: Vec<Tensor<I, 1>> = Vec::new();
    for value in values {
        let value = value.downcast::<Vec<Tensor<I, 1>>>().map_err(|_| {
            TrainError::Config("statistics of two backends cannot be read together".into())
        })?;
        parts.extend(*value);
    }
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    read_to_host(|| Tensor::cat(parts, 0).into_data())
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| TrainError::Config(format!("reading the steps' statistics: {e:?}")))
}

/// Each of `values` as read, in order, with one host read (none when `values` is empty).
pub(crate) fn read_all(values: Vec<DeviceValues>) -> Result<Vec<Vec<f32>>, TrainError> {
    let Some(read) = values.first().map(|value| value.read) else {
        return Ok(Vec::new());
    };
    let lens: Vec<usize> = values.iter().map(|value| value.len).collect();
    let flat = read(values.into_iter().map(|value| value.parts).collect())?;
    let mut at = 0;
    Ok(lens
        .into_iter()
        .map(|len| {
            let part = flat[at..at + len].to_vec();
            at += len;
            part
        })
        .collect())
}

/// What turns a step's values, as read, into its statistics; a non-finite loss or gradient
/// norm is its error.
type Decode = Box<dyn FnOnce(&[f32]) -> Result<StepStats, TrainError>>;

/// A step's [`StepStats`], read from the device when the caller asks (a logged step), not when
/// the step is queued.
pub(crate) struct PendingStats {
    values: Option<DeviceValues>,
    decode: Decode,
    waits: bool,
}

impl PendingStats {
    /// Statistics already on the host.
    pub(crate) fn ready(stats: StepStats) -> Self {
        Self::later(None, move |_| Ok(stats), false)
    }

    /// Statistics `decode` makes of `values` once they are read (of nothing, without values);
    /// `waits`: reading them waits for the step queued on a device.
    pub(crate) fn later(
        values: Option<DeviceValues>,
        decode: impl FnOnce(&[f32]) -> Result<StepStats, TrainError> + 'static,
        waits: bool,
    ) -> Self {
        Self {
            values,
            decode: Box::new(decode),
            waits,
        }
    }

    /// Whether reading waits for queued device work: for every step queued before the read, not
    /// only this one (the loop's step times rely on it).
    pub(crate) fn waits(&self) -> bool {
        self.waits
    }

    /// The statistics; a non-finite loss or gradient norm is the step's error.
    pub(crate) fn read(self) -> Result<StepStats, TrainError> {
        let (mut stats, _) = read_together(vec![self], None)?;
        Ok(stats.remove(0))
    }
}

impl std::fmt::Debug for PendingStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingStats")
    }
}

/// The statistics of `pending` in order, and the ranks' agreement on stopping `vote` (a value
/// above 0: some rank asked to stop), with one host read. The first non-finite step is the
/// error.
pub(crate) fn read_together(
    pending: Vec<PendingStats>,
    vote: Option<DeviceValues>,
) -> Result<(Vec<StepStats>, bool), TrainError> {
    let mut values = Vec::new();
    let mut decoders = Vec::with_capacity(pending.len());
    for step in pending {
        decoders.push((step.values.is_some(), step.decode));
        values.extend(step.values);
    }
    let voted = vote.is_some();
    values.extend(vote);
    let mut read = read_all(values)?.into_iter();
    let mut stats = Vec::with_capacity(decoders.len());
    for (on_device, decode) in decoders {
        let values = if on_device { read.next() } else { None };
        stats.push(decode(values.as_deref().unwrap_or_default())?);
    }
    let stop = voted
        && read
            .next()
            .is_some_and(|vote| vote.iter().any(|&v| v > 0.0));
    Ok((stats, stop))
}
