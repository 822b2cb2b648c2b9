//! The checkpoint directory: one `iter_NNNNNNN/` folder per checkpoint, written under a
//! temporary name, every file fsynced, a `COMMITTED` marker written last, then renamed into
//! place. A crash at any point leaves either the previous checkpoints untouched or a `.tmp-`
//! folder that resume ignores, never a half-written checkpoint that looks whole.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::TrainError;

/// The file whose presence says a checkpoint folder is complete.
pub const COMMIT_MARKER: &str = "COMMITTED";
const PREFIX: &str = "iter_";
const TEMP_PREFIX: &str = ".tmp-";

/// A directory of checkpoints, newest last, keeping at most `keep_last`.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep_last: Option<u32>,
}

/// A committed checkpoint's iteration and folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedCheckpoint {
    pub iteration: u64,
    pub path: PathBuf,
}

impl CheckpointStore {
    pub fn new(dir: impl Into<PathBuf>, keep_last: Option<u32>) -> Self {
        CheckpointStore {
            dir: dir.into(),
            keep_last,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The folder name of the checkpoint at `iteration` (Megatron's `iter_0000100`).
    pub fn folder_name(iteration: u64) -> String {
        format!("{PREFIX}{iteration:07}")
    }

    /// Write a checkpoint atomically: `write` fills a temporary folder, then every file in it is
    /// fsynced, the commit marker added and the folder renamed to `iter_NNNNNNN`. Older
    /// checkpoints beyond `keep_last` are removed afterwards. Returns the committed folder.
    pub fn save(
        &self,
        iteration: u64,
        write: impl FnOnce(&Path) -> Result<(), TrainError>,
    ) -> Result<PathBuf, TrainError> {
        let temp = self.temp_folder(iteration, &std::process::id().to_string());
        self.begin(&temp)?;
        write(&temp)?;
        self.commit(iteration, &temp)
    }

    /// The temporary folder of the checkpoint at `iteration`. Writers that share one folder
    /// (the ranks of a world, possibly in several processes) pass the same `tag`.
    pub fn temp_folder(&self, iteration: u64, tag: &str) -> PathBuf {
        self.dir.join(format!(
            "{TEMP_PREFIX}{}-{tag}",
            Self::folder_name(iteration)
        ))
    }

    /// Create `temp` empty (a leftover of a crashed attempt is removed first).
    pub fn begin(&self, temp: &Path) -> Result<(), TrainError> {
        fs::create_dir_all(&self.dir).map_err(|e| TrainError::io("create", &self.dir, e))?;
        if temp.exists() {
            fs::remove_dir_all(temp).map_err(|e| TrainError::io("remove", temp, e))?;
        }
        fs::create_dir(temp).map_err(|e| TrainError::io("create", temp, e))
    }

    /// Commit a filled temporary folder: fsync every file, write the marker, rename it to
    /// `iter_NNNNNNN` (replacing an older one of the same iteration), fsync the directory,
    /// prune beyond `keep_last`.
    pub fn commit(&self, iteration: u64, temp: &Path) -> Result<PathBuf, TrainError> {
        let name = Self::folder_name(iteration);
        sync_files_in(temp)?;
        let marker = temp.join(COMMIT_MARKER);
        fs::write(&marker, format!("{iteration}\n"))
            .map_err(|e| TrainError::io("write", &marker, e))?;
        sync_path(&marker)?;
        sync_path(temp)?;

        let target = self.dir.join(&name);
        if target.exists() {
            // Re-saving an iteration (a resumed run stopped at the same step): move the old one
            // aside first, since rename cannot replace a non-empty directory.
            let old = self
                .dir
                .join(format!("{TEMP_PREFIX}old-{name}-{}", std::process::id()));
            fs::rename(&target, &old).map_err(|e| TrainError::io("move aside", &target, e))?;
            fs::rename(temp, &target).map_err(|e| TrainError::io("commit", &target, e))?;
            fs::remove_dir_all(&old).map_err(|e| TrainError::io("remove", &old, e))?;
        } else {
            fs::rename(temp, &target).map_err(|e| TrainError::io("commit", &target, e))?;
        }
        sync_path(&self.dir)?;
        self.prune()?;
        Ok(target)
    }

    /// Committed checkpoints, oldest first. Folders without the marker (interrupted writes)
    /// and temporary folders are not checkpoints.
    pub fn committed(&self) -> Result<Vec<CommittedCheckpoint>, TrainError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(TrainError::io("read", &self.dir, e)),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| TrainError::io("read", &self.dir, e))?;
            let file_name = entry.file_name();
            let Some(iteration) = file_name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let path = entry.path();
            if path.join(COMMIT_MARKER).is_file() {
                found.push(CommittedCheckpoint { iteration, path });
            }
        }
        found.sort_by_key(|c| c.iteration);
        Ok(found)
    }

