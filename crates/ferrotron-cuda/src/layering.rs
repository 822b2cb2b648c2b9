//! The crate's layers import only downward: `engine` ← `kernels` (`prim` ← `fused`, `fp8`) ←
//! `blas` ← `cudnn` ← `backend`, with `nccl` on the engine alone. A test rather than a
//! convention, because the import circle this order replaced grew one `use` at a time.

use std::path::Path;

/// The layers a file under `dir` must not import (`crate::<path>`).
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("engine", &["kernels", "blas", "cudnn", "nccl", "backend"]),
    (
        "kernels/prim",
        &[
            "kernels::fused",
            "kernels::fp8",
            "blas",
            "cudnn",
            "nccl",
            "backend",
        ],
    ),
    ("kernels", &["blas", "cudnn", "nccl", "backend"]),
    (
        "blas",
        &["kernels::fused", "kernels::fp8", "cudnn", "nccl", "backend"],
    ),
    ("cudnn", &["nccl", "backend"]),
    ("nccl", &["kernels", "blas", "cudnn", "backend"]),
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(file, line)` of every code line (comments left out) under `src/<dir>` naming `crate::<layer>`.
fn upward_imports(dir: &str, layers: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source file");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if layers.iter().any(|layer| {
                code.contains(&format!("crate::{layer}::"))
                    || code.contains(&format!("crate::{layer};"))
            }) {
                found.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn layers_import_only_downward() {
    for (dir, layers) in FORBIDDEN {
        let found = upward_imports(dir, layers);
        assert!(
            found.is_empty(),
            "{dir} imports a layer above it:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn an_upward_import_is_found() {
    // The check itself: the backend does import the kernels, so asking it not to must fail.
    assert!(!upward_imports("backend", &["kernels"]).is_empty());
}
