//! End-to-end tests of `recipe validate` (the real binary, real files).
