//! What gpu-trace reads of an ELF file that a traced process maps or a command will load:
//! `DT_NEEDED`, `DT_SONAME`, `DT_RPATH`/`DT_RUNPATH`, the table symbols it defines (with the
//! file offset a uprobe goes on) and whether it imports `dlsym`; for `API_STUCK`, its function
//! symbols and loadable segments.
//!
//! The file may be hostile (a 16 KB sparse file that claims a 2 GB `.dynsym`, a dynamic
//! section of a million `DT_NEEDED`): it is read by ranges through the `object` crate's
//! low-level ELF reader, every read charged to one budget per file ([`Limit::Elf`]), so a
//! claim past it fails that read instead of allocating it; `.symtab` is read only for
//! `API_STUCK` and an interposer's probable hidden hooks; `DT_NEEDED` entries are capped ([`Limit::Needed`]). What was left out is said
//! in [`Facts::skipped`].

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;

use gpu_trace_core::api::interposer::{self, HiddenHooks};
use gpu_trace_core::api::resolve::Binding;
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::decode_lossless;
use object::elf;
use object::read::elf::{Dyn as _, FileHeader, ProgramHeader as _, SectionHeader as _, Sym as _};
use object::read::{ReadCache, ReadRef, StringTable};
use object::{Endianness, SectionIndex};

use super::untrusted::Limit;

/// The lookup functions (the core's list: `attach` probes them by their shape).
pub use gpu_trace_core::api::interposer::LOOKUPS;

/// One table symbol an ELF file defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defined {
    pub binding: Binding,
    /// Where its code starts in the file: the uprobe's offset.
    pub offset: u64,
}

/// What one ELF file holds for the resolution and the attach.
#[derive(Debug, Default)]
pub struct Facts {
    pub soname: Option<String>,
    pub needed: Vec<String>,
    /// `DT_RPATH` and `DT_RUNPATH`, as written (colon-separated, `$ORIGIN` unexpanded).
    pub rpath: Option<String>,
    pub runpath: Option<String>,
    pub has_dynsym: bool,
    pub defines: BTreeMap<String, Defined>,
    pub imports_dlsym: bool,
    /// The file offset of `_dl_debug_state` where the file defines it (glibc's dynamic
    /// linker): the API layer's notification point for a change of the link map.
    pub dl_debug_state: Option<u64>,
    /// `PT_INTERP`: the dynamic linker an executable asks for.
    pub interp: Option<String>,
    /// The lookup functions it defines ([`LOOKUPS`]), with their file offsets (one per
    /// distinct offset: libc's `dlsym` has two versions).
    pub lookups: Vec<(String, u64)>,
    /// The lookup functions and `dlopen` it exports, by name (`--resolve`'s override flags).
    pub exports_lookups: Vec<String>,
    /// What was not read past a limit (`None`: the file was read whole).
    pub skipped: Option<String>,
}

/// A file read through `object`'s cache, each read charged to a budget.
struct Capped<'f> {
    cache: ReadCache<&'f File>,
    left: Cell<u64>,
    over: Cell<bool>,
}

impl<'f> Capped<'f> {
    fn new(file: &'f File) -> Self {
        Self {
            cache: ReadCache::new(file),
            left: Cell::new(Limit::Elf.bytes()),
            over: Cell::new(false),
        }
    }

    fn charge(&self, n: u64) -> Result<(), ()> {
        match self.left.get().checked_sub(n) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.over.set(true);
                Err(())
            }
        }
    }
}

impl<'a> ReadRef<'a> for &'a Capped<'_> {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        self.charge(size)?;
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        // `object` reads at most 4 KiB looking for the delimiter.
        self.charge(4096)?;
        (&self.cache).read_bytes_at_until(range, delimiter)
    }
}

