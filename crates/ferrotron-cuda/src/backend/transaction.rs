//! `TransactionOps` for [`Cuda`]: burn's default reads each tensor in turn. Every read
//! synchronises the one compute stream, so after the first read the rest are plain copies; a
//! batched read would save only the per-tensor copy launch.

use burn::tensor::ops::TransactionOps;

use super::Cuda;

impl TransactionOps<Cuda> for Cuda {}
