//! What the preset tests share: a shipped preset, loaded as `recipe plan` loads it (no
//! overrides, no environment).

use std::path::Path;

use ferrotron_recipe::{LoadOptions, Recipe, load};

/// `recipes/<name>.yaml`.
pub(crate) fn load_preset(name: &str) -> Recipe {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../recipes")
        .join(format!("{name}.yaml"));
    let options = LoadOptions {
        overrides: &[],
        use_env: false,
    };
    load(&path, &options)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .recipe
}
