//! End-to-end tests of `recipe preprocess` (the real binary, real files).
