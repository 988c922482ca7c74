//! What makes a library of a traced process an interposer, and its `API_PATH` verdict at the end
//! (issue 39; the decision and the rendering are `gpu_trace_core::api::path`'s). An interposer
//! is a library other than the real provider that exports a table symbol, defines a lookup
//! function (`dlsym`, `dlvsym`, `cuGetProcAddress*`, `cudaGetDriverEntryPoint*`,
//! `hipGetProcAddress`), or handed out a table symbol from its own code (a hidden hook,
//! probed by the attacher). The attacher tells this module what it read and saw; this module
//! keeps no file and attaches nothing.

use std::collections::{BTreeSet, HashMap, HashSet};

use gpu_trace_core::api::interposer;
use gpu_trace_core::api::path::{ApiPath, PathSymbol};
use gpu_trace_core::api::resolve::Library;
use gpu_trace_core::api::symbols::SymbolTable;

/// Whether `path` (with `soname`) is what a table row's or a lookup's library names (the
/// core's decision, which `--resolve` makes too).
pub use gpu_trace_core::api::interposer::provides;

/// Why one library of one process is an interposer.
#[derive(Default)]
struct Found {
    /// Table symbols it exports that its real provider is another library for.
    exports: BTreeSet<String>,
    /// Table symbols it handed out from its own code.
    hooks: BTreeSet<String>,
    /// Its own lookup functions.
    overrides: BTreeSet<String>,
}

/// Interposers of every traced process, and the lookups and hand-outs seen.
#[derive(Default)]
pub struct Interposers {
    found: HashMap<(u32, u32), Found>,
    /// (pid, symbol) → the library ids of its real provider in that process.
    real: HashMap<(u32, String), HashSet<u32>>,
    /// (pid, lookup library id) → (calls of its lookup functions, of them for a table symbol).
    lookups: HashMap<(u32, u32), (u64, u64)>,
    /// Hand-outs answered already: (pid, name, address).
    seen: HashSet<(u32, String, u64)>,
    comms: HashMap<u32, String>,
}

impl Interposers {
    /// What a read of process `pid` says: its libraries (with this run's library ids) and the
    /// lookup functions each file defines.
    pub fn note_process(
        &mut self,
        table: &SymbolTable,
        pid: u32,
        comm: &str,
        libraries: &[(u32, &Library, Vec<String>)],
    ) {
        self.comms.insert(pid, comm.to_string());
        for (id, lib, lookups) in libraries {
            for symbol in lib.defines.keys() {
                let Some((_, entry)) = table.entry_for(symbol) else {
                    continue;
                };
                if lib.is(&entry.library) {
                    self.real
                        .entry((pid, symbol.clone()))
                        .or_default()
                        .insert(*id);
                } else {
                    self.found
                        .entry((pid, *id))
                        .or_default()
                        .exports
                        .insert(symbol.clone());
                }
            }
            let overrides = interposer::overrides(
                lookups.iter().map(String::as_str),
                &lib.path,
                lib.soname.as_deref(),
            );
            for f in overrides {
                self.found
                    .entry((pid, *id))
                    .or_default()
                    .overrides
                    .insert(f.to_string());
            }
        }
    }

    /// The interposers of `pid` found so far (library ids).
    pub fn libs_of(&self, pid: u32) -> Vec<u32> {
        let mut libs: Vec<u32> = self
            .found
            .keys()
            .filter(|(p, _)| *p == pid)
            .map(|(_, l)| *l)
            .collect();
        libs.sort_unstable();
        libs
    }

    /// A lookup of library `lookup_lib` returned in `pid`; `api`: for a table symbol.
    pub fn note_lookup(&mut self, pid: u32, lookup_lib: u32, api: bool) {
        let n = self.lookups.entry((pid, lookup_lib)).or_default();
        n.0 += 1;
        n.1 += u64::from(api);
    }

    /// Whether (pid, name, address) is a hand-out not seen before.
    pub fn first_handout(&mut self, pid: u32, name: &str, addr: u64) -> bool {
        self.seen.insert((pid, name.to_string(), addr))
    }

