//! End-to-end tests of `recipe plan` (the real binary, real files).
