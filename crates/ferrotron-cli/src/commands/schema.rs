//! `recipe schema`: the JSON Schema of the recipe format, generated from the types. The same
//! text is committed at `schema/recipe.schema.json` for editors (yaml-language-server) and a
//! test fails when the two differ.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(_args: Args) -> anyhow::Result<ExitCode> {
    print!("{}", ferrotron_recipe::json_schema_pretty());
    Ok(ExitCode::SUCCESS)
}
