//! What `gpu-trace api --resolve` reads of a process: /proc/PID/{maps,environ,exe,fd,comm} and
//! the ELF files it maps (DT_NEEDED, DT_SONAME and the dynamic symbol table, through the
//! `object` crate). The resolution itself is pure: `gpu_trace_core::api`.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::rc::Rc;

use gpu_trace_core::api::render::ProcessReport;
use gpu_trace_core::api::resolve::{Binding, Library, Origin, resolve};
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::decode_lossless;
use object::read::elf::{ElfFile, FileHeader};
use object::{Object as _, ObjectSymbol as _};

/// Why a process could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("PID {0}: no such process")]
    NoProcess(u32),
    #[error("PID {0} exited while it was being read")]
    Exited(u32),
    #[error(
        "PID {0}: permission denied reading /proc/{0}/maps (another user's process): run as \
         root, e.g. sudo gpu-trace api --resolve"
    )]
    Denied(u32),
    #[error(
        "PID {0}: permission denied reading /proc/{0}/maps even as root (a process the kernel \
         keeps from ptrace-read access: another user namespace's, or a Yama/LSM policy): run \
         gpu-trace in the process's namespace"
    )]
    DeniedToRoot(u32),
    #[error("PID {pid}: reading {what}: {source}")]
    Io {
        pid: u32,
        what: String,
        source: io::Error,
    },
}

/// What one ELF file holds for the resolution.
#[derive(Debug, Default)]
struct ElfInfo {
    soname: Option<String>,
    needed: Vec<String>,
    /// `DT_RPATH` and `DT_RUNPATH`, as written (colon-separated, `$ORIGIN` unexpanded).
    rpath: Option<String>,
    runpath: Option<String>,
    has_dynsym: bool,
    defines: BTreeMap<String, Binding>,
    imports_dlsym: bool,
}

/// One file-backed mapping of /proc/PID/maps (the first of each path).
#[derive(Debug, PartialEq, Eq)]
pub struct Mapping {
    /// `start-end`, the name of its /proc/PID/map_files entry.
    pub range: String,
    pub dev: String,
    pub inode: u64,
    pub path: String,
    /// Some mapping of the path is executable (code: an ELF object, not a data file such as
    /// model weights mapped by the process).
    pub executable: bool,
}

/// The file-backed mappings of a /proc/PID/maps text, one per path (its first), in address
/// order.
pub fn parse_maps(text: &[u8]) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let line = decode_lossless(line);
        let mut rest = line.as_str();
        let mut fields = [""; 5];
        for f in &mut fields {
            rest = rest.trim_start_matches(' ');
            let end = rest.find(' ').unwrap_or(rest.len());
            *f = &rest[..end];
            rest = &rest[end..];
        }
        let path = rest.trim_start_matches(' ');
        let inode = fields[4].parse().unwrap_or(0);
        if inode == 0 || !path.starts_with('/') {
            continue;
        }
        let executable = fields[1].contains('x');
        if let Some(m) = out.iter_mut().find(|m| m.path == path) {
            m.executable |= executable;
            continue;
        }
        out.push(Mapping {
            range: fields[0].to_string(),
            dev: fields[3].to_string(),
            inode,
            path: path.to_string(),
            executable,
        });
    }
    out
}

/// `LD_PRELOAD`'s entries in a /proc/PID/environ text, split as ld.so does (spaces and
/// colons).
pub fn preload_of_environ(environ: &[u8]) -> Vec<String> {
    environ
        .split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
        .next_back() // ld.so takes the last LD_PRELOAD of the environment
        .map(split_preload)
        .unwrap_or_default()
}

/// An `LD_PRELOAD` value's entries, split as ld.so does (spaces, colons, tabs, newlines).
pub fn split_preload(value: &[u8]) -> Vec<String> {
    value
        .split(|&b| b == b' ' || b == b':' || b == b'\t' || b == b'\n')
        .filter(|s| !s.is_empty())
        .map(decode_lossless)
        .collect()
}

