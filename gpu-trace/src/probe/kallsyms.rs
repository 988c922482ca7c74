//! Function symbols of a kernel module from `/proc/kallsyms`: which names are unique (a kprobe
//! or a trampoline can take them by name) and which exist several times (static functions
//! compiled once per file, e.g. `init_mqd` in each of amdgpu's MQD managers: the kernel refuses
//! a kprobe by such a name with EADDRNOTAVAIL, and a trampoline by name would silently take the
//! first copy), with the address of each copy.

use std::collections::BTreeMap;
use std::io;

/// Where the kernel lists its symbols.
pub const KALLSYMS_PATH: &str = "/proc/kallsyms";

#[derive(Debug, thiserror::Error)]
pub enum KallsymsError {
    #[error("cannot read {KALLSYMS_PATH}: {0} (run gpu-trace as root)")]
    Read(#[source] io::Error),
    #[error(
        "{KALLSYMS_PATH} shows every address as 0 (kernel.kptr_restrict hides them): run \
         gpu-trace as root, or `sysctl kernel.kptr_restrict=1`"
    )]
    Hidden,
}

/// `/proc/kallsyms` as text.
pub fn read_text() -> io::Result<String> {
    std::fs::read_to_string(KALLSYMS_PATH)
}

/// One code symbol of a `/proc/kallsyms` line: `ffffffffc0a1b2c0 t init_mqd\t[amdgpu]`.
struct TextSymbol<'a> {
    addr: &'a str,
    name: &'a str,
    /// The module, without its brackets; `None` for vmlinux.
    module: Option<&'a str>,
}

/// The code symbols (`t`/`T`) of a `/proc/kallsyms` text; data symbols that share a name are
/// left out.
fn text_symbols(text: &str) -> impl Iterator<Item = TextSymbol<'_>> {
    text.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let (addr, kind, name) = (f.next()?, f.next()?, f.next()?);
        matches!(kind, "t" | "T").then(|| TextSymbol {
            addr,
            name,
            module: f
                .next()
                .map(|m| m.trim_start_matches('[').trim_end_matches(']')),
        })
    })
}

/// For each name, the copies a `/proc/kallsyms` text lists (module name, `None` for vmlinux).
pub fn count_symbols(kallsyms: &str, names: &[&str]) -> BTreeMap<String, Vec<Option<String>>> {
    let mut out: BTreeMap<String, Vec<Option<String>>> =
        names.iter().map(|n| (n.to_string(), Vec::new())).collect();
    for sym in text_symbols(kallsyms) {
        if let Some(copies) = out.get_mut(sym.name) {
            copies.push(sym.module.map(str::to_string));
        }
    }
    out
}

/// The text symbols of one module: name → addresses (one per copy, ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleSymbols {
    by_name: BTreeMap<String, Vec<u64>>,
}

impl ModuleSymbols {
    /// Reads `/proc/kallsyms` and keeps the text symbols of `module`.
    pub fn load(module: &str) -> Result<Self, KallsymsError> {
        Self::parse(&read_text().map_err(KallsymsError::Read)?, module)
    }

    /// Keeps the text symbols (`t`/`T`) of `module` from `/proc/kallsyms` text. Fails when the
    /// module has symbols but every address reads 0 (hidden from this user).
    pub fn parse(text: &str, module: &str) -> Result<Self, KallsymsError> {
        let mut by_name: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut hidden = 0usize;
        for sym in text_symbols(text).filter(|s| s.module == Some(module)) {
            let Ok(addr) = u64::from_str_radix(sym.addr, 16) else {
                continue;
            };
            if addr == 0 {
                hidden += 1;
                continue;
            }
            by_name.entry(sym.name.to_string()).or_default().push(addr);
        }
        if by_name.is_empty() && hidden > 0 {
            return Err(KallsymsError::Hidden);
        }
        for addrs in by_name.values_mut() {
            addrs.sort_unstable();
        }
        Ok(Self { by_name })
    }