/// The facts of `file` (`None`: not a 32- or 64-bit ELF object).
pub fn facts(file: &File, table: &SymbolTable) -> Option<Facts> {
    let data = Capped::new(file);
    let mut facts = match object::FileKind::parse(&data).ok()? {
        object::FileKind::Elf64 => facts_of::<elf::FileHeader64<Endianness>>(&data, table)?,
        object::FileKind::Elf32 => facts_of::<elf::FileHeader32<Endianness>>(&data, table)?,
        _ => return None,
    };
    if data.over.get() && facts.skipped.is_none() {
        facts.skipped = Some(past_budget("parts"));
    }
    Some(facts)
}

fn facts_of<Elf: FileHeader<Endian = Endianness>>(
    data: &Capped<'_>,
    table: &SymbolTable,
) -> Option<Facts> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let mut facts = Facts {
        interp: interp(header, endian, data),
        ..Facts::default()
    };
    if let Ok(Some((dynamic, link))) = sections.dynamic(endian, data) {
        let strings = sections.strings(endian, data, link).unwrap_or_default();
        for d in dynamic {
            let tag = d.tag(endian);
            let Some(name) = [
                elf::DT_NEEDED,
                elf::DT_SONAME,
                elf::DT_RPATH,
                elf::DT_RUNPATH,
            ]
            .contains(&tag)
            .then(|| d.string(endian, strings).ok())
            .flatten()
            .map(decode_lossless) else {
                continue;
            };
            match tag {
                elf::DT_NEEDED if facts.needed.len() as u64 >= Limit::Needed.bytes() => {
                    facts.skipped = Some(format!(
                        "DT_NEEDED entries (past {})",
                        Limit::Needed.describe()
                    ));
                }
                elf::DT_NEEDED => facts.needed.push(name),
                elf::DT_SONAME => facts.soname = Some(name),
                elf::DT_RPATH => facts.rpath = Some(name),
                _ => facts.runpath = Some(name),
            }
        }
    }
    let Some(dynsym) = symbol_table(&sections, endian, data, elf::SHT_DYNSYM) else {
        return Some(facts);
    };
    facts.has_dynsym = true;
    let Some((symbols, strings)) = dynsym else {
        facts.skipped = Some(past_budget("its dynamic symbols"));
        return Some(facts);
    };
    for sym in symbols {
        let Ok(name) = sym.name(endian, strings) else {
            continue;
        };
        let shndx = sym.st_shndx(endian);
        if shndx == elf::SHN_UNDEF {
            facts.imports_dlsym |= name == b"dlsym" || name == b"dlvsym";
            continue;
        }
        let is_code = sym.st_type() == elf::STT_FUNC || sym.st_type() == elf::STT_GNU_IFUNC;
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if name == "_dl_debug_state" && is_code {
            let shndx = (shndx < elf::SHN_LORESERVE).then_some(shndx);
            facts.dl_debug_state =
                file_offset(&sections, endian, shndx, sym.st_value(endian).into());
            continue;
        }
        if is_code
            && sym.st_bind() != elf::STB_LOCAL
            && interposer::lookup_kind(name).is_some()
            && !facts.exports_lookups.iter().any(|l| l == name)
        {
            facts.exports_lookups.push(name.to_string());
        }
        if is_code
            && sym.st_bind() != elf::STB_LOCAL
            && LOOKUPS.iter().any(|(l, _)| *l == name)
            && let Some(offset) = file_offset(
                &sections,
                endian,
                (shndx < elf::SHN_LORESERVE).then_some(shndx),
                sym.st_value(endian).into(),
            )
            && !facts.lookups.iter().any(|(_, o)| *o == offset)
        {
            facts.lookups.push((name.to_string(), offset));
        }
        if !is_code || sym.st_bind() == elf::STB_LOCAL || table.entry_for(name).is_none() {
            continue;
        }
        let Some(offset) = file_offset(
            &sections,
            endian,
            (shndx < elf::SHN_LORESERVE).then_some(shndx),
            sym.st_value(endian).into(),
        ) else {
            continue;
        };
        let binding = if sym.st_bind() == elf::STB_WEAK {
            Binding::Weak
        } else {
            Binding::Global
        };
        facts
            .defines
            .insert(name.to_string(), Defined { binding, offset });
    }
    Some(facts)
}

