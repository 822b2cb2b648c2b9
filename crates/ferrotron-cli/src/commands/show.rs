//! `recipe show` (being built; see the open issue that owns it).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`recipe show` is not built yet")
}
