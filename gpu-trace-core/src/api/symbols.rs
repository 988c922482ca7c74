//! The GPU API entry points gpu-trace's API layer knows, in one place (pure data), and the
//! user's additions (`--probe LIB:SYMBOL`, `--probe-file FILE`).
//!
//! A symbol is a name or a pattern with one `*` (`cuMemcpy*`, `hip*Synchronize`); a library is
//! the real provider's file name or soname, or its start up to a dot (`libcudart.so` names
//! `libcudart.so.12` too).

/// One library family of the built-in table.
pub struct Family {
    /// The real provider (file name or soname prefix).
    pub library: &'static str,
    /// Short name used in the output (`cuda-driver`, `cuda-runtime`, `hip`).
    pub family: &'static str,
    /// Symbol names or patterns.
    pub symbols: &'static [&'static str],
}

/// The built-in table (docs/api.md lists it).
pub const BUILTIN: &[Family] = &[
    Family {
        library: "libcuda.so.1",
        family: "cuda-driver",
        symbols: &[
            "cuInit",
            "cuCtxCreate*",
            "cuDevicePrimaryCtxRetain",
            "cuStreamCreate*",
            // Every launch: cuLaunchKernel(Ex), cooperative, host functions, the legacy grid
            // launches, their _ptsz variants; graph launches (tests/api_table.rs holds the
            // real libraries' launch exports against these).
            "cuLaunch*",
            "cuGraphLaunch*",
            "cuMemAlloc*",
            "cuMemcpy*",
            "cuStreamSynchronize",
            "cuCtxSynchronize",
            "cuGetProcAddress*",
        ],
    },
    Family {
        library: "libcudart.so",
        family: "cuda-runtime",
        symbols: &[
            "cudaLaunch*",
            "cudaGraphLaunch*",
            "cudaMalloc",
            "cudaMemcpy*",
            "cuda*Synchronize",
        ],
    },
    Family {
        library: "libamdhip64.so",
        family: "hip",
        symbols: &[
            "hipInit",
            "hipMalloc",
            "hipMemcpy*",
            "hipLaunch*",
            "hipExtLaunch*",
            "hipModuleLaunch*",
            "hipExtModuleLaunch*",
            "hipHccModuleLaunch*",
            "hipGraphLaunch*",
            "hipStreamCreate*",
            "hip*Synchronize",
        ],
    },
];

/// One row of the table in use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The real provider (file name or soname, or its start up to a dot).
    pub library: String,
    /// `cuda-driver`, `cuda-runtime`, `hip`, or `user` for a `--probe`.
    pub family: String,
    /// A name, or a pattern with one `*`.
    pub pattern: String,
}

/// A `--probe` that is not `LIB:SYMBOL`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error(
        "{where_}`{spec}` is not LIB:SYMBOL (e.g. libamdhip64.so.5:hipMemset; the symbol may \
         hold one `*`)"
    )]
    Malformed { where_: String, spec: String },
}

/// The symbols gpu-trace looks for: the built-in families, then the user's probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolTable {
    entries: Vec<Entry>,
}

impl SymbolTable {
    /// The built-in table only.
    pub fn builtin() -> Self {
        let entries = BUILTIN
            .iter()
            .flat_map(|f| {
                f.symbols.iter().map(|s| Entry {
                    library: f.library.to_string(),
                    family: f.family.to_string(),
                    pattern: (*s).to_string(),
                })
            })
            .collect();
        Self { entries }
    }

    /// Adds `LIB:SYMBOL` (the user's probe).
    pub fn add_probe(&mut self, spec: &str) -> Result<(), ProbeError> {
        self.add(spec, String::new())
    }

