//! How a failure reaches the user: one line of error text, and never a bare panic.
//!
//! Library errors name their cause in their own message (`cannot listen on …: Address in use
//! (os error 98)`) and also return it as their `source`, so anyhow's `{:#}` printed it twice.
//! [`describe`] walks the chain and leaves out a cause the text already ends with.
//!
//! burn's op traits have no error channel, so an engine error inside an op is a panic; so is
//! any bug. [`catching`] turns a panic of the training into an error like any other, so the run
//! manifest still ends `failed` with the message and the exit code.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// `eprint!` for `recipe run`'s own lines, which must not panic: with its stderr reader gone (a
/// `| tee` that died, a killed launcher) a run still trains, saves and exits with its own code.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

/// [`say!`] with a newline.
macro_rules! sayln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use {say, sayln};

/// The error and its causes on one line, `: `-separated, each cause once.
pub(crate) fn describe(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// `work()`, with a panic turned into an error carrying the panic's message.
pub(crate) fn catching<T>(work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_owned());
        Err(anyhow::anyhow!("the run panicked: {message}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:9: {source}")]
    struct Bind {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let source = std::io::Error::new(std::io::ErrorKind::AddrInUse, "in use (os error 98)");
        let err = anyhow::Error::new(Bind { source }).context("starting /metrics");
        assert_eq!(
            describe(&err),
            "starting /metrics: cannot listen on 127.0.0.1:9: in use (os error 98)"
        );
    }

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        let err = catching::<()>(|| panic!("index 50257 out of range")).expect_err("caught");
        assert_eq!(
            err.to_string(),
            "the run panicked: index 50257 out of range"
        );
        let err = catching::<()>(|| panic!("{}", String::from("owned"))).expect_err("caught");
        assert_eq!(err.to_string(), "the run panicked: owned");
        assert_eq!(catching(|| Ok(7)).expect("no panic"), 7);
    }
}
