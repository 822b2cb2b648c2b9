//! Loading a recipe: files (with their `extends:` chain) → environment → `--set` → path
//! resolution → schema → typed [`Recipe`] → semantic rules. Every step adds to one list of
//! problems; the load fails with all of them, or returns a recipe that is valid.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::diagnostic::{Problem, RecipeErrors, codes};
use crate::layers;
use crate::limits::{MAX_EXTENDS_DEPTH, MAX_INPUT_BYTES};
use crate::node::{Node, NodeValue};
use crate::source::{Origin, SourceFile};
use crate::{Finding, Recipe, Severity};

/// How to load: the override layers above the files.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions<'a> {
    /// `dot.path=value` overrides (the value is parsed as YAML), applied last.
    pub overrides: &'a [String],
    /// Read `FERROTRON_SECTION__KEY=value` environment overrides (applied before `overrides`).
    pub use_env: bool,
}

/// A valid recipe plus what it was made from: the source files and the merged tree that knows
/// the origin of every value (for diagnostics from other crates and `recipe show --origin`).
#[derive(Debug, Clone)]
pub struct LoadedRecipe {
    pub recipe: Recipe,
    pub(crate) files: Vec<SourceFile>,
    pub(crate) tree: Node,
    warnings: Vec<Problem>,
}

/// Where the loader reads recipe files from: the file system, or (for `recipe diff REV:path`)
/// a git revision. `extends:` paths are joined to the including file's directory first, so a
/// reader only ever sees the path a file would have in a checkout.
pub trait SourceReader {
    /// The text of the recipe file at `path`.
    fn read(&self, path: &Path) -> std::io::Result<String>;
    /// The name diagnostics and origins show for `path` (`recipes/a.yaml`, `main:recipes/a.yaml`).
    fn display_name(&self, path: &Path) -> String {
        path.display().to_string()
    }
    /// What makes two paths the same file, to detect `extends` cycles.
    fn identity(&self, path: &Path) -> PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
    }
}

/// Recipe files on disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSystem;

impl SourceReader for FileSystem {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        read_text(path)
    }
}

/// The text of a recipe-like file (a recipe, a base, a sweep file), read so that no path can make
/// it hang or fill memory: what is not a regular file is refused before it is opened (`/dev/zero`
/// never ends, a FIFO blocks the open), as is a file larger than a recipe may be (1 MiB); and at
/// most one byte past that limit is read, for a file whose size metadata does not tell (`/proc`)
/// or that grows while it is read.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let kind = std::fs::metadata(path)?.file_type();
    if !kind.is_file() {
        return Err(not_a_file(kind));
    }
    let file = std::fs::File::open(path)?;
    // Checked again on the open file: the path may have been replaced in between.
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(not_a_file(metadata.file_type()));
    }
    if metadata.len() > MAX_INPUT_BYTES as u64 {
        return Err(too_large(Some(metadata.len())));
    }
    text_from(file)
}

/// The text `source` yields, refused once it passes the size limit of a recipe (one byte past the
/// limit is all that is read of it); for sources with no size to check first, such as `git show`.
pub fn text_from(source: impl std::io::Read) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    source
        .take(MAX_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(too_large(None));
    }
    utf8_text(bytes)
}

/// A file over the limit, with its size when that is known without reading it.
fn too_large(size: Option<u64>) -> std::io::Error {
    let message = match size {
        Some(size) => {
            format!("it is {size} bytes; a recipe file may have at most {MAX_INPUT_BYTES}")
        }
        None => format!("it is over {MAX_INPUT_BYTES} bytes, the most a recipe file may have"),
    };
    std::io::Error::new(std::io::ErrorKind::FileTooLarge, message)
}

/// What a path that is no regular file is, as an error that names it.
fn not_a_file(kind: std::fs::FileType) -> std::io::Error {
    #[cfg(unix)]
    let special = {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() {
            Some("a character device")
        } else if kind.is_block_device() {
            Some("a block device")
        } else if kind.is_fifo() {
            Some("a named pipe (FIFO)")
        } else if kind.is_socket() {
            Some("a socket")
        } else {
            None
        }
    };
    #[cfg(not(unix))]
    let special = None;
    let (what, error_kind) = if kind.is_dir() {
        ("a directory", std::io::ErrorKind::IsADirectory)
    } else {
        (
            special.unwrap_or("a special file"),
            std::io::ErrorKind::InvalidInput,
        )
    };
    std::io::Error::new(error_kind, format!("it is {what}, not a regular file"))
}