    /// The newest committed checkpoint, if any.
    pub fn latest(&self) -> Result<Option<CommittedCheckpoint>, TrainError> {
        Ok(self.committed()?.pop())
    }

    fn prune(&self) -> Result<(), TrainError> {
        let Some(keep) = self.keep_last else {
            return Ok(());
        };
        let committed = self.committed()?;
        let excess = committed.len().saturating_sub(keep as usize);
        for old in &committed[..excess] {
            fs::remove_dir_all(&old.path).map_err(|e| TrainError::io("remove", &old.path, e))?;
        }
        Ok(())
    }
}

/// Whether `path` is a committed checkpoint folder.
pub fn is_committed(path: &Path) -> bool {
    path.join(COMMIT_MARKER).is_file()
}

pub(crate) fn sync_files_in(dir: &Path) -> Result<(), TrainError> {
    for entry in fs::read_dir(dir).map_err(|e| TrainError::io("read", dir, e))? {
        let path = entry.map_err(|e| TrainError::io("read", dir, e))?.path();
        if path.is_file() {
            sync_path(&path)?;
        }
    }
    Ok(())
}

/// fsync a file or a directory (a directory's fsync makes renames and new entries durable).
pub(crate) fn sync_path(path: &Path) -> Result<(), TrainError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainError::io("fsync", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save_one(store: &CheckpointStore, iteration: u64) -> PathBuf {
        store
            .save(iteration, |dir| {
                fs::write(dir.join("data"), iteration.to_string())
                    .map_err(|e| TrainError::io("write", dir, e))
            })
            .expect("save works")
    }

    #[test]
    fn save_commits_and_keeps_last() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(root.path().join("ckpt"), Some(2));
        for iteration in [10, 20, 30] {
            save_one(&store, iteration);
        }
        let committed = store.committed().expect("list");
        let iterations: Vec<u64> = committed.iter().map(|c| c.iteration).collect();
        assert_eq!(iterations, [20, 30]);
        let latest = store.latest().expect("list").expect("one exists");
        assert_eq!(
            latest.path.file_name().and_then(|n| n.to_str()),
            Some("iter_0000030")
        );
        assert_eq!(
            fs::read_to_string(latest.path.join("data")).expect("read"),
            "30"
        );
        assert!(is_committed(&latest.path));
    }

    #[test]
    fn uncommitted_folders_are_ignored() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(root.path(), None);
        save_one(&store, 5);
        // a crash mid-write: a temp folder, and a final-looking folder without the marker
        fs::create_dir_all(root.path().join(".tmp-iter_0000009-1")).expect("mkdir");
        fs::create_dir_all(root.path().join("iter_0000010")).expect("mkdir");
        let latest = store.latest().expect("list").expect("one exists");
        assert_eq!(latest.iteration, 5);
    }

    #[test]
    fn failed_write_commits_nothing() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(root.path(), None);
        let err = store
            .save(7, |_| Err(TrainError::Config("disk full".into())))
            .expect_err("write failed");
        assert_eq!(err.to_string(), "disk full");
        assert!(store.latest().expect("list").is_none());
    }

    #[test]
    fn resaving_an_iteration_replaces_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(root.path(), None);
        save_one(&store, 3);
        let path = store
            .save(3, |dir| {
                fs::write(dir.join("data"), "new").map_err(|e| TrainError::io("write", dir, e))
            })
            .expect("save works");
        assert_eq!(fs::read_to_string(path.join("data")).expect("read"), "new");
        assert_eq!(store.committed().expect("list").len(), 1);
    }

    #[test]
    fn missing_directory_has_no_checkpoints() {
        let root = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(root.path().join("absent"), None);
        assert!(store.latest().expect("list").is_none());
    }
}
