//! What makes a library an interposer as its files show it (issue 39): the lookup functions it
//! defines in place of their real providers (`dlsym`, `dlvsym`, `dlopen`: `dlsym_override`;
//! `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`, `hipGetProcAddress`: `procaddress_override`),
//! and the local functions of its `.symtab` named after a table symbol (probable hidden hooks:
//! what an interposer built with `-fvisibility=hidden` hands out through its own lookups).
//! Pure: `gpu-trace`'s `probe::elf` reads the files.

use super::symbols::{SymbolTable, library_matches};

/// The functions a runtime or an interposer finds entry points with, and whether each has
/// `cuGetProcAddress`'s shape (the name first, the address written through the second
/// argument) rather than `dlsym`'s (the name second, the address returned).
pub const LOOKUPS: [(&str, bool); 7] = [
    ("dlsym", false),
    ("dlvsym", false),
    ("cuGetProcAddress", true),
    ("cuGetProcAddress_v2", true),
    ("cudaGetDriverEntryPoint", true),
    ("cudaGetDriverEntryPointByVersion", true),
    ("hipGetProcAddress", true),
];

/// At most this many probable hidden hooks are listed per library.
pub const HIDDEN_HOOKS_CAP: usize = 256;

/// Which lookup a function a library defines stands in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// `dlsym`, `dlvsym`, `dlopen` (the handle decides what `dlsym` finds).
    Dlsym,
    /// `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`, `hipGetProcAddress`.
    ProcAddress,
}

/// The lookup `function` is (`None`: none).
pub fn lookup_kind(function: &str) -> Option<Lookup> {
    if function == "dlopen" {
        return Some(Lookup::Dlsym);
    }
    let procaddress = LOOKUPS
        .iter()
        .find(|(l, _)| *l == function)
        .map(|(_, p)| *p)
        .or_else(|| {
            function
                .starts_with("cudaGetDriverEntryPoint")
                .then_some(true)
        })?;
    Some(if procaddress {
        Lookup::ProcAddress
    } else {
        Lookup::Dlsym
    })
}

/// The libraries that provide a lookup function for real (file name or soname prefixes).
fn real_lookup_provider(function: &str) -> &'static [&'static str] {
    if function.starts_with("dl") {
        &["libc.so", "libdl.so", "ld-linux", "ld-musl", "libc.musl"]
    } else if function.starts_with("cuGetProcAddress") {
        &["libcuda.so"]
    } else if function.starts_with("cudaGetDriverEntryPoint") {
        &["libcudart.so"]
    } else {
        &["libamdhip64.so"]
    }
}

/// Whether the library at `path` (with `soname`) is the one `library` names: a table row's or
/// a lookup's library (its file name or soname, or their start up to a dot), or a path (a row
/// with a `/`, compared with the whole path).
pub fn provides(library: &str, path: &str, soname: Option<&str>) -> bool {
    if library.contains('/') {
        return path == library;
    }
    let file = path.rsplit('/').next().unwrap_or(path);
    library_matches(library, file) || soname.is_some_and(|s| library_matches(library, s))
}

/// Whether the library at `path` (with `soname`) is a real provider of lookup `function`
/// (the dynamic linkers' names go on with their architecture: `ld-linux-x86-64.so.2`).
pub fn is_real_lookup_provider(function: &str, path: &str, soname: Option<&str>) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    real_lookup_provider(function).iter().any(|r| {
        [Some(file), soname].into_iter().flatten().any(|name| {
            name.strip_prefix(r)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-']))
        })
    })
}

/// The lookup functions of `defined` (the functions a library exports) that the library at
/// `path` (with `soname`) overrides: it defines them and is not their real provider.
pub fn overrides<'a>(
    defined: impl IntoIterator<Item = &'a str>,
    path: &str,
    soname: Option<&str>,
) -> Vec<&'a str> {
    defined
        .into_iter()
        .filter(|f| lookup_kind(f).is_some() && !is_real_lookup_provider(f, path, soname))
        .collect()
}

/// Whether the library at `path` (with `soname`) interposes: it overrides a lookup function
/// (`lookups`: the lookup functions it exports) or exports a table symbol (`defines`) whose
/// real provider is another library.
pub fn interposes<'a>(
    table: &SymbolTable,
    path: &str,
    soname: Option<&str>,
    defines: impl IntoIterator<Item = &'a str>,
    lookups: impl IntoIterator<Item = &'a str>,
) -> bool {
    !overrides(lookups, path, soname).is_empty()
        || defines.into_iter().any(|s| {
            table
                .entry_for(s)
                .is_some_and(|(_, e)| !provides(&e.library, path, soname))
        })
}