/// The bytes as text, or an `InvalidData` error that says where the first byte that is not
/// UTF-8 is (a recipe saved as Latin-1 or UTF-16 is fixed at that spot, not by its path).
pub fn utf8_text(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let before = &bytes[..offset];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text: byte {offset} (line {line}, column {column}) is 0x{:02x}",
                bytes[offset]
            ),
        )
    })
}

/// Load a recipe file. Relative paths inside a file are resolved against that file's directory.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedRecipe, RecipeErrors> {
    load_with(path, opts, &FileSystem)
}

/// [`load`], reading the file and its `extends:` chain through `reader`.
pub fn load_with(
    path: &Path,
    opts: &LoadOptions,
    reader: &dyn SourceReader,
) -> Result<LoadedRecipe, RecipeErrors> {
    let name = reader.display_name(path);
    let text = reader.read(path).map_err(|e| {
        RecipeErrors::new(
            &name,
            vec![
                Problem::error(codes::UNREADABLE, format!("cannot read `{name}`: {e}"))
                    .with_help(Some(unreadable_help(&e).to_owned())),
            ],
        )
    })?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let identity = reader.identity(path);
    Loader::new(reader).run(name, dir, identity, text, opts)
}

/// The fix for a recipe file that cannot be read, by what went wrong.
fn unreadable_help(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::InvalidData => "save the recipe as UTF-8",
        std::io::ErrorKind::FileTooLarge => {
            "a recipe describes a run; data belongs in the files it names"
        }
        std::io::ErrorKind::IsADirectory | std::io::ErrorKind::InvalidInput => {
            "name a recipe file (YAML)"
        }
        _ => "check the path and its permissions",
    }
}

/// Load a recipe from text; `extends:` and relative paths resolve against the current directory.
pub fn load_str(name: &str, text: &str, opts: &LoadOptions) -> Result<LoadedRecipe, RecipeErrors> {
    let identity = PathBuf::from(format!("<{name}>"));
    Loader::new(&FileSystem).run(
        name.to_owned(),
        PathBuf::new(),
        identity,
        text.to_owned(),
        opts,
    )
}

struct Loader<'r> {
    reader: &'r dyn SourceReader,
    files: Vec<SourceFile>,
    problems: Vec<Problem>,
}

impl<'r> Loader<'r> {
    fn new(reader: &'r dyn SourceReader) -> Self {
        Loader {
            reader,
            files: Vec::new(),
            problems: Vec::new(),
        }
    }

    fn run(
        mut self,
        name: String,
        dir: PathBuf,
        identity: PathBuf,
        text: String,
        opts: &LoadOptions,
    ) -> Result<LoadedRecipe, RecipeErrors> {
        let top = self.add_file(name.clone(), dir, text);
        let tree = self.read_chain(top, &mut vec![identity]);
        let (overrides, problems) = layers::from_args(opts.overrides);
        self.problems.extend(problems);
        let Some(mut tree) = tree else {
            return Err(RecipeErrors::new(name, self.problems));
        };
        // A recipe in another format version is not checked further: its keys mean something
        // else, and every renamed key would be reported as unknown. One error says what to do.
        if let Some(problem) = crate::version::check_merged(&tree, &self.files, top) {
            self.problems.push(problem);
        }
        if self
            .problems
            .iter()
            .any(|p| p.code() == codes::FORMAT_VERSION)
        {
            return Err(RecipeErrors::new(name, self.problems));
        }
        let mut all = if opts.use_env {
            layers::from_env(&crate::schema::allowed_keys(""))
        } else {
            Vec::new()
        };
        all.extend(overrides);
        let problems = layers::apply(&mut tree, all, &self.files);
        self.problems.extend(problems);
        resolve_paths(&mut tree, &self.files);
        self.fill_cache_dir(&mut tree, top);

        let json = tree.to_json();
        let non_finite = crate::finite::check(&tree, &self.files);
        let mut schema_problems = crate::schema::check(&tree, &json, &self.files);
        // A non-finite number is null in JSON; the schema's "found null" would say it again.
        schema_problems.retain(|p| {
            p.code() == codes::UNKNOWN_KEY || !non_finite.iter().any(|n| n.path() == p.path())
        });
        self.problems.extend(non_finite);
        let fragment = matches!(
            tree.at("abstract"),
            Some(Node {
                value: NodeValue::Bool(true),
                ..
            })
        );
        let schema_ok = schema_problems.is_empty();
        self.problems.extend(schema_problems);
        if fragment {
            return Err(self.fragment(name, &tree));
        }
        if !schema_ok || self.has_errors() {
            let partial = crate::partial::Partial::new(&tree, &self.files, &self.problems);
            let mut errors = RecipeErrors::new(name, self.problems).with_partial(partial);
            errors.check_partial(&crate::rules::check_rules);
            return Err(errors);
        }
        let recipe: Recipe = match serde_json::from_value(json) {
            Ok(recipe) => recipe,
            Err(e) => {
                self.problems.push(
                    Problem::error(
                        codes::VALUE,
                        format!("the recipe does not fit its types: {e}"),
                    )
                    .at(&tree.origin, &self.files),
                );
                return Err(RecipeErrors::new(name, self.problems));
            }
        };
        let mut loaded = LoadedRecipe {
            recipe,
            files: self.files,
            tree,
            warnings: Vec::new(),
        };
        let findings = crate::rules::check_rules(&loaded.recipe);
        let mut problems = self.problems;
        problems.extend(loaded.problems_for(&findings));
        if problems.iter().any(|p| p.severity() == Severity::Error) {
            return Err(RecipeErrors::new(name, problems));
        }
        loaded.warnings = problems;
        Ok(loaded)
    }