/// Reads processes, parsing each mapped ELF file once (by device and inode).
pub struct Reader {
    table: SymbolTable,
    cache: HashMap<(String, u64), Option<Rc<ElfInfo>>>,
}

impl Reader {
    pub fn new(table: SymbolTable) -> Self {
        Self {
            table,
            cache: HashMap::new(),
        }
    }

    /// The symbol table it reads libraries against.
    pub fn table(&self) -> &SymbolTable {
        &self.table
    }

    /// Everything `--resolve` says about `pid`.
    pub fn read(&mut self, pid: u32) -> Result<ProcessReport, ReadError> {
        let proc_dir = format!("/proc/{pid}");
        if !Path::new(&proc_dir).exists() {
            return Err(ReadError::NoProcess(pid));
        }
        let comm = std::fs::read(format!("{proc_dir}/comm"))
            .map(|b| decode_lossless(b.strip_suffix(b"\n").unwrap_or(&b)))
            .map_err(|e| io_error(pid, "comm", e))?;
        let maps = std::fs::read(format!("{proc_dir}/maps")).map_err(|e| match e.kind() {
            // SAFETY: no arguments.
            io::ErrorKind::PermissionDenied if unsafe { libc::geteuid() } == 0 => {
                ReadError::DeniedToRoot(pid)
            }
            io::ErrorKind::PermissionDenied => ReadError::Denied(pid),
            _ => io_error(pid, "maps", e),
        })?;
        let mapped: Vec<(Mapping, Rc<ElfInfo>)> = parse_maps(&maps)
            .into_iter()
            .filter(|m| m.executable)
            .filter_map(|m| self.elf(pid, &m).map(|info| (m, info)))
            .collect();
        let exe = std::fs::read_link(format!("{proc_dir}/exe"))
            .ok()
            .map(|p| decode_lossless(p.as_os_str().as_encoded_bytes()));
        let preload = read_preload(pid);
        let (libraries, preload_unmapped) =
            binding_order(&mapped, exe.as_deref(), preload.as_deref().unwrap_or(&[]));
        let gpu_open = gpu_open(pid);
        // Gone by now: what was read may be half of it.
        if !Path::new(&proc_dir).exists() || (maps.is_empty() && exe.is_some()) {
            return Err(ReadError::Exited(pid));
        }
        let resolution = resolve(&self.table, &libraries, gpu_open);
        Ok(ProcessReport {
            pid,
            comm,
            preload,
            preload_unmapped,
            libraries,
            gpu_open,
            resolution,
        })
    }

    /// The ELF facts of a mapped file (`None`: not an ELF object, or unreadable).
    fn elf(&mut self, pid: u32, m: &Mapping) -> Option<Rc<ElfInfo>> {
        let key = (m.dev.clone(), m.inode);
        if let Some(hit) = self.cache.get(&key) {
            return hit.clone();
        }
        // map_files opens the very file mapped (deleted, or in another mount namespace).
        let file = std::fs::File::open(format!("/proc/{pid}/map_files/{}", m.range))
            .or_else(|_| std::fs::File::open(format!("/proc/{pid}/root{}", m.path)))
            .ok();
        let info = file.and_then(|f| elf_info(f, &self.table)).map(Rc::new);
        self.cache.insert(key, info.clone());
        info
    }
}

fn io_error(pid: u32, what: &str, source: io::Error) -> ReadError {
    if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
        ReadError::Exited(pid)
    } else {
        ReadError::Io {
            pid,
            what: format!("/proc/{pid}/{what}"),
            source,
        }
    }
}

/// `LD_PRELOAD` (from /proc/PID/environ), then /etc/ld.so.preload as the process sees it.
fn read_preload(pid: u32) -> Result<Vec<String>, String> {
    let mut entries = match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(environ) => preload_of_environ(&environ),
        Err(e) => return Err(format!("/proc/{pid}/environ is not readable: {e}")),
    };
    if let Ok(text) = std::fs::read(format!("/proc/{pid}/root/etc/ld.so.preload")) {
        entries.extend(split_preload(&text));
    }
    Ok(entries)
}