    /// The module that defines text symbol `symbol` (the first one listed), if any. Reads
    /// `/proc/kallsyms`.
    pub fn module_defining(symbol: &str) -> Result<Option<String>, KallsymsError> {
        Ok(Self::module_defining_in(
            &read_text().map_err(KallsymsError::Read)?,
            symbol,
        ))
    }

    /// [`ModuleSymbols::module_defining`] on `/proc/kallsyms` text.
    pub fn module_defining_in(text: &str, symbol: &str) -> Option<String> {
        text_symbols(text)
            .find(|s| s.name == symbol && s.module.is_some())
            .and_then(|s| s.module.map(str::to_string))
    }

    /// Whether the module has any text symbol (it is loaded).
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The addresses of every copy of `name` (empty when the module has none).
    pub fn addresses(&self, name: &str) -> &[u64] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// The nearest unique symbol at or below `addr` other than `except` (to tell the copies of
    /// a static function apart: each sits in its source file's code, next to that file's other
    /// functions).
    pub fn neighbour_below(&self, addr: u64, except: &str) -> Option<&str> {
        self.by_name
            .iter()
            .filter(|(name, addrs)| name.as_str() != except && addrs.len() == 1 && addrs[0] <= addr)
            .max_by_key(|(_, addrs)| addrs[0])
            .map(|(name, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines in the format of /proc/kallsyms (Debian 6.12, amdgpu loaded): two copies of a
    // static function, a unique one, a data symbol, another module's symbol.
    const SAMPLE: &str = "\
ffffffffc0a10000 t init_mqd\t[amdgpu]
ffffffffc0a0ff00 t mqd_manager_init_v9\t[amdgpu]
ffffffffc0b20000 t init_mqd\t[amdgpu]
ffffffffc0b1f000 T mqd_manager_init_v10\t[amdgpu]
ffffffffc0c00000 T pqm_create_queue\t[amdgpu]
ffffffffc0d00000 d amdkfd_ioctls\t[amdgpu]
ffffffffc0e00000 t init_mqd\t[other]
ffffffff81000000 T _stext
";

    #[test]
    fn copies_and_unique_names() {
        let s = ModuleSymbols::parse(SAMPLE, "amdgpu").unwrap();
        assert_eq!(
            s.addresses("init_mqd"),
            &[0xffff_ffff_c0a1_0000, 0xffff_ffff_c0b2_0000]
        );
        assert_eq!(s.addresses("pqm_create_queue").len(), 1);
        assert!(
            s.addresses("amdkfd_ioctls").is_empty(),
            "data symbols are not functions"
        );
        assert!(
            s.addresses("_stext").is_empty(),
            "vmlinux symbols are not the module's"
        );
        assert_eq!(
            s.neighbour_below(0xffff_ffff_c0a1_0000, "init_mqd"),
            Some("mqd_manager_init_v9")
        );
        assert_eq!(
            s.neighbour_below(0xffff_ffff_c0b2_0000, "init_mqd"),
            Some("mqd_manager_init_v10")
        );
        assert_eq!(
            ModuleSymbols::module_defining_in(SAMPLE, "pqm_create_queue").as_deref(),
            Some("amdgpu")
        );
        assert_eq!(
            ModuleSymbols::module_defining_in(SAMPLE, "amdkfd_ioctls"),
            None,
            "data, not text"
        );
        assert_eq!(
            ModuleSymbols::module_defining_in(SAMPLE, "_stext"),
            None,
            "vmlinux, no module"
        );
    }

    #[test]
    fn hidden_addresses_are_an_error_not_an_empty_module() {
        let hidden = SAMPLE
            .lines()
            .map(|l| format!("0000000000000000{}", &l[16..]))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(matches!(
            ModuleSymbols::parse(&hidden, "amdgpu"),
            Err(KallsymsError::Hidden)
        ));
        assert!(ModuleSymbols::parse(SAMPLE, "absent").unwrap().is_empty());
    }
}