    /// Library `lib` handed out its own code for table symbol `symbol` in `pid`.
    pub fn note_hook(&mut self, pid: u32, lib: u32, symbol: &str) {
        self.found
            .entry((pid, lib))
            .or_default()
            .hooks
            .insert(symbol.to_string());
    }

    /// Whether library `lib` is the real provider of `symbol` in `pid` (as read so far).
    pub fn is_real(&self, pid: u32, symbol: &str, lib: u32) -> bool {
        self.real
            .get(&(pid, symbol.to_string()))
            .is_some_and(|l| l.contains(&lib))
    }

    /// One `API_PATH` per (process, interposer): `calls` (pid, library id, symbol) → calls;
    /// `entered`: the same key → calls of that symbol entered from the interposer's code;
    /// `path`: a library id's path; `preload`: whether it came through `LD_PRELOAD` there.
    pub fn paths(
        &self,
        table: &SymbolTable,
        calls: &HashMap<(u32, u32, String), u64>,
        entered: &HashMap<(u32, u32, String), u64>,
        path: impl Fn(u32) -> String,
        preload: impl Fn(u32, u32) -> bool,
        last: bool,
    ) -> Vec<ApiPath> {
        let mut keys: Vec<&(u32, u32)> = self.found.keys().collect();
        keys.sort();
        keys.into_iter()
            .map(|&(pid, lib)| {
                let f = &self.found[&(pid, lib)];
                // The families it touches (its exports, its hooks, the symbols whose calls came
                // from its code), and every symbol of them the process called.
                let family = |s: &str| table.entry_for(s).map(|(_, e)| e.family.clone());
                let from_its_code = entered
                    .iter()
                    .filter(|((p, l, _), n)| *p == pid && *l == lib && **n > 0)
                    .map(|((_, _, s), _)| s);
                let families: BTreeSet<String> = f
                    .exports
                    .iter()
                    .chain(&f.hooks)
                    .chain(from_its_code)
                    .filter_map(|s| family(s))
                    .collect();
                // Only lookup overrides: every family the process called.
                let all = families.is_empty();
                let mut names: BTreeSet<&str> = f
                    .exports
                    .iter()
                    .chain(&f.hooks)
                    .map(String::as_str)
                    .collect();
                for (p, _, s) in calls.keys() {
                    if *p == pid && family(s).is_some_and(|fam| all || families.contains(&fam)) {
                        names.insert(s);
                    }
                }
                let real = |s: &str| self.real.get(&(pid, s.to_string()));
                let mut symbols: Vec<PathSymbol> = names
                    .into_iter()
                    .map(|s| PathSymbol {
                        symbol: s.to_string(),
                        through: calls
                            .get(&(pid, lib, s.to_string()))
                            .copied()
                            .unwrap_or(0)
                            .max(
                                entered
                                    .get(&(pid, lib, s.to_string()))
                                    .copied()
                                    .unwrap_or(0),
                            ),
                        total: real(s).map_or(0, |libs| {
                            libs.iter()
                                .filter(|l| **l != lib)
                                .map(|l| calls.get(&(pid, *l, s.to_string())).copied().unwrap_or(0))
                                .sum()
                        }),
                    })
                    .collect();
                symbols.sort_by(|a, b| {
                    (b.total.max(b.through))
                        .cmp(&a.total.max(a.through))
                        .then(a.symbol.cmp(&b.symbol))
                });
                let (lookups, api_lookups) =
                    self.lookups.get(&(pid, lib)).copied().unwrap_or((0, 0));
                ApiPath {
                    pid,
                    comm: self.comms.get(&pid).cloned().unwrap_or_default(),
                    library: path(lib),
                    preload: preload(pid, lib),
                    symbols,
                    lookups,
                    api_lookups,
                    overrides: f.overrides.iter().cloned().collect(),
                    last,
                }
            })
            .collect()
    }
}
