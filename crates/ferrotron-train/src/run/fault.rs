//! Named fault-injection points, so the CLI's tests can make a real run fail where only a bug or
//! an engine error would: burn's op traits have no error channel, so those arrive as panics in
//! the middle of a step, and the run must still end with its manifest `failed`.
//!
//! The points are the `fail` crate's, compiled in only with the `failpoints` feature (which the
//! CLI's dev-dependencies turn on for its tests) and configured from `FAILPOINTS`, e.g.
//! `FAILPOINTS='train-step=2*off->panic(injected)'`. A release binary has none.

/// The fault configuration of this process, from `FAILPOINTS`; kept alive for the whole run.
#[derive(Debug)]
pub struct FaultInjection {
    /// Held, not read: dropping it clears the configuration.
    #[cfg(feature = "failpoints")]
    _scenario: fail::FailScenario<'static>,
}

impl FaultInjection {
    /// Read `FAILPOINTS` where fault injection is compiled in; nothing otherwise.
    pub fn from_env() -> Self {
        FaultInjection {
            #[cfg(feature = "failpoints")]
            _scenario: fail::FailScenario::setup(),
        }
    }
}