    /// An `abstract: true` recipe: keys left to the recipes that extend it may be missing;
    /// everything it does set is checked, the rules included (on stand-ins for what is missing).
    fn fragment(self, name: String, tree: &Node) -> RecipeErrors {
        let partial = crate::partial::Partial::new(tree, &self.files, &self.problems)
            .map(crate::partial::Partial::of_fragment);
        let mut problems: Vec<Problem> = self
            .problems
            .into_iter()
            .filter(|p| p.code() != codes::MISSING_KEY)
            .collect();
        problems.push(
            Problem::error(
                codes::ABSTRACT,
                "this recipe is `abstract: true`: a fragment to extend, not a recipe to run",
            )
            .with_path("abstract")
            .with_label("a fragment")
            .with_help(Some(
                "write a recipe with `extends:` naming this file and set what it leaves out"
                    .to_owned(),
            ))
            .at(&tree.locate("abstract", false).origin.clone(), &self.files),
        );
        let mut errors = RecipeErrors::new(name, problems).with_partial(partial);
        errors.check_partial(&crate::rules::check_rules);
        errors
    }

    fn has_errors(&self) -> bool {
        self.problems
            .iter()
            .any(|p| p.severity() == Severity::Error)
    }

    fn add_file(&mut self, name: String, dir: PathBuf, text: String) -> usize {
        self.files.push(SourceFile {
            name,
            dir,
            text: Arc::new(text),
        });
        self.files.len() - 1
    }

    /// Parse `file` and everything it extends, merged; `None` when the chain is broken (the
    /// problems say why). `stack` holds the identities of the files read so far, to catch
    /// cycles. The chain is walked in a loop, not by recursion, and is at most
    /// [`MAX_EXTENDS_DEPTH`] files long.
    fn read_chain(&mut self, file: usize, stack: &mut Vec<PathBuf>) -> Option<Node> {
        let mut layers = Vec::new();
        let mut next = Some(file);
        while let Some(file) = next {
            let (root, base) = self.read_layer(file, stack)?;
            layers.push(root);
            next = base;
        }
        let mut layers = layers.into_iter().rev();
        let base = layers.next()?;
        Some(layers.fold(base, crate::node::merge))
    }

