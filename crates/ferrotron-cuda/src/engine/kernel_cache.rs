//! Compiled-kernel cache: in memory per device, and on disk per architecture.
//!
//! Kernels are generated per op, dtype and layout, so a training step touches a few hundred
//! distinct sources; NVRTC takes tens of milliseconds each. The memory cache makes each source
//! compile once per process; the disk cache (`~/.cache/ferrotron/kernels/<arch>/<hash>.ptx`,
//! keyed by a hash of arch, options and source) makes it compile once per machine. A kernel's
//! name ([`kernel_name`], from its source's header comment) is made here too, on the same miss
//! that generates the source: the cache hands the launch its function and the name it is timed
//! and profiled under.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::launch::KernelSpec;
use crate::error::{CudaError, DriverResultExt, OpContext, Result};
use crate::switches::EnvVars;

/// Shared memory a block may take without raising the function's limit.
const SHARED_STATIC_LIMIT: u32 = 48 * 1024;

/// Name of the entry point every generated kernel defines.
pub const KERNEL_ENTRY: &str = "ferrotron_kernel";

/// Cache key of a kernel: hash of everything that changes the compiled code.
pub fn cache_key(arch: &str, options: &[String], source: &str) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(arch.as_bytes());
    hasher.update(&[0]);
    for o in options {
        hasher.update(o.as_bytes());
        hasher.update(&[0]);
    }
    hasher.update(source.as_bytes());
    hasher.finalize().to_hex()[..32].to_string()
}

/// NVRTC options for an architecture (`sm_90`). The toolkit include dir is only needed for the
/// half-precision headers; it is added when it exists.
pub fn compile_options(arch: &str) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()];
    if let Some(include) = cuda_include_dir() {
        options.push(format!("--include-path={}", include.display()));
    }
    options
}

/// `FERROTRON_CUDA_INCLUDE` (the headers alone, e.g. PyPI's CUDA wheels; a variable cudarc's
/// build script does not watch, so setting it rebuilds nothing), then the toolkit roots.
fn cuda_include_dir() -> Option<PathBuf> {
    let candidates = crate::switches::env_var(EnvVars::CUDA_INCLUDE)
        .map(PathBuf::from)
        .into_iter()
        .chain(
            ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
                .iter()
                .filter_map(std::env::var_os)
                .map(|root| PathBuf::from(root).join("include")),
        )
        .chain(std::iter::once(PathBuf::from("/usr/local/cuda/include")));
    candidates
        .into_iter()
        .find(|p| p.join("cuda_fp16.h").exists())
}

/// Directory of the on-disk cache for one architecture; `None` disables it.
/// `FERROTRON_KERNEL_CACHE` overrides the location (`off` disables it).
pub fn disk_cache_dir(arch: &str) -> Option<PathBuf> {
    let root = match crate::switches::env_var(EnvVars::KERNEL_CACHE) {
        Some("off") => return None,
        Some(v) => PathBuf::from(v),
        None => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            base.join("ferrotron").join("kernels")
        }
    };
    Some(root.join(arch))
}

/// Per-device cache of loaded kernel functions.
pub struct KernelCache {
    arch: String,
    options: Vec<String>,
    /// The architecture-specific target (`sm_90a`): the options of kernels that use features
    /// only one architecture has (Hopper's wgmma), see [`KernelSpec::arch_specific`].
    specific_arch: String,
    specific_options: Vec<String>,
    disk: Option<PathBuf>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Launch-time lookup: hash of (spec type, spec) → function and kernel name.
    by_spec: Mutex<HashMap<u64, (CudaFunction, Arc<str>)>>,
}

/// The cheap launch-time key of a spec: std's SipHash of its type and fields (no source).
fn spec_key<S: KernelSpec>(spec: &S) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::any::TypeId::of::<S>().hash(&mut h);
    spec.hash(&mut h);
    h.finish()
}