/// A device node of a GPU driver is open (`None`: the fds cannot be read).
fn gpu_open(pid: u32) -> Option<bool> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|t| {
            let t = t.as_os_str().as_encoded_bytes();
            t.starts_with(b"/dev/nvidia") || t == b"/dev/kfd" || t.starts_with(b"/dev/dri/")
        })
    }))
}

/// The libraries in the dynamic linker's order: the executable, the preloads, DT_NEEDED
/// breadth-first; then the rest (`dlopen`ed). Also the preload entries nothing mapped matches.
fn binding_order(
    mapped: &[(Mapping, Rc<ElfInfo>)],
    exe: Option<&str>,
    preload: &[String],
) -> (Vec<Library>, Vec<String>) {
    let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let is_named = |i: usize, name: &str| {
        let (m, info) = &mapped[i];
        file_name(&m.path) == name || info.soname.as_deref() == Some(name)
    };
    let mut order: Vec<(usize, Origin)> = Vec::new();
    let taken = |order: &[(usize, Origin)], i: usize| order.iter().any(|&(j, _)| j == i);
    let exe = exe.map(|e| e.strip_suffix(" (deleted)").unwrap_or(e));
    if let Some(i) = (0..mapped.len()).find(|&i| Some(mapped[i].0.path.as_str()) == exe) {
        order.push((i, Origin::Executable));
    } else if !mapped.is_empty() {
        order.push((0, Origin::Executable));
    }
    let mut unmapped = Vec::new();
    for entry in preload {
        let found = (0..mapped.len()).find(|&i| {
            !taken(&order, i)
                && (mapped[i].0.path == *entry
                    || (!entry.contains('/') && is_named(i, entry))
                    || (entry.contains('/') && is_named(i, &file_name(entry))))
        });
        match found {
            Some(i) => order.push((i, Origin::Preload)),
            None => unmapped.push(entry.clone()),
        }
    }
    let mut next = 0;
    while next < order.len() {
        let (i, _) = order[next];
        for needed in &mapped[i].1.needed {
            if let Some(j) = (0..mapped.len()).find(|&j| !taken(&order, j) && is_named(j, needed)) {
                order.push((j, Origin::Needed));
            }
        }
        next += 1;
    }
    for i in 0..mapped.len() {
        if !taken(&order, i) {
            order.push((i, Origin::Dlopen));
        }
    }
    let libraries = order
        .into_iter()
        .map(|(i, origin)| {
            let (m, info) = &mapped[i];
            Library {
                path: m.path.clone(),
                soname: info.soname.clone(),
                origin,
                has_dynsym: info.has_dynsym,
                defines: info.defines.clone(),
                imports_dlsym: info.imports_dlsym,
            }
        })
        .collect();
    (libraries, unmapped)
}

/// The ELF facts of `file` (`None`: not a 32- or 64-bit ELF object). Only the parts read
/// are read (headers, dynamic section, dynamic symbols and strings): a CUDA library of
/// hundreds of MB, or model weights the process mapped, is not read whole.
fn elf_info(file: std::fs::File, table: &SymbolTable) -> Option<ElfInfo> {
    let cache = object::ReadCache::new(file);
    let data = &cache;
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf64 => {
            elf_info_of::<object::elf::FileHeader64<object::Endianness>, _>(data, table)
        }
        object::FileKind::Elf32 => {
            elf_info_of::<object::elf::FileHeader32<object::Endianness>, _>(data, table)
        }
        _ => None,
    }
}

