//! How much a recipe may make the loader do. A recipe is a few kilobytes written by people; the
//! limits sit orders of magnitude above that and far below what hurts a machine, so a hostile or
//! broken file (a 387-byte alias bomb that expands to billions of nodes, a document nested a
//! million deep, an `extends:` chain of thousands of files, `/dev/zero` or a 3 GB file named as
//! a recipe) ends in a located error instead of the OOM killer, a stack overflow or a read that
//! never ends.
//!
//! The file reader refuses an oversized file before reading it; the tree builder checks the size
//! again for text that came another way (`--set`, [`crate::load_str`]) and enforces the other
//! limits itself rather than through `serde-saphyr`'s `Budget`, because the expansion happens
//! there: an alias is a copy of a subtree, and only the builder knows how large that subtree is
//! before copying it.

/// Bytes of one recipe file (or one `--set` value). The largest shipped recipe is about 3 KiB.
/// A file is read no further than one byte past this ([`crate::loader::read_text`]).
pub(crate) const MAX_INPUT_BYTES: usize = 1 << 20;
/// Nested mappings and sequences. A recipe needs 4 (`data.blend.0.path`).
pub(crate) const MAX_DEPTH: usize = 64;
/// Nodes of one file's tree with every alias expanded: what an alias bomb multiplies.
pub(crate) const MAX_NODES: usize = 100_000;
/// Files in one `extends:` chain, the top recipe included.
pub(crate) const MAX_EXTENDS_DEPTH: usize = 32;