/// `PT_INTERP`'s path (at most 4 KiB).
fn interp<Elf: FileHeader<Endian = Endianness>>(
    header: &Elf,
    endian: Endianness,
    data: &Capped<'_>,
) -> Option<String> {
    let p = header
        .program_headers(endian, data)
        .ok()?
        .iter()
        .find(|p| p.p_type(endian) == elf::PT_INTERP)?;
    let (off, size): (u64, u64) = (p.p_offset(endian).into(), p.p_filesz(endian).into());
    let bytes = data.read_bytes_at(off, size.min(4096)).ok()?;
    let bytes = bytes.split(|&b| b == 0).next()?;
    (!bytes.is_empty()).then(|| decode_lossless(bytes))
}

fn past_budget(what: &str) -> String {
    format!("{what} (past the {})", Limit::Elf.describe())
}

/// A symbol table and its names.
type Symbols<'a, Elf> = (&'a [<Elf as FileHeader>::Sym], StringTable<'a, &'a [u8]>);

/// The file's symbol table of section type `kind` (`SHT_DYNSYM`, `SHT_SYMTAB`) with its
/// names, each read whole (charged). `None`: the file has none; `Some(None)`: it is past the
/// budget (or malformed).
fn symbol_table<'a, Elf: FileHeader<Endian = Endianness>>(
    sections: &object::read::elf::SectionTable<'a, Elf, &'a Capped<'_>>,
    endian: Endianness,
    data: &'a Capped<'_>,
    kind: u32,
) -> Option<Option<Symbols<'a, Elf>>> {
    let (_, table) = sections
        .enumerate()
        .find(|(_, s)| s.sh_type(endian) == kind)?;
    let strings = whole_strings(sections, endian, data, table.sh_link(endian));
    let symbols = table.data_as_array::<Elf::Sym, _>(endian, data).ok();
    Some(symbols.zip(strings))
}

/// A string table read whole (one charged read), for symbol names read by the thousand.
fn whole_strings<'a, Elf: FileHeader<Endian = Endianness>>(
    sections: &object::read::elf::SectionTable<'a, Elf, &'a Capped<'_>>,
    endian: Endianness,
    data: &'a Capped<'_>,
    link: u32,
) -> Option<StringTable<'a, &'a [u8]>> {
    let s = sections.section(SectionIndex(link as usize)).ok()?;
    let (off, size) = (s.sh_offset(endian).into(), s.sh_size(endian).into());
    let bytes = data.read_bytes_at(off, size).ok()?;
    Some(StringTable::new(bytes, 0, bytes.len() as u64))
}

/// The file offset of address `value` of section `shndx` (as aya translates symbols of
/// executables and shared objects).
fn file_offset<'a, Elf: FileHeader<Endian = Endianness>>(
    sections: &object::read::elf::SectionTable<'a, Elf, &'a Capped<'_>>,
    endian: Endianness,
    shndx: Option<u16>,
    value: u64,
) -> Option<u64> {
    let s = sections.section(SectionIndex(shndx?.into())).ok()?;
    let addr: u64 = s.sh_addr(endian).into();
    let off: u64 = s.sh_offset(endian).into();
    value.checked_sub(addr)?.checked_add(off)
}

