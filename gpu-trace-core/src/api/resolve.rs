//! Which library's copy of each GPU API symbol a process's calls reach: the dynamic linker's
//! binding order (given) and each library's definitions (given) → the winner, the copies
//! behind it, and the warnings. Pure: `gpu-trace`'s `probe::libraries` reads the process.

use std::collections::{BTreeMap, BTreeSet};

use super::interposer::{self, HiddenHooks, Lookup};
use super::symbols::SymbolTable;

/// How a library came into the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The main executable (first in the global scope).
    Executable,
    /// Named by `LD_PRELOAD` or /etc/ld.so.preload (right after the executable).
    Preload,
    /// Reached from the executable and the preloads through DT_NEEDED, breadth-first.
    Needed,
    /// Mapped but not reachable that way: `dlopen`ed (its own local scope unless the caller
    /// passed RTLD_GLOBAL).
    Dlopen,
}

impl Origin {
    /// The name in the output.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Executable => "executable",
            Origin::Preload => "preload",
            Origin::Needed => "needed",
            Origin::Dlopen => "dlopen",
        }
    }
}

/// How a library defines a symbol (dynamic symbol table, a function, not undefined).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Global,
    /// ld.so binds a weak definition like a global one (the first in order wins).
    Weak,
}

/// One mapped ELF object of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Library {
    /// The path as /proc/PID/maps shows it.
    pub path: String,
    pub soname: Option<String>,
    pub origin: Origin,
    /// Has a dynamic symbol table (a library without one can define nothing for ld.so).
    pub has_dynsym: bool,
    /// The API symbols (rows of the table) it defines.
    pub defines: BTreeMap<String, Binding>,
    /// Imports `dlsym` or `dlvsym` (undefined in its dynamic symbol table).
    pub imports_dlsym: bool,
    /// The lookup functions it exports (`dlsym`, `dlvsym`, `dlopen`, `cuGetProcAddress*`,
    /// `cudaGetDriverEntryPoint*`, `hipGetProcAddress`), their real providers' included.
    pub exports_lookups: Vec<String>,
    /// Its probable hidden hooks (`None`: not looked for: it does not interpose).
    pub hidden_hooks: Option<HiddenHooks>,
}

impl Library {
    /// The file name (the part after the last `/`).
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// The name a table row's library matches: the soname or the file name.
    pub fn is(&self, library: &str) -> bool {
        interposer::provides(library, &self.path, self.soname.as_deref())
    }

    /// The lookup functions it overrides (exports, and is not their real provider).
    pub fn overrides(&self) -> Vec<&str> {
        interposer::overrides(
            self.exports_lookups.iter().map(String::as_str),
            &self.path,
            self.soname.as_deref(),
        )
    }

    /// It overrides `dlsym`, `dlvsym` or `dlopen`.
    pub fn dlsym_override(&self) -> bool {
        self.overrides_a(Lookup::Dlsym)
    }

    /// It overrides `cuGetProcAddress*`, `cudaGetDriverEntryPoint*` or `hipGetProcAddress`.
    pub fn procaddress_override(&self) -> bool {
        self.overrides_a(Lookup::ProcAddress)
    }

    fn overrides_a(&self, kind: Lookup) -> bool {
        self.overrides()
            .iter()
            .any(|f| interposer::lookup_kind(f) == Some(kind))
    }

    fn in_global_scope(&self) -> bool {
        self.origin != Origin::Dlopen
    }
}

/// Where one API symbol binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolBinding {
    pub symbol: String,
    /// The table row's family and library.
    pub family: String,
    pub provider: String,
    /// Index (into the libraries) of the copy the process's calls reach: the first library of
    /// the global scope that defines it. `None`: no library of the global scope does.
    pub winner: Option<usize>,
    /// The other global-scope copies, in order: `next[0]` is what `dlsym(RTLD_NEXT, …)` from
    /// the winner reaches.
    pub next: Vec<usize>,
    /// Copies in `dlopen`ed libraries (reached through their handle or RTLD_GLOBAL only).
    pub dlopened: Vec<usize>,
    /// The real provider's copy (the library the table row names), wherever it is.
    pub real: Option<usize>,
}

/// What the resolution warns about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Warning {
    /// An interposer (before the real provider, defining API symbols the provider defines) that
    /// also looks symbols up with `dlsym`/`dlvsym`: the seed's recursion.
    DlsymInterposer {
        library: usize,
        symbols: Vec<String>,
        real: usize,
    },
    /// A library that defines API symbols the real provider defines too, but comes after it:
    /// its copies are never reached by the process's calls.
    Shadowed {
        library: usize,
        symbols: Vec<String>,
    },
    /// A preloaded library defining API symbols in a process that has no GPU open: the
    /// `export LD_PRELOAD` leak into shells and tools.
    PreloadLeak {
        library: usize,
        symbols: Vec<String>,
    },
}