    /// Parse one file of a chain, its `extends:` removed; with the file it extends, added.
    fn read_layer(
        &mut self,
        file: usize,
        stack: &mut Vec<PathBuf>,
    ) -> Option<(Node, Option<usize>)> {
        let (root, problems) = crate::yaml::parse(&self.files, file);
        self.problems.extend(problems);
        let mut root = root?;
        if let Some(problem) = crate::version::check_file(&root, &self.files, file) {
            self.problems.push(problem);
        }
        match root.value {
            NodeValue::Map(_) => {}
            NodeValue::Null => {
                self.problems.push(
                    Problem::error(codes::MISSING_KEY, "the recipe is empty")
                        .with_help(Some(
                            "start from a preset under recipes/ (version, name, model, training, data)"
                                .to_owned(),
                        ))
                        .at(&root.origin, &self.files),
                );
                return None;
            }
            _ => {
                self.problems.push(
                    Problem::error(codes::TYPE, "a recipe must be a mapping of sections")
                        .with_label("not a mapping")
                        .with_help(Some(
                            "write `key: value` sections (version, name, model, ...)".to_owned(),
                        ))
                        .at(&root.origin, &self.files),
                );
                return None;
            }
        }
        if file != 0 {
            // Being a fragment is not inherited: a recipe extending one is complete.
            root.remove("abstract");
        }
        let Some(extends) = root.remove("extends") else {
            return Some((root, None));
        };
        let relative = match &extends.value.value {
            NodeValue::Str(relative) => relative.clone(),
            NodeValue::Null => return Some((root, None)),
            _ => {
                self.problems.push(
                    Problem::error(codes::EXTENDS, "`extends` must be a path to a base recipe")
                        .with_path("extends")
                        .with_label("not a path")
                        .at(&extends.value.origin, &self.files),
                );
                return None;
            }
        };
        let dir = self.files[file].dir.clone();
        let path = normalize(&dir.join(&relative));
        let fail = |message: String, help: String, this: &mut Self| {
            this.problems.push(
                Problem::error(codes::EXTENDS, message)
                    .with_path("extends")
                    .with_label("this base recipe")
                    .with_help(Some(help))
                    .at(&extends.value.origin, &this.files),
            );
            None
        };
        let text = match self.reader.read(&path) {
            Ok(text) => text,
            Err(e) => {
                let help = if e.kind() == std::io::ErrorKind::NotFound {
                    format!(
                        "`extends` is relative to the directory of `{}`",
                        self.files[file].name
                    )
                } else {
                    unreadable_help(&e).to_owned()
                };
                return fail(
                    format!(
                        "cannot read base recipe `{}`: {e}",
                        self.reader.display_name(&path)
                    ),
                    help,
                    self,
                );
            }
        };
        let identity = self.reader.identity(&path);
        if let Some(start) = stack.iter().position(|p| *p == identity) {
            let mut chain: Vec<String> = stack[start..]
                .iter()
                .map(|p| {
                    p.file_name().map_or_else(
                        || p.display().to_string(),
                        |n| n.to_string_lossy().into_owned(),
                    )
                })
                .collect();
            chain.push(chain[0].clone());
            return fail(
                format!("`extends` cycle: {}", chain.join(" → ")),
                "remove one `extends:` of the cycle".to_owned(),
                self,
            );
        }
        if stack.len() >= MAX_EXTENDS_DEPTH {
            return fail(
                format!("the `extends` chain is longer than {MAX_EXTENDS_DEPTH} files"),
                "flatten some of the base recipes into one".to_owned(),
                self,
            );
        }
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base = self.add_file(self.reader.display_name(&path), base_dir, text);
        stack.push(identity);
        Some((root, Some(base)))
    }

    /// `data.cache_dir` defaults to `.ferrotron/cache` beside the top recipe; fill it here so
    /// the runtime, which never sees the recipe's location, gets a usable path.
    fn fill_cache_dir(&self, tree: &mut Node, top: usize) {
        if tree.at("data.cache_dir").is_some() {
            return;
        }
        let dir = normalize(&self.files[top].dir.join(".ferrotron/cache"));
        let NodeValue::Map(entries) = &mut tree.value else {
            return;
        };
        let data = match entries.iter().position(|e| e.key == "data") {
            Some(i) => &mut entries[i].value,
            None => return,
        };
        if let NodeValue::Map(entries) = &mut data.value {
            entries.push(crate::node::Entry {
                key: "cache_dir".to_owned(),
                key_origin: data.origin.clone(),
                value: Node {
                    value: NodeValue::Str(dir.display().to_string()),
                    origin: Origin::Default,
                },
            });
        }
    }
}

impl LoadedRecipe {
    /// Attach spans to findings produced by other crates' rules (e.g. the planner's layout
    /// rules). `Ok` holds the warnings when there is no error.
    pub fn check(&self, findings: Vec<Finding>) -> Result<Vec<Finding>, RecipeErrors> {
        if findings.iter().any(Finding::is_error) {
            return Err(RecipeErrors::new(self.name(), self.problems_for(&findings)));
        }
        Ok(findings)
    }