fn elf_info_of<'data, Elf: FileHeader<Endian = object::Endianness>, R: object::ReadRef<'data>>(
    data: R,
    table: &SymbolTable,
) -> Option<ElfInfo> {
    let file = ElfFile::<Elf, R>::parse(data).ok()?;
    let mut info = ElfInfo::default();
    if let Ok(dynamic) = file.elf_dynamic_table() {
        for d in dynamic.iter() {
            let tag = d.tag;
            let slot = match tag {
                object::elf::DT_NEEDED | object::elf::DT_SONAME => None,
                object::elf::DT_RPATH => Some(&mut info.rpath),
                object::elf::DT_RUNPATH => Some(&mut info.runpath),
                _ => continue,
            };
            let Ok(name) = dynamic.string(d) else {
                continue;
            };
            let name = decode_lossless(name);
            match slot {
                Some(slot) => *slot = Some(name),
                None if tag == object::elf::DT_NEEDED => info.needed.push(name),
                None => info.soname = Some(name),
            }
        }
    }
    info.has_dynsym = file.dynamic_symbol_table().is_some();
    for sym in file.dynamic_symbols() {
        let Ok(name) = sym.name() else { continue };
        if sym.is_undefined() {
            info.imports_dlsym |= name == "dlsym" || name == "dlvsym";
        } else if sym.kind() == object::SymbolKind::Text
            && !sym.is_local()
            && table.entry_for(name).is_some()
        {
            let binding = if sym.is_weak() {
                Binding::Weak
            } else {
                Binding::Global
            };
            info.defines.insert(name.to_string(), binding);
        }
    }
    Some(info)
}

/// The `DT_NEEDED` names of the ELF file at `path` (empty where it is not one or has none).
pub fn needed_of(path: &Path, table: &SymbolTable) -> Vec<String> {
    std::fs::File::open(path)
        .ok()
        .and_then(|f| elf_info(f, table))
        .map(|i| i.needed)
        .unwrap_or_default()
}

/// What the dynamic linker reads of an object to find its dependencies: its `DT_NEEDED`
/// names and its `DT_RPATH` / `DT_RUNPATH` (`None`: not an ELF object, or unreadable).
pub fn dependencies_of(path: &Path, table: &SymbolTable) -> Option<super::linker::Dependencies> {
    let info = elf_info(std::fs::File::open(path).ok()?, table)?;
    Some(super::linker::Dependencies {
        needed: info.needed,
        rpath: info.rpath,
        runpath: info.runpath,
    })
}

/// The table symbols the ELF file at `path` defines (none: not an ELF object, or unreadable).
pub fn defines_of(path: &Path, table: &SymbolTable) -> Vec<String> {
    std::fs::File::open(path)
        .ok()
        .and_then(|f| elf_info(f, table))
        .map(|i| i.defines.into_keys().collect())
        .unwrap_or_default()
}

/// Every process's PID (the numeric entries of /proc).
pub fn all_pids() -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// The kernel's name of `pid` (`None`: gone).
pub fn comm_of(pid: u32) -> Option<Vec<u8>> {
    let mut b = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    if b.last() == Some(&b'\n') {
        b.pop();
    }
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_keep_one_file_backed_mapping_per_path() {
        let text = b"55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234   /tmp/my client\n\
55d0c0a01000-55d0c0a02000 r-xp 00001000 08:01 1234   /tmp/my client\n\
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n\
7f0000001000-7f0000002000 r-xp 00000000 08:01 99 /usr/lib/libamdhip64.so.5.2 (deleted)\n\
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0   [vdso]\n\
7f1000000000-7f1800000000 r--s 00000000 08:01 77 /data/weights.bin\n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].path, "/tmp/my client");
        assert!(maps[0].executable, "its second mapping is r-x");
        assert_eq!(maps[2].path, "/data/weights.bin");
        assert!(!maps[2].executable);
        assert_eq!(maps[0].range, "55d0c0a00000-55d0c0a01000");
        assert_eq!((maps[1].dev.as_str(), maps[1].inode), ("08:01", 99));
        assert_eq!(maps[1].path, "/usr/lib/libamdhip64.so.5.2 (deleted)");
    }

    #[test]
    fn ld_preload_splits_on_spaces_and_colons() {
        let env = b"A=1\0LD_PRELOAD=/a.so:/b.so  libc.so\0B=2\0";
        assert_eq!(preload_of_environ(env), ["/a.so", "/b.so", "libc.so"]);
        assert!(preload_of_environ(b"A=1\0").is_empty());
    }
}