/// The probable hidden hooks of an interposer's file (`interposer::HiddenHooks`): the local
/// functions of its `.symtab` (bound `STB_LOCAL`, or hidden) whose names hold a table symbol,
/// at most `HIDDEN_HOOKS_CAP`, read under the same budget as [`facts`]. Also what was left
/// out past the budget. `None`: not an ELF object.
pub fn hidden_hooks(file: &File, table: &SymbolTable) -> Option<(HiddenHooks, Option<String>)> {
    let data = Capped::new(file);
    let hooks = match object::FileKind::parse(&data).ok()? {
        object::FileKind::Elf64 => hidden_hooks_of::<elf::FileHeader64<Endianness>>(&data, table)?,
        object::FileKind::Elf32 => hidden_hooks_of::<elf::FileHeader32<Endianness>>(&data, table)?,
        _ => return None,
    };
    let skipped = data.over.get().then(|| past_budget("its .symtab"));
    Some((hooks, skipped))
}

fn hidden_hooks_of<Elf: FileHeader<Endian = Endianness>>(
    data: &Capped<'_>,
    table: &SymbolTable,
) -> Option<HiddenHooks> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let mut hooks = HiddenHooks::default();
    let Some(symtab) = symbol_table(&sections, endian, data, elf::SHT_SYMTAB) else {
        return Some(hooks);
    };
    hooks.symtab = true;
    let Some((symbols, strings)) = symtab else {
        return Some(hooks);
    };
    for sym in symbols {
        let shndx = sym.st_shndx(endian);
        let local = sym.st_bind() == elf::STB_LOCAL
            || matches!(sym.st_visibility(), elf::STV_HIDDEN | elf::STV_INTERNAL);
        if sym.st_type() != elf::STT_FUNC
            || !local
            || shndx == elf::SHN_UNDEF
            || shndx >= elf::SHN_LORESERVE
        {
            continue;
        }
        let Ok(name) = sym.name(endian, strings) else {
            continue;
        };
        let Some(offset) = file_offset(&sections, endian, Some(shndx), sym.st_value(endian).into())
        else {
            continue;
        };
        let name = std::str::from_utf8(name)
            .map_or_else(|_| decode_lossless(name).into(), std::borrow::Cow::Borrowed);
        if !hooks.add(table, &name, offset) {
            break;
        }
    }
    Some(hooks)
}

/// Function symbols (address, size, name; sorted by address, one per address) and loadable
/// segments (file offset, size, address) of an ELF file, for `API_STUCK`'s frames. `.symtab`
/// and `.dynsym` both, under the same budget as [`facts`].
pub struct TextSymbols {
    pub syms: Vec<(u64, u64, String)>,
    pub segments: Vec<(u64, u64, u64)>,
}

/// See [`TextSymbols`] (`None`: not an ELF object).
pub fn text_symbols(file: &File) -> Option<TextSymbols> {
    let data = Capped::new(file);
    match object::FileKind::parse(&data).ok()? {
        object::FileKind::Elf64 => text_symbols_of::<elf::FileHeader64<Endianness>>(&data),
        object::FileKind::Elf32 => text_symbols_of::<elf::FileHeader32<Endianness>>(&data),
        _ => None,
    }
}

fn text_symbols_of<Elf: FileHeader<Endian = Endianness>>(data: &Capped<'_>) -> Option<TextSymbols> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let segments = header
        .program_headers(endian, data)
        .ok()?
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .map(|p| {
            (
                p.p_offset(endian).into(),
                p.p_filesz(endian).into(),
                p.p_vaddr(endian).into(),
            )
        })
        .collect();
    let sections = header.sections(endian, data).ok()?;
    let mut syms = Vec::new();
    for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        let Some(Some((symbols, strings))) = symbol_table(&sections, endian, data, kind) else {
            continue;
        };
        for s in symbols {
            let value: u64 = s.st_value(endian).into();
            if s.st_type() != elf::STT_FUNC || value == 0 {
                continue;
            }
            if let Ok(name) = s.name(endian, strings) {
                syms.push((value, s.st_size(endian).into(), decode_lossless(name)));
            }
        }
    }
    syms.sort();
    syms.dedup_by_key(|s| s.0);
    Some(TextSymbols { syms, segments })
}