/// A local function of a library's `.symtab` whose name holds a table symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HiddenHook {
    /// The table symbol its name holds (the function it probably stands in for).
    pub symbol: String,
    /// Its name (from the file: untrusted).
    pub function: String,
    /// Where its code starts in the file.
    pub offset: u64,
}

/// The probable hidden hooks of one library.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HiddenHooks {
    /// The file has a `.symtab` (a stripped one has not: its hidden functions are unnamed).
    pub symtab: bool,
    /// In `.symtab`'s order, at most [`HIDDEN_HOOKS_CAP`].
    pub hooks: Vec<HiddenHook>,
    /// More were found than [`HIDDEN_HOOKS_CAP`]: the rest are not listed.
    pub capped: bool,
}

impl HiddenHooks {
    /// Takes a local function of the file's `.symtab` if its name holds a table symbol.
    /// Returns `false` once the list is full (the caller stops reading).
    pub fn add(&mut self, table: &SymbolTable, function: &str, offset: u64) -> bool {
        let Some(symbol) = hooked_symbol(table, function) else {
            return true;
        };
        if self
            .hooks
            .iter()
            .any(|h| h.offset == offset && h.function == function)
        {
            return true;
        }
        if self.hooks.len() >= HIDDEN_HOOKS_CAP {
            self.capped = true;
            return false;
        }
        self.hooks.push(HiddenHook {
            symbol,
            function: function.to_string(),
            offset,
        });
        true
    }
}

/// The table symbol a function's name holds, if any (`my_cuLaunchKernel` → `cuLaunchKernel`,
/// `hook_cuMemAlloc_v2_impl` → `cuMemAlloc_v2`): the first name the table matches that starts
/// the function's name or follows a character that is not a letter or a digit, and runs to its
/// end or to an `_`, with the version suffixes API names carry (`_v2`, `_ptsz`, `_ptds`, `_spt`)
/// taken when the table matches them too.
pub fn hooked_symbol(table: &SymbolTable, function: &str) -> Option<String> {
    let bytes = function.as_bytes();
    for start in 0..bytes.len() {
        if start > 0 && bytes[start - 1].is_ascii_alphanumeric() {
            continue;
        }
        if !bytes[start].is_ascii_alphabetic() {
            continue;
        }
        // The name's end candidates: its first segment, then each version suffix after it.
        let rest = &function[start..];
        let mut ends = Vec::new();
        let mut end = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        ends.push(end);
        while let Some(segment) = rest[end..].strip_prefix('_') {
            let len = segment
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(segment.len());
            if !is_version_suffix(&segment[..len]) {
                break;
            }
            end += 1 + len;
            ends.push(end);
        }
        if let Some(&end) = ends
            .iter()
            .rev()
            .find(|&&end| table.entry_for(&rest[..end]).is_some())
        {
            return Some(rest[..end].to_string());
        }
    }
    None
}

