//! Asynchronous saves (Megatron's `--async-save`, the recipe's `checkpoint.async_save`): the
//! step pays only for the snapshot, the host copies of this rank's shards that the synchronous
//! save takes too; a thread of the rank writes and fsyncs its files while training goes on, and
//! rank 0's thread then hashes every file and commits the folder exactly as [`super::save`]
//! does, so the bytes on disk are the synchronous save's.
//!
//! The writer threads must not use the communicators: a collective issued from a second thread
//! would interleave with the training's and break the one order every member of a group must
//! keep. So the ranks tell rank 0 through the shared folder instead: each writer leaves a
//! marker once its files are durable (empty) or failed (the error), and rank 0's writer commits
//! when every marker is there and empty, after removing them. The collective part, agreeing
//! that every rank's writer succeeded, happens on the training thread when the save is
//! [`SaveInFlight::settle`]d: before the next save (at most one in flight, so at most one
//! snapshot held in host memory), at the last step and at a stop. A kill at any moment leaves
//! the last committed checkpoint, since only the rename commits.
//!
//! Values still on the device (the optimizer's masters and moments, `ShardValues::Device`) are
//! read by the writer first, beside the next step's forward and backward (`FusedOps::read_later`),
//! and the next update waits at the [`SnapshotGate`] until they are: so a save stops training only for what
//! those copies take beyond the step's own work, and the state is updated in place as ever (a
//! buffer the snapshot still held would make the device's AdamW write a new one beside it).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrotron_parallel::ParallelContext;

use super::save::{
    CheckpointInfo, FinishInfo, WorldFolder, agree, begin_world, finish, write_rank_files,
};
use super::store::CheckpointStore;
use super::tensors::ShardTensor;
use crate::TrainError;

const MARKER_PREFIX: &str = ".written-rank-";
/// How often rank 0's writer looks for the other ranks' markers.
const POLL: Duration = Duration::from_millis(20);

/// A checkpoint whose files are being written by this rank's writer thread.
#[derive(Debug)]
pub struct SaveInFlight {
    iteration: u64,
    temp: PathBuf,
    target: PathBuf,
    writer: JoinHandle<Result<(), TrainError>>,
    gate: SnapshotGate,
}

/// Opened once a save's writer has read every device value of its snapshot (or has stopped):
/// the optimizer waits for it before it next writes its state.
#[derive(Debug, Clone, Default)]
pub struct SnapshotGate(Arc<(Mutex<bool>, Condvar)>);

impl SnapshotGate {
    pub(crate) fn open(&self) {
        let (opened, changed) = &*self.0;
        *opened
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
        changed.notify_all();
    }