    /// Findings as located diagnostics (file, line, column, snippet).
    pub fn problems_for(&self, findings: &[Finding]) -> Vec<Problem> {
        locate(findings, &self.tree, &self.files)
    }

    /// Warnings found while loading (the load succeeded).
    pub fn warnings(&self) -> &[Problem] {
        &self.warnings
    }

    /// The top recipe's name as given (its path, or the name passed to [`load_str`]).
    pub fn name(&self) -> &str {
        &self.files[0].name
    }

    /// Where the value at a dot path came from: `file:line:col`, `--set ...`, `env NAME`, or
    /// `default` when no layer set it.
    pub fn origin_of(&self, path: &str) -> String {
        self.tree
            .at(path)
            .map_or_else(|| "default".to_owned(), |n| n.origin.describe(&self.files))
    }

    /// Every file that took part, top first (for `recipe show` and change detection).
    pub fn source_names(&self) -> Vec<&str> {
        self.files.iter().map(|f| f.name.as_str()).collect()
    }
}

/// Findings as located diagnostics, through the merged tree's origins.
pub(crate) fn locate(findings: &[Finding], tree: &Node, files: &[SourceFile]) -> Vec<Problem> {
    findings
        .iter()
        .map(|f| {
            let located = tree.locate(&f.path, false);
            Problem::new(f.severity, &f.code, f.message.clone())
                .with_path(&f.path)
                .with_help(f.help.clone())
                .with_label(if located.exact {
                    "here".to_owned()
                } else {
                    format!("`{}` is not set; it defaults here", f.path)
                })
                .at(located.origin, files)
        })
        .collect()
}

/// The recipe keys that hold file-system paths.
fn is_path_field(path: &str) -> bool {
    matches!(
        path,
        "data.tokenizer.vocab_file"
            | "data.tokenizer.merge_file"
            | "data.tokenizer.file"
            | "data.cache_dir"
            | "checkpoint.dir"
            | "checkpoint.resume"
            | "checkpoint.init_from.hf"
            | "logging.jsonl"
            | "logging.tensorboard"
    ) || (["data.blend.", "data.valid_blend.", "data.test_blend."]
        .iter()
        .any(|prefix| path.starts_with(prefix))
        && path.ends_with(".path"))
}

/// Make relative paths relative to the current directory, from the directory of the file that
/// set them. `--set` and environment values already are relative to the current directory.
fn resolve_paths(tree: &mut Node, files: &[SourceFile]) {
    fn walk(node: &mut Node, path: &str, files: &[SourceFile]) {
        match &mut node.value {
            NodeValue::Map(entries) => {
                for e in entries.iter_mut() {
                    let child = if path.is_empty() {
                        e.key.clone()
                    } else {
                        format!("{path}.{}", e.key)
                    };
                    walk(&mut e.value, &child, files);
                }
            }
            NodeValue::Seq(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, &format!("{path}.{i}"), files);
                }
            }
            NodeValue::Str(value) if is_path_field(path) => {
                let keyword =
                    path == "checkpoint.resume" && matches!(value.as_str(), "auto" | "never");
                if keyword || value.is_empty() || Path::new(value.as_str()).is_absolute() {
                    return;
                }
                if let Some(dir) = node.origin.base_dir(files) {
                    *value = normalize(&dir.join(value.as_str())).display().to_string();
                }
            }
            _ => {}
        }
    }
    walk(tree, "", files);
}

