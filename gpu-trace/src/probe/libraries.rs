//! What `gpu-trace api --resolve` reads of a process: /proc/PID/{maps,environ,exe,fd,comm} and
//! the ELF files it maps (DT_NEEDED, DT_SONAME and the dynamic symbol table, `probe::elf`; an
//! interposer's `.symtab` for its probable hidden hooks).
//! Everything a process controls is opened and read by `probe::untrusted`'s rules (inside its
//! root, regular files only, capped). The resolution itself is pure: `gpu_trace_core::api`.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::Arc;

use gpu_trace_core::api::interposer::{self, HiddenHooks};
use gpu_trace_core::api::render::ProcessReport;
use gpu_trace_core::api::resolve::{Library, Origin, resolve};
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::{decode_lossless, escape_text};

use super::elf::{self, Facts};
use super::untrusted::{self, Limit, UntrustedError, Verified};

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
    #[error("PID {0}: {1}")]
    Untrusted(u32, UntrustedError),
    #[error(
        "PID {0}: reading it took over {secs} s (a file it maps or its /proc entries did not \
         answer): left out",
        secs = untrusted::TARGET_DEADLINE.as_secs()
    )]
    TimedOut(u32),
}

/// A mapped ELF file as read once: its facts, and the file itself where it defines table
/// symbols (the uprobes go on it by descriptor; the other files are closed at once).
#[derive(Debug)]
pub struct Opened {
    pub file: Option<Verified>,
    pub facts: Facts,
    /// Its probable hidden hooks, read from its `.symtab` where it interposes (`--resolve`).
    pub hidden_hooks: Option<HiddenHooks>,
}

impl Opened {
    /// `facts` of `file`, keeping the file only where something is probed in it (table
    /// symbols, lookup functions, the dynamic linker's notification point). Each probe's
    /// first byte is read here (the page comes into the cache, and a symbol past the file's
    /// end is dropped): the kernel reads it again as it puts the probe on, and a file that
    /// would block that read blocks this worker instead, under its deadline.
    fn new(file: Verified, mut facts: Facts) -> Self {
        use std::os::unix::fs::FileExt as _;
        let readable = |offset: u64| {
            let mut byte = [0u8; 1];
            file.file().read_at(&mut byte, offset).is_ok_and(|n| n == 1)
        };
        facts.defines.retain(|_, d| readable(d.offset));
        facts.lookups.retain(|(_, offset)| readable(*offset));
        let keep = !facts.defines.is_empty()
            || !facts.lookups.is_empty()
            || facts.dl_debug_state.is_some();
        let file = keep.then_some(file);
        Self {
            file,
            facts,
            hidden_hooks: None,
        }
    }
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
    cache: HashMap<(String, u64), Option<Arc<Opened>>>,
    /// Files (by device and inode) or processes something was left out of, said once each.
    noted: HashSet<String>,
    /// How many files or processes something was left out of (past a limit, or refused: not a
    /// regular file).
    skipped: u64,
}

/// A process's report and the files behind its libraries, by path (`Reader::read_files`).
pub type ReadFiles = (ProcessReport, HashMap<String, Arc<Opened>>);

impl Reader {
    pub fn new(table: SymbolTable) -> Self {
        Self {
            table,
            cache: HashMap::new(),
            noted: HashSet::new(),
            skipped: 0,
        }
    }

    /// The symbol table it reads libraries against.
    pub fn table(&self) -> &SymbolTable {
        &self.table
    }

    /// How many files or processes something was left out of (past a read limit, or not a
    /// regular file), each said once on stderr.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Everything `--resolve` says about `pid`.
    pub fn read(&mut self, pid: u32) -> Result<ProcessReport, ReadError> {
        self.read_files(pid).map(|(report, _)| report)
    }

