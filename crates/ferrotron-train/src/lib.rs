//! Training loop, optimizer, LR schedules and checkpoints