/// The whole answer for one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// One per API symbol some library defines (and each exact user probe), in table order.
    pub symbols: Vec<SymbolBinding>,
    pub warnings: Vec<Warning>,
}

/// Resolves every API symbol of `libraries` (the global scope in binding order — executable,
/// preloads, DT_NEEDED breadth-first — then the `dlopen`ed ones). `gpu_open`: whether the
/// process has a GPU device open (`None`: unknown, no leak warning).
pub fn resolve(table: &SymbolTable, libraries: &[Library], gpu_open: Option<bool>) -> Resolution {
    // The symbols: every definition that matches a row, and each exact user probe.
    let mut names: BTreeSet<(usize, String)> = BTreeSet::new();
    for lib in libraries {
        for name in lib.defines.keys() {
            if let Some((row, _)) = table.entry_for(name) {
                names.insert((row, name.clone()));
            }
        }
    }
    for (row, e) in table.entries().iter().enumerate() {
        if e.family == "user" && !e.pattern.contains('*') {
            names.insert((row, e.pattern.clone()));
        }
    }
    let symbols: Vec<SymbolBinding> = names
        .into_iter()
        .map(|(row, name)| bind(&table.entries()[row], name, libraries))
        .collect();
    let warnings = warnings(&symbols, libraries, gpu_open);
    Resolution { symbols, warnings }
}

fn bind(row: &super::symbols::Entry, symbol: String, libraries: &[Library]) -> SymbolBinding {
    let definers = || {
        libraries
            .iter()
            .enumerate()
            .filter(|(_, l)| l.defines.contains_key(&symbol))
    };
    let mut global = definers()
        .filter(|(_, l)| l.in_global_scope())
        .map(|(i, _)| i);
    let winner = global.next();
    let next = global.collect();
    let dlopened = definers()
        .filter(|(_, l)| !l.in_global_scope())
        .map(|(i, _)| i)
        .collect();
    let real = definers().find(|(_, l)| l.is(&row.library)).map(|(i, _)| i);
    SymbolBinding {
        family: row.family.clone(),
        provider: row.library.clone(),
        symbol,
        winner,
        next,
        dlopened,
        real,
    }
}

