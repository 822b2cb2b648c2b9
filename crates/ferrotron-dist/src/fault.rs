//! How a fault point (the `fail` crate's, compiled in only for the tests, configured from
//! `FAILPOINTS`) makes a rank die the ways real ranks die: `panic(msg)` unwinds, `sleep(ms)` and
//! `pause` hang, and `return(WHAT)` calls [`die`]: `exit:CODE` ends the process without
//! unwinding (a rank that calls `exit` in a library), `kill` has it killed by SIGKILL (no
//! cleanup at all, as the OOM killer does). The fault tests put such points before, inside and
//! after a collective.

/// Ends this process as `what` says (see the module docs); a malformed `what` exits 1.
pub fn die(what: Option<String>) -> ! {
    let what = what.unwrap_or_default();
    if what == "kill" {
        let me = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &me])
            .status();
        // The signal is on its way; never return into the run.
        loop {
            std::thread::park();
        }
    }
    let code = what
        .strip_prefix("exit:")
        .and_then(|code| code.parse().ok())
        .unwrap_or(1);
    std::process::exit(code)
}