/// `v2`, `v3`…, `ptsz`, `ptds`, `spt`: the suffixes CUDA and HIP put on API names.
fn is_version_suffix(segment: &str) -> bool {
    matches!(segment, "ptsz" | "ptds" | "spt")
        || segment
            .strip_prefix('v')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_flagged_only_outside_their_real_providers() {
        let flagged =
            |f: &str, path: &str, soname: Option<&str>| !overrides([f], path, soname).is_empty();
        // The shim defines them: flagged.
        for f in ["dlsym", "dlvsym", "dlopen"] {
            assert!(flagged(f, "/tmp/libvgpu.so", None), "{f}");
            assert_eq!(lookup_kind(f), Some(Lookup::Dlsym));
        }
        for f in [
            "cuGetProcAddress",
            "cuGetProcAddress_v2",
            "cudaGetDriverEntryPoint",
            "cudaGetDriverEntryPointByVersion",
            "hipGetProcAddress",
        ] {
            assert!(flagged(f, "/tmp/libvgpu.so", None), "{f}");
            assert_eq!(lookup_kind(f), Some(Lookup::ProcAddress), "{f}");
        }
        // Their real providers: not flagged.
        for (f, path, soname) in [
            (
                "dlsym",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                Some("libc.so.6"),
            ),
            ("dlopen", "/usr/lib/x86_64-linux-gnu/libc.so.6", None),
            ("dlvsym", "/lib/x86_64-linux-gnu/libdl.so.2", None),
            (
                "dlsym",
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                Some("ld-linux-x86-64.so.2"),
            ),
            ("dlopen", "/lib/ld-musl-x86_64.so.1", None),
            (
                "cuGetProcAddress_v2",
                "/usr/lib/libcuda.so.535.1",
                Some("libcuda.so.1"),
            ),
            (
                "cudaGetDriverEntryPoint",
                "/opt/cuda/libcudart.so.12.4.99",
                None,
            ),
            ("hipGetProcAddress", "/opt/rocm/lib/libamdhip64.so.6", None),
        ] {
            assert!(!flagged(f, path, soname), "{f} in {path}");
        }
        // A provider of one family is not the provider of another's.
        assert!(flagged(
            "cuGetProcAddress",
            "/usr/lib/libcudart.so.12",
            None
        ));
        assert!(flagged("dlsym", "/usr/lib/libcuda.so.1", None));
        // A name that only starts like libc's is not libc.
        assert!(flagged("dlsym", "/tmp/libc.sox", None));
        // Not lookups at all.
        assert!(!flagged("dladdr", "/tmp/libvgpu.so", None));
        assert!(!flagged("cuLaunchKernel", "/tmp/libvgpu.so", None));
    }

    #[test]
    fn an_interposer_overrides_a_lookup_or_exports_another_librarys_symbol() {
        let t = SymbolTable::builtin();
        let none: [&str; 0] = [];
        assert!(interposes(&t, "/tmp/vgpu.so", None, none, ["dlsym"]));
        assert!(interposes(
            &t,
            "/tmp/vgpu.so",
            None,
            ["cuLaunchKernel"],
            none
        ));
        assert!(!interposes(&t, "/tmp/vgpu.so", None, none, none));
        assert!(!interposes(
            &t,
            "/usr/lib/libcuda.so.1",
            None,
            ["cuLaunchKernel", "cuGetProcAddress_v2"],
            ["cuGetProcAddress_v2"]
        ));
        assert!(!interposes(
            &t,
            "/usr/lib/libc.so.6",
            None,
            none,
            ["dlsym", "dlopen"]
        ));
        // A user's probe of a library named by path: that file is its provider.
        let mut t = SymbolTable::builtin();
        t.add_probe("/opt/x/libx.so:xInit").unwrap();
        assert!(!interposes(&t, "/opt/x/libx.so", None, ["xInit"], none));
        assert!(interposes(&t, "/tmp/libx.so", None, ["xInit"], none));
    }

    #[test]
    fn hidden_hooks_are_named_after_table_symbols() {
        let t = SymbolTable::builtin();
        let hook = |f: &str| hooked_symbol(&t, f);
        assert_eq!(
            hook("hooked_cuLaunchKernel").as_deref(),
            Some("cuLaunchKernel")
        );
        assert_eq!(hook("my_cuLaunchKernel").as_deref(), Some("cuLaunchKernel"));
        assert_eq!(hook("hook_cuMemAlloc_v2").as_deref(), Some("cuMemAlloc_v2"));
        assert_eq!(hook("cuMemAlloc_v2_hook").as_deref(), Some("cuMemAlloc_v2"));
        assert_eq!(
            hook("cuLaunchKernel_ptsz.cold").as_deref(),
            Some("cuLaunchKernel_ptsz")
        );
        assert_eq!(hook("__wrap_hipMalloc").as_deref(), Some("hipMalloc"));
        assert_eq!(hook("cuInit").as_deref(), Some("cuInit"));
        assert_eq!(
            hook("fake_cudaDeviceSynchronize").as_deref(),
            Some("cudaDeviceSynchronize")
        );
        // Not a table symbol, or one only inside a longer word.
        for f in [
            "hook_launch",
            "cuDeviceGet_hook",
            "relationshipMalloc",
            "cuInitialize",
        ] {
            assert_eq!(hook(f), None, "{f}");
        }
        // A user's probe counts too.
        let mut t = SymbolTable::builtin();
        t.add_probe("libx.so:xInit").unwrap();
        assert_eq!(hooked_symbol(&t, "my_xInit").as_deref(), Some("xInit"));
    }

    #[test]
    fn the_list_is_capped_and_says_so() {
        let t = SymbolTable::builtin();
        let mut h = HiddenHooks {
            symtab: true,
            ..HiddenHooks::default()
        };
        assert!(h.add(&t, "frame_dummy", 0x10));
        assert!(h.hooks.is_empty());
        for i in 0..HIDDEN_HOOKS_CAP as u64 {
            assert!(h.add(&t, &format!("hook{i}_cuInit"), 0x1000 + i));
        }
        // The same function twice (two symbols of one address and name): one hook.
        assert!(h.add(&t, "hook0_cuInit", 0x1000));
        assert!(!h.capped);
        assert!(!h.add(&t, "one_more_cuInit", 0x9000));
        assert!(h.capped);
        assert_eq!(h.hooks.len(), HIDDEN_HOOKS_CAP);
        assert_eq!(
            h.hooks[0],
            HiddenHook {
                symbol: "cuInit".into(),
                function: "hook0_cuInit".into(),
                offset: 0x1000
            }
        );
    }
}