fn warnings(
    symbols: &[SymbolBinding],
    libraries: &[Library],
    gpu_open: Option<bool>,
) -> Vec<Warning> {
    // Per library, in order: the symbols it interposes in front of the real copy, and those
    // it defines behind the real copy.
    let mut before: BTreeMap<usize, (Vec<String>, usize)> = BTreeMap::new();
    let mut behind: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for s in symbols {
        let Some(real) = s.real else { continue };
        let real_global = libraries[real].in_global_scope();
        for &i in s.winner.iter().chain(&s.next) {
            if i == real {
                continue;
            }
            if !real_global || i < real {
                let e = before.entry(i).or_insert_with(|| (Vec::new(), real));
                e.0.push(s.symbol.clone());
            } else {
                behind.entry(i).or_default().push(s.symbol.clone());
            }
        }
    }
    let mut out = Vec::new();
    for (library, (symbols, real)) in before {
        if libraries[library].imports_dlsym {
            out.push(Warning::DlsymInterposer {
                library,
                symbols,
                real,
            });
        }
    }
    for (library, symbols) in behind {
        out.push(Warning::Shadowed { library, symbols });
    }
    if gpu_open == Some(false) {
        for (library, lib) in libraries.iter().enumerate() {
            if lib.origin == Origin::Preload && !lib.defines.is_empty() {
                out.push(Warning::PreloadLeak {
                    library,
                    symbols: lib.defines.keys().cloned().collect(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(path: &str, origin: Origin, defines: &[(&str, Binding)], dlsym: bool) -> Library {
        Library {
            path: path.to_string(),
            soname: path.rsplit('/').next().map(str::to_string),
            origin,
            has_dynsym: true,
            defines: defines
                .iter()
                .map(|(s, b)| ((*s).to_string(), *b))
                .collect(),
            imports_dlsym: dlsym,
            exports_lookups: vec![],
            hidden_hooks: None,
        }
    }

    const G: Binding = Binding::Global;
    const W: Binding = Binding::Weak;

    fn hip(defines: &[(&str, Binding)]) -> Library {
        lib("/usr/lib/libamdhip64.so.5", Origin::Needed, defines, false)
    }

    fn find<'a>(r: &'a Resolution, s: &str) -> &'a SymbolBinding {
        r.symbols.iter().find(|b| b.symbol == s).unwrap()
    }

    #[test]
    fn a_preloaded_shim_wins_and_the_real_library_is_next() {
        let libs = [
            lib("/bin/client", Origin::Executable, &[], false),
            lib("/tmp/shim.so", Origin::Preload, &[("hipMalloc", G)], true),
            hip(&[("hipMalloc", G), ("hipInit", G)]),
        ];
        let r = resolve(&SymbolTable::builtin(), &libs, Some(true));
        let m = find(&r, "hipMalloc");
        assert_eq!(
            (m.winner, m.next.clone(), m.real),
            (Some(1), vec![2], Some(2))
        );
        let i = find(&r, "hipInit");
        assert_eq!((i.winner, i.next.clone()), (Some(2), vec![]));
        assert_eq!(
            r.warnings,
            vec![Warning::DlsymInterposer {
                library: 1,
                symbols: vec!["hipMalloc".into()],
                real: 2
            }]
        );
    }

    #[test]
    fn an_interposer_without_dlsym_gets_no_recursion_warning() {
        let libs = [
            lib("/tmp/stub.so", Origin::Preload, &[("hipMalloc", G)], false),
            hip(&[("hipMalloc", G)]),
        ];
        let r = resolve(&SymbolTable::builtin(), &libs, Some(true));
        assert_eq!(find(&r, "hipMalloc").winner, Some(0));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn an_interposer_after_the_real_library_does_not_win() {
        let libs = [
            lib("/bin/client", Origin::Executable, &[], false),
            hip(&[("hipMalloc", G)]),
            lib("/tmp/late.so", Origin::Needed, &[("hipMalloc", G)], true),
        ];
        let r = resolve(&SymbolTable::builtin(), &libs, Some(true));
        let m = find(&r, "hipMalloc");
        assert_eq!((m.winner, m.next.clone()), (Some(1), vec![2]));
        assert_eq!(
            r.warnings,
            vec![Warning::Shadowed {
                library: 2,
                symbols: vec!["hipMalloc".into()]
            }]
        );
    }

    #[test]
    fn a_weak_definition_first_in_order_wins_over_a_global_one() {
        let libs = [
            lib("/tmp/weak.so", Origin::Needed, &[("cuInit", W)], false),
            lib(
                "/usr/lib/libcuda.so.1",
                Origin::Needed,
                &[("cuInit", G)],
                false,
            ),
        ];
        let r = resolve(&SymbolTable::builtin(), &libs, None);
        let c = find(&r, "cuInit");
        assert_eq!(
            (c.winner, c.next.clone(), c.real),
            (Some(0), vec![1], Some(1))
        );
        assert_eq!(c.family, "cuda-driver");
    }

    #[test]
    fn a_symbol_nobody_defines_has_no_winner_and_dlopened_copies_are_apart() {
        let mut table = SymbolTable::builtin();
        table.add_probe("libx.so:xInit").unwrap();
        let libs = [
            lib("/bin/app", Origin::Executable, &[], false),
            lib(
                "/usr/lib/libcudart.so.12",
                Origin::Dlopen,
                &[("cudaMalloc", G)],
                false,
            ),
        ];
        let r = resolve(&table, &libs, Some(true));
        let x = find(&r, "xInit");
        assert_eq!(
            (x.winner, x.next.len(), x.dlopened.len(), x.real),
            (None, 0, 0, None)
        );
        let c = find(&r, "cudaMalloc");
        assert_eq!(
            (c.winner, c.dlopened.clone(), c.real),
            (None, vec![1], Some(1))
        );
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn a_preload_defining_api_symbols_without_a_gpu_open_is_a_leak() {
        let libs = [
            lib("/bin/bash", Origin::Executable, &[], false),
            lib("/tmp/shim.so", Origin::Preload, &[("hipMalloc", G)], true),
        ];
        let leak = |gpu| {
            resolve(&SymbolTable::builtin(), &libs, gpu)
                .warnings
                .iter()
                .any(|w| matches!(w, Warning::PreloadLeak { library: 1, .. }))
        };
        assert!(leak(Some(false)));
        assert!(!leak(Some(true)));
        assert!(!leak(None));
    }

    #[test]
    fn a_library_is_flagged_by_the_lookups_it_overrides() {
        let with = |path: &str, lookups: &[&str]| Library {
            exports_lookups: lookups.iter().map(|s| (*s).to_string()).collect(),
            ..lib(path, Origin::Needed, &[], false)
        };
        let shim = with("/tmp/libvgpu.so", &["dlsym"]);
        assert!(shim.dlsym_override() && !shim.procaddress_override());
        let getproc = with("/tmp/libvgpu.so", &["cuGetProcAddress_v2", "dlopen"]);
        assert!(getproc.dlsym_override() && getproc.procaddress_override());
        assert_eq!(getproc.overrides(), ["cuGetProcAddress_v2", "dlopen"]);
        let libc = with("/usr/lib/libc.so.6", &["dlsym", "dlvsym", "dlopen"]);
        assert!(!libc.dlsym_override() && libc.overrides().is_empty());
        let cuda = with(
            "/usr/lib/libcuda.so.1",
            &["cuGetProcAddress", "cuGetProcAddress_v2"],
        );
        assert!(!cuda.procaddress_override());
    }
}