    /// [`Self::read`], with the opened file of each library of the report (by path).
    pub fn read_files(&mut self, pid: u32) -> Result<ReadFiles, ReadError> {
        let proc_dir = format!("/proc/{pid}");
        if !Path::new(&proc_dir).exists() {
            return Err(ReadError::NoProcess(pid));
        }
        let comm = std::fs::read(format!("{proc_dir}/comm"))
            .map(|b| decode_lossless(b.strip_suffix(b"\n").unwrap_or(&b)))
            .map_err(|e| io_error(pid, "comm", e))?;
        let maps = untrusted::read_proc(&format!("{proc_dir}/maps"), Limit::Maps).map_err(|e| {
            match e.io_error().map(io::Error::kind) {
                // SAFETY: no arguments.
                Some(io::ErrorKind::PermissionDenied) if unsafe { libc::geteuid() } == 0 => {
                    ReadError::DeniedToRoot(pid)
                }
                Some(io::ErrorKind::PermissionDenied) => ReadError::Denied(pid),
                Some(_) => match e {
                    UntrustedError::Io { source, .. } => io_error(pid, "maps", source),
                    e => ReadError::Untrusted(pid, e),
                },
                None => ReadError::Untrusted(pid, e),
            }
        })?;
        let mut files = HashMap::new();
        let mapped: Vec<(Mapping, Arc<Opened>)> = parse_maps(&maps)
            .into_iter()
            .filter(|m| m.executable)
            .filter_map(|m| {
                let opened = self.elf(pid, &m)?;
                files.insert(m.path.clone(), opened.clone());
                Some((m, opened))
            })
            .collect();
        let exe = std::fs::read_link(format!("{proc_dir}/exe"))
            .ok()
            .map(|p| decode_lossless(p.as_os_str().as_encoded_bytes()));
        let preload = self.read_preload(pid);
        let (libraries, preload_unmapped) =
            binding_order(&mapped, exe.as_deref(), preload.as_deref().unwrap_or(&[]));
        let gpu_open = gpu_open(pid);
        // Gone by now: what was read may be half of it.
        if !Path::new(&proc_dir).exists() || (maps.is_empty() && exe.is_some()) {
            return Err(ReadError::Exited(pid));
        }
        let resolution = resolve(&self.table, &libraries, gpu_open);
        let report = ProcessReport {
            pid,
            comm,
            preload,
            preload_unmapped,
            libraries,
            gpu_open,
            resolution,
        };
        Ok((report, files))
    }

    /// The mapped ELF file and its facts (`None`: not an ELF object, not a regular file, or
    /// unreadable).
    fn elf(&mut self, pid: u32, m: &Mapping) -> Option<Arc<Opened>> {
        let key = (m.dev.clone(), m.inode);
        if let Some(hit) = self.cache.get(&key) {
            return hit.clone();
        }
        let opened = match untrusted::open_mapping(pid, &m.range, &m.path) {
            Ok(file) => elf::facts(file.file(), &self.table).map(|facts| {
                let interposes = interposer::interposes(
                    &self.table,
                    &m.path,
                    facts.soname.as_deref(),
                    facts.defines.keys().map(String::as_str),
                    facts.exports_lookups.iter().map(String::as_str),
                );
                let hidden = interposes
                    .then(|| elf::hidden_hooks(file.file(), &self.table))
                    .flatten();
                let skipped = [
                    ("", facts.skipped.as_ref()),
                    (" symtab", hidden.as_ref().and_then(|h| h.1.as_ref())),
                ];
                for (part, what) in skipped {
                    let Some(what) = what else { continue };
                    self.note(
                        format!("{}:{}{part}", m.dev, m.inode),
                        format!("{} (process {pid}): {what} not read", escape_text(&m.path)),
                    );
                }
                let mut opened = Opened::new(file, facts);
                opened.hidden_hooks = hidden.map(|h| h.0);
                Arc::new(opened)
            }),
            Err(e @ UntrustedError::NotRegular { .. }) => {
                self.note(
                    format!("{}:{}", m.dev, m.inode),
                    escape_text(&e.to_string()).into_owned(),
                );
                None
            }
            Err(_) => None,
        };
        self.cache.insert(key, opened.clone());
        opened
    }

    /// Says once (by `key`) that something was left out, and counts it once.
    fn note(&mut self, key: String, line: String) {
        if self.noted.insert(key) {
            self.skipped += 1;
            crate::say!("gpu-trace: api: {line}");
        }
    }

    /// `LD_PRELOAD` (from /proc/PID/environ), then /etc/ld.so.preload as the process sees it
    /// (inside its root).
    fn read_preload(&mut self, pid: u32) -> Result<Vec<String>, String> {
        let environ = format!("/proc/{pid}/environ");
        let mut entries = match untrusted::read_proc(&environ, Limit::Environ) {
            Ok(environ) => preload_of_environ(&environ),
            Err(e) => return Err(format!("{environ} is not readable: {e}")),
        };
        let read = untrusted::open_in_root(pid, "/etc/ld.so.preload")
            .and_then(|f| f.read_all("/etc/ld.so.preload", Limit::Preload));
        match read {
            Ok(text) => entries.extend(split_preload(&text)),
            Err(e) if e.io_error().is_some() => {} // none (the usual case), or unreadable
            Err(e) => self.note(
                format!("preload {pid}"),
                format!("process {pid}: {}", escape_text(&e.to_string())),
            ),
        }
        Ok(entries)
    }
}

