//! placeholder while the sweep tests are written