    fn add(&mut self, spec: &str, where_: String) -> Result<(), ProbeError> {
        let bad = || ProbeError::Malformed {
            where_: where_.clone(),
            spec: spec.to_string(),
        };
        let (lib, sym) = spec.trim().rsplit_once(':').ok_or_else(bad)?;
        let name_ok = |s: &str, extra: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-+@".contains(c) || extra.contains(c))
        };
        if !name_ok(lib, "/") || !name_ok(sym, "*") || sym.matches('*').count() > 1 {
            return Err(bad());
        }
        self.entries.push(Entry {
            library: lib.to_string(),
            family: "user".to_string(),
            pattern: sym.to_string(),
        });
        Ok(())
    }

    /// Adds each line of a probe file: one `LIB:SYMBOL` a line; blank lines and `#` comments
    /// are skipped. Returns how many probes it added.
    pub fn add_probe_file(&mut self, name: &str, text: &str) -> Result<usize, ProbeError> {
        let mut added = 0;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if !line.is_empty() {
                self.add(line, format!("{name} line {}: ", n + 1))?;
                added += 1;
            }
        }
        Ok(added)
    }

    /// The rows, built-in first.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The first row whose pattern matches `symbol` (and its index, the table's order).
    pub fn entry_for(&self, symbol: &str) -> Option<(usize, &Entry)> {
        self.entries
            .iter()
            .enumerate()
            .find(|(_, e)| pattern_matches(&e.pattern, symbol))
    }
}

/// `name` matches `pattern` (a name, or a pattern with one `*` standing for any run of
/// characters, none included).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.len() >= head.len() + tail.len() && name.starts_with(head) && name.ends_with(tail)
        }
    }
}

/// A library file name or soname `name` is the one a table row names as `library`: equal, or
/// `library` followed by a dot and more (`libcudart.so` → `libcudart.so.12`). A row with a
/// `/` names a path and compares with the whole path.
pub fn library_matches(library: &str, name: &str) -> bool {
    name == library
        || name
            .strip_prefix(library)
            .is_some_and(|rest| rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_a_prefix_a_middle_or_the_whole_name() {
        assert!(pattern_matches("cuMemcpy*", "cuMemcpyHtoD_v2"));
        assert!(pattern_matches("cuMemcpy*", "cuMemcpy"));
        assert!(pattern_matches("hip*Synchronize", "hipStreamSynchronize"));
        assert!(pattern_matches("hip*Synchronize", "hipDeviceSynchronize"));
        assert!(!pattern_matches("hip*Synchronize", "hipSynchronizeX"));
        assert!(!pattern_matches("hipMalloc", "hipMallocManaged"));
        assert!(!pattern_matches("cuInit", "cuInitX"));
        // Head and tail may not overlap.
        assert!(!pattern_matches("ab*ba", "aba"));
    }

    #[test]
    fn library_names_match_the_soname_and_its_versions() {
        assert!(library_matches("libcudart.so", "libcudart.so.12"));
        assert!(library_matches("libamdhip64.so", "libamdhip64.so.5"));
        assert!(library_matches("libcuda.so.1", "libcuda.so.1"));
        assert!(!library_matches("libcuda.so", "libcudart.so.12"));
        assert!(!library_matches("libcuda.so.1", "libcuda.so.10x"));
    }

    #[test]
    fn probes_are_lib_colon_symbol_and_files_skip_comments() {
        let mut t = SymbolTable::builtin();
        let n = t.entries().len();
        t.add_probe("libshimhip.so:hipMemset").unwrap();
        assert_eq!(t.entries().len(), n + 1);
        assert_eq!(t.entry_for("hipMemset").unwrap().1.family, "user");
        assert_eq!(t.entry_for("hipMalloc").unwrap().1.family, "hip");
        for bad in [
            "hipMemset",
            ":hipMemset",
            "lib.so:",
            "lib.so:a*b*",
            "lib so:x",
        ] {
            assert!(t.add_probe(bad).is_err(), "{bad}");
        }
        let added = t
            .add_probe_file(
                "p.txt",
                "# mine\n\nlibx.so:fooA  # trailing\nlibx.so:bar*\n",
            )
            .unwrap();
        assert_eq!(added, 2);
        assert!(t.entry_for("barBaz").is_some());
        let err = t
            .add_probe_file("p.txt", "libx.so:ok\nnot a probe\n")
            .unwrap_err();
        assert!(err.to_string().contains("p.txt line 2"), "{err}");
    }

    #[test]
    fn every_builtin_family_has_the_issue_s_names() {
        let t = SymbolTable::builtin();
        for s in [
            "cuInit",
            "cuCtxCreate_v4",
            "cuLaunchKernelEx",
            "cuGetProcAddress_v2",
            "cudaDeviceSynchronize",
            "cudaMemcpyAsync",
            "hipModuleLaunchKernel",
            "hipStreamCreateWithFlags",
        ] {
            assert!(t.entry_for(s).is_some(), "{s}");
        }
        assert!(t.entry_for("cuDeviceGet").is_none());
    }
}