/// [`Reader::read_files`] on a worker thread ([`untrusted::bounded`]), for at most
/// [`untrusted::TARGET_DEADLINE`]: a process that does not answer by then (a file it maps
/// never answers) is [`ReadError::TimedOut`], and its worker keeps the reader (`slot` gets a
/// new one next time). `skip`: runs first on the worker; `true` skips the process (`Ok(None)`).
/// `None`: `stop()` said to stop first.
pub fn read_within_deadline(
    slot: &mut Option<Reader>,
    table: &SymbolTable,
    pid: u32,
    stop: &dyn Fn() -> bool,
    skip: fn(u32) -> bool,
) -> Option<Result<Option<ReadFiles>, ReadError>> {
    let mut reader = slot.take().unwrap_or_else(|| Reader::new(table.clone()));
    let got = untrusted::bounded(untrusted::TARGET_DEADLINE, stop, move || {
        let read = if skip(pid) {
            Ok(None)
        } else {
            reader.read_files(pid).map(Some)
        };
        (reader, read)
    });
    match got {
        Some((reader, read)) => {
            *slot = Some(reader);
            Some(read)
        }
        None if stop() => None,
        None => Some(Err(ReadError::TimedOut(pid))),
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
    mapped: &[(Mapping, Arc<Opened>)],
    exe: Option<&str>,
    preload: &[String],
) -> (Vec<Library>, Vec<String>) {
    let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let is_named = |i: usize, name: &str| {
        let (m, opened) = &mapped[i];
        file_name(&m.path) == name || opened.facts.soname.as_deref() == Some(name)
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
        // The file itself first (its path as mapped): a shim with the real library's file
        // name is the preload, whichever of the two is mapped lower; a name match only when
        // no mapping is that path (a path through a symlink, a bare name).
        let exact = (0..mapped.len()).find(|&i| !taken(&order, i) && mapped[i].0.path == *entry);
        let found = exact.or_else(|| {
            (0..mapped.len()).find(|&i| {
                !taken(&order, i)
                    && ((!entry.contains('/') && is_named(i, entry))
                        || (entry.contains('/') && is_named(i, &file_name(entry))))
            })
        });
        match found {
            Some(i) => order.push((i, Origin::Preload)),
            None => unmapped.push(entry.clone()),
        }
    }
    let mut next = 0;
    while next < order.len() {
        let (i, _) = order[next];
        for needed in &mapped[i].1.facts.needed {
            // ld.so satisfies a name that an object already loaded has as its soname with that
            // object: a preloaded shim whose soname is the real library's stands in for it,
            // and the real one (dlopened by the shim) is not in the global scope. (A shim
            // preloaded by a path with the real file name but no soname does not: the path is
            // the name it was loaded by.)
            let satisfied = order
                .iter()
                .any(|&(j, _)| mapped[j].1.facts.soname.as_deref() == Some(needed.as_str()));
            if satisfied {
                continue;
            }
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
            let (m, opened) = &mapped[i];
            let info = &opened.facts;
            Library {
                path: m.path.clone(),
                soname: info.soname.clone(),
                origin,
                has_dynsym: info.has_dynsym,
                defines: info
                    .defines
                    .iter()
                    .map(|(name, d)| (name.clone(), d.binding))
                    .collect(),
                imports_dlsym: info.imports_dlsym,
                exports_lookups: info.exports_lookups.clone(),
                hidden_hooks: opened.hidden_hooks.clone(),
            }
        })
        .collect();
    (libraries, unmapped)
}

/// The facts of the ELF file at `path` on this machine (`None`: not an ELF object, not a
/// regular file, or unreadable), with the file opened.
pub fn host_file(path: &Path, table: &SymbolTable) -> Option<Opened> {
    let file = untrusted::open_host(path).ok()?;
    let facts = elf::facts(file.file(), table)?;
    Some(Opened::new(file, facts))
}

/// What the dynamic linker reads of an object to find its dependencies: its `DT_NEEDED`
/// names and its `DT_RPATH` / `DT_RUNPATH` (`None`: not an ELF object, or unreadable).
pub fn dependencies_of(path: &Path, table: &SymbolTable) -> Option<super::linker::Dependencies> {
    let facts = host_file(path, table)?.facts;
    Some(super::linker::Dependencies {
        needed: facts.needed,
        rpath: facts.rpath,
        runpath: facts.runpath,
    })
}

/// Whether process `pid` exists (a zombie not reaped yet does): signal 0, no allocation (the
/// followed set asks it of every member at its bound).
pub fn process_exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
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