    /// Blocks until the gate is open; returns how long that took.
    pub fn wait(&self) -> Duration {
        let start = Instant::now();
        let (opened, changed) = &*self.0;
        let mut open = opened
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while !*open {
            open = changed
                .wait(open)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        start.elapsed()
    }
}

/// Opens its gate when dropped: a writer that fails or panics before reading everything must
/// not hold the training thread.
struct OpenOnDrop(SnapshotGate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Start saving a checkpoint at `info.state.iteration` with this rank's shards. Collective
/// (rank 0 prepares the folder and every rank learns it exists); the writing is not: it returns
/// as soon as the writer thread has the shards. Rank 0's writer waits for the other ranks' files
/// up to the recipe's distributed timeout.
pub fn start_sharded_save(
    store: &CheckpointStore,
    ctx: &ParallelContext,
    info: &CheckpointInfo<'_>,
    shards: (Vec<ShardTensor>, Vec<ShardTensor>),
) -> Result<SaveInFlight, TrainError> {
    let folder = begin_world(store, ctx, info.state.iteration)?;
    let WorldFolder {
        rank,
        world,
        temp,
        target,
    } = folder;
    let job = WriterJob {
        store: store.clone(),
        temp: temp.clone(),
        rank,
        world,
        finish: (rank == 0).then(|| FinishInfo::of(info)),
        timeout: info.recipe.parallel.distributed_timeout(),
    };
    let gate = SnapshotGate::default();
    let read = OpenOnDrop(gate.clone());
    let writer = std::thread::Builder::new()
        .name(format!("ferrotron-checkpoint-writer-{rank}"))
        .spawn(move || job.run(shards, read))
        .map_err(|e| TrainError::checkpoint(&temp, format!("cannot start its writer: {e}")))?;
    Ok(SaveInFlight {
        iteration: info.state.iteration,
        temp,
        target,
        writer,
        gate,
    })
}

impl SaveInFlight {
    /// The iteration being saved.
    pub fn iteration(&self) -> u64 {
        self.iteration
    }

    /// Opens once the writer has read the snapshot's device values.
    pub fn gate(&self) -> SnapshotGate {
        self.gate.clone()
    }

    /// Wait for this rank's writer, then agree with every rank that all succeeded
    /// (collective): the committed folder on every rank, or an error on every rank.
    pub fn settle(self, ctx: &ParallelContext) -> Result<PathBuf, TrainError> {
        let outcome = self.writer.join().unwrap_or_else(|_| {
            Err(TrainError::checkpoint(
                &self.temp,
                "its writer thread panicked".to_owned(),
            ))
        });
        agree(
            ctx,
            &self.temp,
            outcome,
            "write and commit the checkpoint in the background",
        )?;
        Ok(self.target)
    }
}

/// What one rank's writer thread owns.
struct WriterJob {
    store: CheckpointStore,
    temp: PathBuf,
    rank: u32,
    world: u32,
    /// Rank 0's: what it records when it commits.
    finish: Option<FinishInfo>,
    timeout: Duration,
}

impl WriterJob {
    fn run(
        self,
        (mut model, mut optimizer): (Vec<ShardTensor>, Vec<ShardTensor>),
        read: OpenOnDrop,
    ) -> Result<(), TrainError> {
        // Off the device first, the next update held back only for that; into host values
        // after it is let go.
        for shard in model.iter().chain(&optimizer) {
            shard.values.fetch_device();
        }
        drop(read);
        for shard in model.iter_mut().chain(&mut optimizer) {
            shard.values.read_device();
        }
        let written = write_rank_files(&self.temp, self.rank, self.world, &model, &optimizer);
        // the snapshot's host memory goes back before rank 0 waits for the others
        drop((model, optimizer));
        let marker = marker_path(&self.temp, self.rank);
        let note = written
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        fs::write(&marker, note).map_err(|e| TrainError::io("write", &marker, e))?;
        written?;
        match &self.finish {
            Some(info) => {
                self.wait_for_every_rank()?;
                finish(&self.store, &self.temp, self.world, info).map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// Rank 0: every rank's marker present and empty, then the markers removed (they are not
    /// part of the checkpoint).
    fn wait_for_every_rank(&self) -> Result<(), TrainError> {
        let start = Instant::now();
        for rank in 0..self.world {
            let marker = marker_path(&self.temp, rank);
            let note = loop {
                match fs::read_to_string(&marker) {
                    Ok(note) => break note,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        if start.elapsed() > self.timeout {
                            return Err(TrainError::checkpoint(
                                &self.temp,
                                format!(
                                    "rank {rank} did not finish writing its shards within {:?}; \
                                     nothing was committed",
                                    self.timeout
                                ),
                            ));
                        }
                        std::thread::sleep(POLL);
                    }
                    Err(e) => return Err(TrainError::io("read", &marker, e)),
                }
            };
            if !note.is_empty() {
                return Err(TrainError::checkpoint(
                    &self.temp,
                    format!(
                        "rank {rank} failed to write its shards ({note}); nothing was committed"
                    ),
                ));
            }
        }
        for rank in 0..self.world {
            let marker = marker_path(&self.temp, rank);
            fs::remove_file(&marker).map_err(|e| TrainError::io("remove", &marker, e))?;
        }
        Ok(())
    }
}

fn marker_path(temp: &Path, rank: u32) -> PathBuf {
    temp.join(format!("{MARKER_PREFIX}{rank}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{OpenOnDrop, SnapshotGate};

    #[test]
    fn the_gate_holds_the_optimizer_until_the_writer_has_read_the_snapshot() {
        let gate = SnapshotGate::default();
        let read = OpenOnDrop(gate.clone());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(read);
        });
        assert!(gate.wait() >= Duration::from_millis(40));
        writer.join().unwrap();
        gate.wait(); // an open gate stays open
    }

    #[test]
    fn a_writer_that_panics_before_reading_everything_opens_the_gate() {
        let gate = SnapshotGate::default();
        let read = OpenOnDrop(gate.clone());
        let writer = std::thread::spawn(move || {
            let _read = read;
            panic!("the device read failed");
        });
        assert!(writer.join().is_err());
        gate.wait();
    }
}