impl KernelCache {
    pub fn new(arch: String) -> Self {
        let specific_arch = format!("{arch}a");
        Self {
            options: compile_options(&arch),
            specific_options: compile_options(&specific_arch),
            specific_arch,
            disk: disk_cache_dir(&arch),
            arch,
            functions: Mutex::new(HashMap::new()),
            by_spec: Mutex::new(HashMap::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CudaFunction>> {
        self.functions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The function for a spec and its kernel name: a hash-map hit on the spec after the first
    /// launch; on a miss the source is generated, its entry point renamed after the op (so
    /// profiles tell kernels apart) and compiled or loaded through [`KernelCache::function`].
    pub(crate) fn function_for_spec<S: KernelSpec>(
        &self,
        ctx: &Arc<CudaContext>,
        spec: &S,
        op: &dyn Fn() -> OpContext,
    ) -> Result<(CudaFunction, Arc<str>)> {
        let key = spec_key(spec);
        if let Some(hit) = self
            .by_spec
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(hit.clone());
        }
        let source = spec.source();
        let name = kernel_name(&source);
        let source = source.replace(KERNEL_ENTRY, &name);
        let function = self.function_named(ctx, &source, &name, spec.arch_specific(), op)?;
        let shared = spec.shared_bytes();
        if shared > SHARED_STATIC_LIMIT {
            function
                .set_attribute(
                    CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
                .ctx(op)?;
        }
        let entry = (function, Arc::<str>::from(name));
        self.by_spec
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, entry.clone());
        Ok(entry)
    }

    /// The loaded function for `source`, compiling (or reading from disk) on first use.
    pub fn function(
        &self,
        ctx: &Arc<CudaContext>,
        source: &str,
        op: &dyn Fn() -> OpContext,
    ) -> Result<CudaFunction> {
        self.function_named(ctx, source, KERNEL_ENTRY, false, op)
    }

    fn function_named(
        &self,
        ctx: &Arc<CudaContext>,
        source: &str,
        entry: &str,
        arch_specific: bool,
        op: &dyn Fn() -> OpContext,
    ) -> Result<CudaFunction> {
        let (arch, options) = if arch_specific {
            (&self.specific_arch, &self.specific_options)
        } else {
            (&self.arch, &self.options)
        };
        let key = cache_key(arch, options, source);
        if let Some(f) = self.lock().get(&key) {
            return Ok(f.clone());
        }
        let ptx = match self.read_disk(&key) {
            Some(ptx) => ptx,
            None => {
                let ptx = self.compile(source, options, op)?;
                self.write_disk(&key, &ptx);
                ptx
            }
        };
        let module = ctx.load_module(Ptx::from_src(ptx)).ctx(op)?;
        let function = module.load_function(entry).ctx(op)?;
        self.lock().insert(key, function.clone());
        Ok(function)
    }

    fn compile(
        &self,
        source: &str,
        options: &[String],
        op: &dyn Fn() -> OpContext,
    ) -> Result<String> {
        // SAFETY: only tries to dlopen NVRTC by its usual names.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::LibraryMissing {
                library: "NVRTC (libnvrtc)",
                hint: "add the CUDA toolkit's lib64 to LD_LIBRARY_PATH",
            });
        }
        let opts = CompileOptions {
            options: options.to_vec(),
            name: Some(format!("{KERNEL_ENTRY}.cu")),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| {
            let log = match &e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => format!("{other:?}"),
            };
            CudaError::Compile {
                context: op(),
                kernel: first_line_comment(source),
                log,
            }
        })?;
        tracing::debug!(op = %op(), ms = started.elapsed().as_millis() as u64, "NVRTC compiled kernel");
        Ok(ptx.to_src())
    }

    fn disk_path(&self, key: &str) -> Option<PathBuf> {
        self.disk.as_ref().map(|d| d.join(format!("{key}.ptx")))
    }

    fn read_disk(&self, key: &str) -> Option<String> {
        let path = self.disk_path(key)?;
        std::fs::read_to_string(path).ok()
    }

    fn write_disk(&self, key: &str, ptx: &str) {
        let Some(path) = self.disk_path(key) else {
            return;
        };
        if let Err(err) = write_atomically(&path, ptx) {
            tracing::warn!(path = %path.display(), %err, "cannot write kernel cache entry");
        }
    }
}