/// Lexically remove `.` and `name/..` (so `recipes/base/../data/x` reads `recipes/data/x`).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else if !matches!(out.components().next_back(), Some(Component::RootDir)) {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(
            normalize(Path::new("recipes/base/../data/x")),
            PathBuf::from("recipes/data/x")
        );
        assert_eq!(
            normalize(Path::new("../runs/a")),
            PathBuf::from("../runs/a")
        );
        assert_eq!(normalize(Path::new("./a/./b")), PathBuf::from("a/b"));
        assert_eq!(normalize(Path::new("a/..")), PathBuf::from("."));
    }

    const MINIMAL: &str = "version: 2\nname: t\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, seq_length: 32}\ntraining: {micro_batch_size: 2, global_batch_size: 8, train_iters: 10}\ndata:\n  tokenizer: {type: gpt2-bpe, vocab_file: v.json, merge_file: m.txt}\n  blend: [{path: d.jsonl}]\n";

    #[test]
    fn a_minimal_recipe_loads_with_origins() {
        let loaded = load_str("mini.yaml", MINIMAL, &LoadOptions::default()).expect("valid");
        assert_eq!(loaded.recipe.model.hidden_size, 64);
        assert_eq!(loaded.origin_of("model.hidden_size"), "mini.yaml:3:37");
        assert_eq!(loaded.origin_of("model.rotary_base"), "default");
        assert_eq!(
            loaded.recipe.data.cache_dir.as_deref(),
            Some(".ferrotron/cache")
        );
    }

    #[test]
    fn overrides_win_and_say_so() {
        let sets = ["model.hidden_size=128".to_owned()];
        let opts = LoadOptions {
            overrides: &sets,
            use_env: false,
        };
        let loaded = load_str("mini.yaml", MINIMAL, &opts).expect("valid");
        assert_eq!(loaded.recipe.model.hidden_size, 128);
        assert_eq!(
            loaded.origin_of("model.hidden_size"),
            "--set model.hidden_size=128"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = MINIMAL
            .replace("hidden_size: 64", "hidden_size: 'big', hiden: 3")
            .replace("train_iters: 10", "train_iters: 10, train_tokens: 5");
        let errors = load_str("bad.yaml", &text, &LoadOptions::default()).expect_err("invalid");
        let codes: Vec<&str> = errors.problems().iter().map(|p| p.code()).collect();
        // The rules ran on what parsed: the two lengths are reported, but no rule judged the
        // stand-ins for the broken hidden_size (4 heads divide neither of them).
        assert_eq!(
            codes,
            [
                "schema::type",
                "schema::unknown-key",
                "training::one-length"
            ]
        );
    }

    #[test]
    fn a_missing_required_key_gets_stand_ins_and_hides_nothing() {
        // The typo of issue 42: `hidden_size` is missing, and the query groups still get judged.
        let text = MINIMAL.replace(
            "hidden_size: 64, num_attention_heads: 4",
            "hiden_size: 64, num_attention_heads: 4, num_query_groups: 3",
        );
        let mut errors =
            load_str("typo.yaml", &text, &LoadOptions::default()).expect_err("invalid");
        let found: Vec<(&str, Option<&str>)> = errors
            .problems()
            .iter()
            .map(|p| (p.code(), p.path()))
            .collect();
        assert_eq!(
            found,
            [
                ("schema::missing-key", Some("model.hidden_size")),
                ("schema::unknown-key", Some("model.hiden_size")),
                (
                    "model::heads-divisible-by-query-groups",
                    Some("model.num_query_groups")
                ),
            ]
        );
        // A finding that blames the stand-in is dropped even when both stand-ins give it.
        errors.check_partial(&|_| {
            vec![
                Finding::error("x::stand-in", "model.hidden_size", "judges the stand-in"),
                Finding::error("x::other", "model.num_layers", "judges what was written"),
            ]
        });
        let codes: Vec<&str> = errors.problems().iter().map(|p| p.code()).collect();
        assert!(codes.contains(&"x::other"), "{codes:?}");
        assert!(!codes.contains(&"x::stand-in"), "{codes:?}");
    }

    #[test]
    fn out_of_range_integers_are_schema_errors_not_serde_failures() {
        let sets = [
            "model.num_layers=5000000000".to_owned(),
            "extends=base.yaml".to_owned(),
        ];
        let opts = LoadOptions {
            overrides: &sets,
            use_env: false,
        };
        let errors = load_str("mini.yaml", MINIMAL, &opts).expect_err("invalid");
        let codes: Vec<&str> = errors.problems().iter().map(|p| p.code()).collect();
        assert_eq!(codes, ["recipe::override", "schema::value"]);
        assert!(errors.problems()[1].message().contains("≤ 1024"));
    }

    #[test]
    fn findings_from_other_crates_get_positions() {
        let loaded = load_str("mini.yaml", MINIMAL, &LoadOptions::default()).expect("valid");
        let err = loaded
            .check(vec![Finding::error(
                "layout::x",
                "parallel.tensor",
                "bad tensor",
            )])
            .expect_err("error finding");
        let problem = &err.problems()[0];
        assert_eq!(problem.path(), Some("parallel.tensor"));
        assert_eq!(problem.file_position(), Some(("mini.yaml", 1, 1)));
        let warnings = loaded
            .check(vec![Finding::warning(
                "layout::y",
                "model.num_layers",
                "hmm",
            )])
            .expect("warnings only");
        assert_eq!(warnings.len(), 1);
    }
}
