//! End-to-end tests of `recipe run` (the real binary, real files).