/// Writes through a temporary file and a rename, so concurrent ranks never read half a file.
pub(crate) fn write_atomically(path: &Path, contents: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// The entry-point (and profiler) name of a generated kernel: its header comment up to the
/// rank, as an identifier (`// map add bf16 <- [bf16, bf16] rank 1` → `map_add_bf16_bf16_bf16`).
pub fn kernel_name(source: &str) -> String {
    let header = first_line_comment(source);
    let head = header.split(" rank").next().unwrap_or(&header);
    let mut name = String::with_capacity(head.len());
    for c in head.chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c.to_ascii_lowercase());
        } else if !name.ends_with('_') {
            name.push('_');
        }
    }
    let name = name.trim_matches('_').to_string();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("k_{name}")
    } else {
        name
    }
}

/// Generated sources start with `// <description>`; used to name the kernel in errors.
pub(crate) fn first_line_comment(source: &str) -> String {
    source
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// "))
        .unwrap_or(KERNEL_ENTRY)
        .to_string()
}

/// Compiles a source with the options a device of `arch` would use, without a device (tests:
/// needs NVRTC and the CUDA headers, e.g. from PyPI's `nvidia-cuda-nvrtc`/`-runtime`).
#[cfg(test)]
pub(crate) fn compile_for_test(source: &str, arch: &str) -> std::result::Result<String, String> {
    let opts = CompileOptions {
        options: compile_options(arch),
        name: Some(format!("{KERNEL_ENTRY}.cu")),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts)
        .map(|ptx| ptx.to_src())
        .map_err(|e| match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_arch_options_and_source() {
        let opts = vec!["-std=c++17".to_string()];
        let a = cache_key("sm_90", &opts, "src");
        assert_eq!(a, cache_key("sm_90", &opts, "src"));
        assert_eq!(a.len(), 32);
        assert_ne!(a, cache_key("sm_80", &opts, "src"));
        assert_ne!(a, cache_key("sm_90", &[], "src"));
        assert_ne!(a, cache_key("sm_90", &opts, "src2"));
    }

    #[test]
    fn options_name_the_architecture() {
        let opts = compile_options("sm_90");
        assert_eq!(opts[0], "--gpu-architecture=sm_90");
    }

    #[test]
    fn arch_specific_kernels_compile_for_the_a_target_under_their_own_key() {
        let cache = KernelCache::new("sm_90".into());
        assert_eq!(cache.specific_arch, "sm_90a");
        assert_eq!(cache.specific_options[0], "--gpu-architecture=sm_90a");
        assert_ne!(
            cache_key(&cache.arch, &cache.options, "src"),
            cache_key(&cache.specific_arch, &cache.specific_options, "src")
        );
    }

    #[test]
    fn disk_entries_are_written_atomically() {
        let dir = std::env::temp_dir().join(format!("ferrotron-kc-{}", std::process::id()));
        let path = dir.join("sm_90").join("abc.ptx");
        write_atomically(&path, "ptx text").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "ptx text");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kernels_are_named_after_their_op() {
        assert_eq!(
            kernel_name("// map add bf16 <- [bf16, bf16] rank 1\nint x;"),
            "map_add_bf16_bf16_bf16"
        );
        assert_eq!(
            kernel_name("// reduce Sum bf16 -> bf16 rank 1\n"),
            "reduce_sum_bf16_bf16"
        );
        assert_eq!(kernel_name("int x;"), "ferrotron_kernel");
    }

    #[test]
    fn kernel_name_comes_from_the_header_comment() {
        assert_eq!(first_line_comment("// map add f32\nint x;"), "map add f32");
        assert_eq!(first_line_comment("int x;"), KERNEL_ENTRY);
    }
}
