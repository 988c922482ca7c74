//! The API layer's uprobes on a loaded object, for `gpu-trace api` (`trace.rs`) and for the
//! main trace's `--api` (`loader`): the programs loaded with their switches, every table
//! symbol of every library mapped in a process attached per process with a cookie (library id
//! << 32 | symbol id, this run's numbering), and the names behind the cookies.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::num::NonZeroU32;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::time::Instant;

use aya::{
    Ebpf,
    maps::Array,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use gpu_trace_common::api::{
    ApiKey, ApiStat, ApiTagRecord, ApiThroughKey, LOOKUP_PROCADDRESS, api_switch,
};
use gpu_trace_common::record_kind;
use gpu_trace_common::zerocopy::FromBytes as _;
use gpu_trace_core::api::events::Site;
use gpu_trace_core::api::open::names;
use gpu_trace_core::api::path::{ApiPath, Handout};
use gpu_trace_core::api::resolve::Origin;
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::{decode_lossless, escape_text};
use gpu_trace_core::user_records::{ApiContextRecord, ApiStatsRecord, ApiSymbolRecord, user_kind};

use super::progress::Progress;
use crate::launch::executable_of;
use crate::probe::libraries::{self, Opened, ReadError, Reader};
use crate::probe::untrusted::TARGET_DEADLINE;

/// Waits until every BPF program running now has ended (they run under RCU): the kernel's
/// `membarrier(MEMBARRIER_CMD_GLOBAL)` is a `synchronize_rcu()`. Where it is refused (CPUs in
/// `nohz_full`), 50 ms, far more than a uprobe program runs.
fn rcu_grace_period() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r != 0 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Detaches `links` (program name, link) from `ebpf`.
fn detach_links(ebpf: &mut Ebpf, links: Vec<(&'static str, UProbeLinkId)>) {
    for (name, id) in links {
        if let Some(Ok(p)) = ebpf.program_mut(name).map(TryInto::<&mut UProbe>::try_into) {
            let _ = p.detach(id);
        }
    }
}

/// The process of an `API_LOADED` record (a change of its link map) and whether the kernel
/// stopped it; `None` for any other record.
pub fn loaded_of(b: &[u8]) -> Option<(u32, bool)> {
    let kind = u32::from_ne_bytes(b.get(..4)?.try_into().ok()?);
    if kind != record_kind::API_LOADED {
        return None;
    }
    let (r, _) = gpu_trace_common::api::ApiLoadedRecord::read_from_prefix(b).ok()?;
    Some((r.hdr.tgid, r.held != 0))
}

/// A record that tells the live run to act, in ring order: a target's link map changed
/// (`API_LOADED`), or a lookup handed out an address (`API_HANDOUT`). Never recorded.
pub enum ApiSignal {
    Loaded(u32, bool),
    Handout(gpu_trace_common::api::ApiHandoutRecord),
}

/// The [`ApiSignal`] of a ring item; `None` for any other record.
pub fn signal_of(b: &[u8]) -> Option<ApiSignal> {
    if let Some((pid, held)) = loaded_of(b) {
        return Some(ApiSignal::Loaded(pid, held));
    }
    let kind = u32::from_ne_bytes(b.get(..4)?.try_into().ok()?);
    if kind != record_kind::API_HANDOUT {
        return None;
    }
    gpu_trace_common::api::ApiHandoutRecord::read_from_prefix(b)
        .ok()
        .map(|(r, _)| ApiSignal::Handout(r))
}

/// Processes whose reading did not end by its deadline, after which no further process is
/// read this run (each leaves a worker thread blocked in the kernel).
const MAX_GIVEN_UP: usize = 8;

/// The uprobe programs on the table's symbols, one perf-event uprobe per symbol.
pub const PROGRAMS: [&str; 2] = ["api_entry", "api_return"];
/// The same programs for batched links (`uprobe.multi`): one link per process, library and
/// direction.
pub const PROGRAMS_MULTI: [&str; 2] = ["api_entry_multi", "api_return_multi"];

/// The lookup programs (`dlsym`, `cuGetProcAddress*`, …: what they hand out), per probe and
/// batched.
pub const PROGRAMS_LOOKUP: [&str; 2] = ["api_lookup", "api_lookup_return"];
pub const PROGRAMS_LOOKUP_MULTI: [&str; 2] = ["api_lookup_multi", "api_lookup_return_multi"];

/// Which programs a point gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probes {
    /// A table symbol, or a hidden hook handed out for one: counted (`API_STATS`).
    Calls,
    /// A lookup of `cuGetProcAddress`'s shape: what it hands out (`API_HANDOUT`).
    Lookups,
    /// A lookup of `dlsym`'s shape: its entry only (the name asked for). glibc's `dlsym` and
    /// `dlvsym` read their return address for `RTLD_NEXT`; a return probe would replace it.
    LookupEntries,
}

impl Probes {
    fn programs(self, batched: bool) -> &'static [&'static str] {
        match (self, batched) {
            (Self::Calls, false) => &PROGRAMS,
            (Self::Calls, true) => &PROGRAMS_MULTI,
            (Self::Lookups, false) => &PROGRAMS_LOOKUP,
            (Self::Lookups, true) => &PROGRAMS_LOOKUP_MULTI,
            (Self::LookupEntries, false) => &PROGRAMS_LOOKUP[..1],
            (Self::LookupEntries, true) => &PROGRAMS_LOOKUP_MULTI[..1],
        }
    }
}

/// The kernel release from which a batched uprobe link's process filter holds for every thread
/// of a multi-threaded target (the links exist from 6.6; before 6.10 their filter could let
/// another process's call through or miss a thread's).
pub const BATCHED_SINCE: crate::probe::kernel::KernelVersion =
    crate::probe::kernel::KernelVersion::new(6, 10);

/// The environment variable that chooses the attach method (`batched`, `per-probe`; unset:
/// batched where the kernel allows it). docs/api.md.
pub const ATTACH_ENV: &str = "GPU_TRACE_UPROBE_ATTACH";

/// How the API layer's probes go on in this run: [`load_programs`] decides, stderr says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachMethod {
    /// One `uprobe_multi` link per (process, library, entry/return): milliseconds to attach
    /// and to remove, whatever the number of symbols.
    Batched,
    /// One perf-event uprobe per (process, symbol, entry/return): each costs a grace period
    /// to remove (seconds for a runtime's 200 symbols). The reason batched links are not used.
    PerProbe(String),
}

impl std::fmt::Display for AttachMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Batched => {
                f.write_str("batched uprobe links (one per process, library and direction)")
            }
            Self::PerProbe(why) => write!(f, "one perf-event uprobe per symbol ({why})"),
        }
    }
}

/// Which method this kernel and the environment allow, before anything is loaded: `None` for
/// batched links (still to be confirmed by loading their programs), else the per-probe
/// method with its reason.
pub fn method_allowed(release: &str, choice: Option<&std::ffi::OsStr>) -> Result<(), AttachMethod> {
    match choice.map(|c| c.to_string_lossy().into_owned()).as_deref() {
        Some("per-probe") => {
            return Err(AttachMethod::PerProbe(format!("{ATTACH_ENV}=per-probe")));
        }
        None | Some("" | "batched" | "auto") => {}
        Some(other) => {
            return Err(AttachMethod::PerProbe(format!(
                "{ATTACH_ENV}={} is neither `batched` nor `per-probe`",
                escape_text(other)
            )));
        }
    }
    match crate::probe::kernel::KernelVersion::parse(release) {
        Some(v) if v.at_least(BATCHED_SINCE) => Ok(()),
        Some(v) => Err(AttachMethod::PerProbe(format!(
            "Linux {v} < {BATCHED_SINCE}: batched links filter by process reliably from \
             {BATCHED_SINCE}"
        ))),
        None => Err(AttachMethod::PerProbe(format!(
            "kernel release {} not understood",
            escape_text(release)
        ))),
    }
}
/// The uprobe on the dynamic linker's `_dl_debug_state` (a change of the link map).
pub const LOADED: &str = "api_loaded";

/// Loads the uprobe programs of `ebpf` and sets their switches: one record per call
/// (`verbose`) and the open calls kept per thread (`max_depth`).
///
/// Returns the attach method: batched links where [`method_allowed`] allows them and the
/// kernel loads their programs, else one perf-event uprobe per symbol with the reason.
pub fn load_programs(
    ebpf: &mut Ebpf,
    verbose: bool,
    max_depth: u32,
) -> Result<AttachMethod, String> {
    let load = |ebpf: &mut Ebpf, name: &str| -> Result<(), String> {
        let p: &mut UProbe = ebpf
            .program_mut(name)
            .ok_or_else(|| format!("no program {name} in the object"))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())?;
        p.load().map_err(|e| chain(&e))
    };
    for name in PROGRAMS.into_iter().chain(PROGRAMS_LOOKUP).chain([LOADED]) {
        load(ebpf, name)?;
    }
    let release = crate::probe::system::kernel_release();
    let method = match method_allowed(&release, std::env::var_os(ATTACH_ENV).as_deref()) {
        Err(per_probe) => per_probe,
        Ok(()) => match PROGRAMS_MULTI
            .into_iter()
            .chain(PROGRAMS_LOOKUP_MULTI)
            .try_for_each(|n| load(ebpf, n))
        {
            Ok(()) => AttachMethod::Batched,
            Err(why) => AttachMethod::PerProbe(format!(
                "the kernel refused the batched programs: {}",
                escape_text(&why)
            )),
        },
    };
    let switches = ebpf
        .map_mut("API_SWITCHES")
        .ok_or_else(|| "no map API_SWITCHES".to_string())?;
    let mut switches: Array<_, u32> = Array::try_from(switches).map_err(|e| e.to_string())?;
    for (i, v) in [
        (api_switch::VERBOSE, u32::from(verbose)),
        (api_switch::MAX_DEPTH, max_depth),
    ] {
        switches.set(i, &v, 0).map_err(|e| e.to_string())?;
    }
    Ok(method)
}

/// An error with its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut why = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        why.push_str(": ");
        why.push_str(&s.to_string());
        source = s.source();
    }
    why
}

/// (pid, device, inode, what: a symbol, or a lookup's or a hook's offset) of one attach.
type AttachKey = (u32, u64, u64, String);

/// What is attached, and the names behind the cookies.
pub struct Attacher {
    /// `None` while a worker that did not answer in time has it (a new one is made).
    reader: Option<Reader>,
    table: SymbolTable,
    /// Whether the run is to stop now: a read or an attach in progress gives up.
    stop: fn() -> bool,
    /// Processes whose reading did not end by its deadline: not read again.
    given_up: HashSet<u32>,
    /// (process, device, inode) of the dynamic linkers whose `_dl_debug_state` is probed.
    watched: HashSet<(u32, u64, u64)>,
    /// Processes in the kernel's `API_HOLD` (stopped at each change of their link map).
    held: HashSet<u32>,
    /// Library id → path (cookie's high half).
    libs: Vec<String>,
    lib_ids: HashMap<String, u32>,
    /// Symbol id → name (cookie's low half).
    syms: Vec<String>,
    sym_ids: HashMap<String, u32>,
    /// (pid, device, inode, symbol) attached.
    attached: HashSet<(u32, u64, u64, String)>,
    /// Attach failures already reported (library path, symbol).
    failed: HashSet<(String, String)>,
    /// Every attach, by program name.
    links: Vec<(&'static str, UProbeLinkId)>,
    /// How the table's probes go on.
    method: AttachMethod,
    /// Probes on (entry and return each count), batched or not.
    probes: usize,
    /// (pid, library id) of the libraries that came through `LD_PRELOAD` in that process.
    preloaded: HashSet<(u32, u32)>,
    /// Cookies attached and not yet named in an `API_SYMBOL` record (`gpu-trace --api`), with
    /// the process they were first attached for.
    unnamed: Vec<(u32, u64)>,
    /// Cookies named so far.
    named: HashSet<u64>,
    /// Interposers, lookups and hand-outs (`API_PATH`).
    interposers: super::interpose::Interposers,
    /// Each process's mapped files as last read (by path): a hand-out's file is attached
    /// through them.
    files: HashMap<u32, HashMap<String, std::sync::Arc<Opened>>>,
    /// Finds the file and function behind a handed-out address.
    symbolizer: super::stuck::Symbolizer,
    /// `API_HANDOUT`s not taken yet ([`Self::take_handouts`]).
    handouts: Vec<Handout>,
    /// The start-up attach's progress on stderr, while it lasts ([`Self::begin_progress`]).
    progress: Option<Progress>,
}

impl Attacher {
    /// `stop`: whether the run is to stop (a read or an attach in progress gives up).
    /// `method`: what [`load_programs`] returned.
    pub fn new(table: SymbolTable, stop: fn() -> bool, method: AttachMethod) -> Self {
        Self {
            reader: Some(Reader::new(table.clone())),
            table,
            stop,
            given_up: HashSet::new(),
            watched: HashSet::new(),
            held: HashSet::new(),
            libs: Vec::new(),
            lib_ids: HashMap::new(),
            syms: Vec::new(),
            sym_ids: HashMap::new(),
            attached: HashSet::new(),
            failed: HashSet::new(),
            links: Vec::new(),
            method,
            probes: 0,
            preloaded: HashSet::new(),
            unnamed: Vec::new(),
            named: HashSet::new(),
            interposers: super::interpose::Interposers::default(),
            files: HashMap::new(),
            symbolizer: super::stuck::Symbolizer::default(),
            handouts: Vec::new(),
            progress: None,
        }
    }

    /// The start-up attach begins: once it runs past a second, a line on stderr each second
    /// says how far it got (not under `-q`), until [`Self::end_progress`]. `who`: the
    /// command's prefix (`api`, `--api`).
    pub fn begin_progress(&mut self, who: &'static str) {
        if !crate::flags::quiet() {
            self.progress = Some(Progress::new(who, Instant::now(), super::progress::after()));
        }
    }

    /// The start-up attach ended: no more progress lines.
    pub fn end_progress(&mut self) {
        self.progress = None;
    }

    /// A progress line on stderr, when one is due.
    fn progress_tick(&mut self) {
        let now = Instant::now();
        if self.progress.as_mut().is_some_and(|p| p.due(now)) {
            let (libraries, probes) = (self.libraries(), self.probes);
            if let Some(p) = self.progress.as_ref() {
                crate::say!("{}", p.line(now, libraries, probes));
            }
        }
    }

    /// Notes that `path` came through `LD_PRELOAD` in `pid` (its output rows are marked).
    pub fn mark_preload(&mut self, pid: u32, path: &str) {
        let lib = Self::intern(&mut self.lib_ids, &mut self.libs, path);
        self.preloaded.insert((pid, lib));
    }

    /// Whether the library of `cookie` came through `LD_PRELOAD` in `pid`.
    pub fn is_preload(&self, pid: u32, cookie: u64) -> bool {
        self.preloaded.contains(&(pid, (cookie >> 32) as u32))
    }

    fn intern(ids: &mut HashMap<String, u32>, names: &mut Vec<String>, name: &str) -> u32 {
        *ids.entry(name.to_string()).or_insert_with(|| {
            names.push(name.to_string());
            names.len() as u32 - 1
        })
    }

    /// Attaches entry and return probes for the table symbols of `opened` (the file `path`
    /// as the target sees it) in `pid`, each at its offset in the file, through this
    /// process's descriptor of it: one batched link per direction for all of them where the
    /// run attaches that way (one perf-event uprobe per symbol where the kernel refuses the
    /// link for this file, said once), else one per symbol. Returns how many symbols are
    /// newly attached.
    pub fn attach_file(&mut self, ebpf: &mut Ebpf, pid: u32, path: &str, opened: &Opened) -> usize {
        let Some(file) = opened.file.as_ref() else {
            return 0;
        };
        let lib = Self::intern(&mut self.lib_ids, &mut self.libs, path);
        let mut new = Vec::new();
        for (sym, defined) in &opened.facts.defines {
            let key = (pid, file.dev, file.ino, sym.clone());
            if self.attached.contains(&key) {
                continue;
            }
            let id = Self::intern(&mut self.sym_ids, &mut self.syms, sym);
            let cookie = (u64::from(lib) << 32) | u64::from(id);
            new.push((key, defined.offset, cookie));
        }
        self.attach_points(ebpf, pid, path, opened, new, Probes::Calls)
    }

    /// The lookup probes (`api_lookup`) on the lookup functions `opened` defines
    /// (`dlsym`, `cuGetProcAddress_v2`, …), in `pid`. Returns how many are newly attached.
    fn attach_lookups(&mut self, ebpf: &mut Ebpf, pid: u32, path: &str, opened: &Opened) -> usize {
        let Some(file) = opened.file.as_ref() else {
            return 0;
        };
        let lib = Self::intern(&mut self.lib_ids, &mut self.libs, path);
        let (mut procaddress, mut dlsym) = (Vec::new(), Vec::new());
        for (name, offset) in &opened.facts.lookups {
            let key = (pid, file.dev, file.ino, format!("\0lookup {offset}"));
            if self.attached.contains(&key) {
                continue;
            }
            let id = Self::intern(&mut self.sym_ids, &mut self.syms, name);
            let shape = crate::probe::elf::LOOKUPS
                .iter()
                .find(|(l, _)| l == name)
                .is_some_and(|(_, procaddress)| *procaddress);
            let cookie = (u64::from(lib) << 32) | u64::from(id);
            if shape {
                procaddress.push((key, *offset, cookie | LOOKUP_PROCADDRESS));
            } else {
                dlsym.push((key, *offset, cookie));
            }
        }
        self.attach_points(ebpf, pid, path, opened, procaddress, Probes::Lookups)
            + self.attach_points(ebpf, pid, path, opened, dlsym, Probes::LookupEntries)
    }

    /// Entry and return probes of `kind` at `new` (key, offset, cookie) of the file `opened`
    /// (`path` as the target sees it) in `pid`, through this process's descriptor of it: one
    /// batched link per direction for all of them where the run attaches that way (one
    /// perf-event uprobe each where the kernel refuses the link for this file, said once),
    /// else one per point. Returns how many points are newly attached.
    fn attach_points(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        path: &str,
        opened: &Opened,
        new: Vec<(AttachKey, u64, u64)>,
        kind: Probes,
    ) -> usize {
        let (Some(file), Some(scope)) = (
            opened.file.as_ref(),
            NonZeroU32::new(pid).map(UProbeScope::OneProcess),
        ) else {
            return 0;
        };
        let target = file.kernel_path();
        if new.is_empty() || (self.stop)() {
            return 0;
        }
        if self.method == AttachMethod::Batched {
            let points: Vec<(u64, u64)> = new.iter().map(|&(_, o, c)| (o, c)).collect();
            match self.attach_batch(ebpf, kind.programs(true), &points, &target, scope) {
                Ok(()) => {
                    let n = new.len();
                    for (key, _, cookie) in new {
                        self.note_attached(key, pid, cookie, kind);
                    }
                    return n;
                }
                Err(_) if !libraries::process_exists(pid) => return 0,
                Err(e) => self.report_failure(path, "its batched link", &e),
            }
        }
        let mut added = 0;
        for (key, offset, cookie) in new {
            if (self.stop)() {
                break;
            }
            match self.attach_symbol(ebpf, kind.programs(false), offset, cookie, &target, scope) {
                Ok(()) => {
                    self.note_attached(key, pid, cookie, kind);
                    added += 1;
                }
                // The process ended (or exec'd) while it was being attached: a short-lived
                // child (a fork about to exec a tool) is no failure to report.
                Err(_) if !libraries::process_exists(pid) => break,
                Err(e) => {
                    let what = self.syms[(cookie as u32) as usize].clone();
                    self.report_failure(path, &what, &e);
                }
            }
        }
        added
    }

    fn note_attached(&mut self, key: AttachKey, pid: u32, cookie: u64, kind: Probes) {
        self.attached.insert(key);
        self.probes += kind.programs(false).len();
        if kind == Probes::Calls && self.named.insert(cookie) {
            self.unnamed.push((pid, cookie));
        }
        self.progress_tick();
    }

    /// Says once per (library, symbol) why a probe could not go on.
    fn report_failure(&mut self, path: &str, sym: &str, e: &aya::programs::ProgramError) {
        if !self.failed.insert((path.to_string(), sym.to_string())) {
            return;
        }
        crate::say!(
            "gpu-trace: cannot probe {} in {}: {}",
            escape_text(sym),
            escape_text(path),
            escape_text(&chain(e))
        );
    }

    /// Both batched programs at `points` (offset, cookie) of the file `target` for one
    /// process, the return link first (as in [`Self::attach_symbol`]); neither stays when the
    /// kernel refuses one.
    fn attach_batch(
        &mut self,
        ebpf: &mut Ebpf,
        programs: &'static [&'static str],
        points: &[(u64, u64)],
        target: &str,
        scope: UProbeScope,
    ) -> Result<(), aya::programs::ProgramError> {
        let mut made = Vec::new();
        for &name in programs.iter().rev() {
            let Some(Ok(p)) = ebpf.program_mut(name).map(TryInto::<&mut UProbe>::try_into) else {
                continue;
            };
            let at = points.iter().map(|&(offset, cookie)| UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(cookie),
            });
            match p.attach(at, target, scope) {
                Ok(id) => made.push((name, id)),
                Err(e) => {
                    detach_links(ebpf, made);
                    return Err(e);
                }
            }
        }
        self.links.extend(made);
        Ok(())
    }

    /// Both programs at `offset` of the file `target` (a path to this process's descriptor),
    /// for one process: the return probe first, so that a call made while the two go on is
    /// either not seen (entered before the entry probe) or seen whole, never entered without
    /// its return (a frame left open until the thread's next call).
    fn attach_symbol(
        &mut self,
        ebpf: &mut Ebpf,
        programs: &'static [&'static str],
        offset: u64,
        cookie: u64,
        target: &str,
        scope: UProbeScope,
    ) -> Result<(), aya::programs::ProgramError> {
        for &name in programs.iter().rev() {
            let p: &mut UProbe = match ebpf.program_mut(name).map(TryInto::try_into) {
                Some(Ok(p)) => p,
                _ => continue,
            };
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: Some(cookie),
            };
            self.links.push((name, p.attach([point], target, scope)?));
        }
        Ok(())
    }

    /// A command forked and held before its exec (`pid`): the probes go on by path for the
    /// libraries it will load at start ([`launch_candidates`]), bound to its PID, so that its
    /// first calls are seen; its `LD_PRELOAD` files (inherited from this process) are marked.
    /// Returns how many symbols were attached.
    pub fn attach_launch(&mut self, ebpf: &mut Ebpf, pid: u32, cmd: &OsString) -> usize {
        let mut added = 0;
        for (path, opened) in launch_candidates(&self.table, cmd) {
            added += self.attach_file(ebpf, pid, &path, &opened);
        }
        // Its dynamic linker, by path: each library it loads later is attached before the
        // command goes on (`hold`).
        let interp = executable_of(cmd)
            .and_then(|exe| program_interpreter(&exe, &self.table))
            .and_then(|i| libraries::host_file(std::path::Path::new(&i), &self.table));
        if let Some(interp) = interp {
            self.watch_loads(ebpf, pid, &interp);
        }
        self.hold(ebpf, pid);
        let preload = std::env::var_os("LD_PRELOAD").unwrap_or_default();
        for path in libraries::split_preload(preload.as_bytes()) {
            self.mark_preload(pid, &path);
        }
        added
    }

    /// Attaches every table symbol of every library mapped in `pid` not attached yet. Returns
    /// whether the process could be read, and how many libraries define table symbols.
    ///
    /// The process is read on a worker thread (`probe::untrusted::bounded`): one that does not end
    /// within [`TARGET_DEADLINE`] (a file it maps that never answers) is said once and not
    /// read again; a stop gives up at once.
    pub fn scan(&mut self, ebpf: &mut Ebpf, pid: u32) -> Option<usize> {
        if self.given_up.contains(&pid) || self.given_up.len() >= MAX_GIVEN_UP {
            return None;
        }
        // `-- CMD` before its exec: a copy of gpu-trace, whose libraries (NVML's libcuda) are
        // not the command's; its own are attached by path (`attach_launch`).
        let read = libraries::read_within_deadline(
            &mut self.reader,
            &self.table,
            pid,
            &self.stop,
            runs_this_program,
        )?;
        let (report, files) = match read {
            Ok(Some(read)) => read,
            Ok(None) => return Some(0),
            Err(ReadError::TimedOut(_)) => {
                self.give_up(pid);
                return None;
            }
            Err(_) => return None,
        };
        let mut seen = Vec::new();
        for (path, opened) in &files {
            self.watch_loads(ebpf, pid, opened);
            self.attach_lookups(ebpf, pid, path, opened);
        }
        for lib in &report.libraries {
            let id = Self::intern(&mut self.lib_ids, &mut self.libs, &lib.path);
            let lookups = files.get(&lib.path).map_or_else(Vec::new, |o| {
                o.facts.lookups.iter().map(|(n, _)| n.clone()).collect()
            });
            seen.push((id, lib, lookups));
        }
        self.interposers
            .note_process(&self.table, pid, &report.comm, &seen);
        self.set_ranges(ebpf, pid);
        let mut with_symbols = 0;
        for lib in &report.libraries {
            // Every preload, also one that exports no table symbol (a HAMi-shaped shim exports
            // only `dlsym`): its `API_PATH` says `LD_PRELOAD`.
            if lib.origin == Origin::Preload {
                self.mark_preload(pid, &lib.path);
            }
            if lib.defines.is_empty() {
                continue;
            }
            with_symbols += 1;
            if let Some(opened) = files.get(&lib.path) {
                self.attach_file(ebpf, pid, &lib.path, opened);
            }
        }
        self.files.insert(pid, files);
        Some(with_symbols)
    }

    /// The `api_loaded` uprobe on `_dl_debug_state` of `opened` (a dynamic linker) in `pid`,
    /// once per (process, file).
    fn watch_loads(&mut self, ebpf: &mut Ebpf, pid: u32, opened: &Opened) {
        let (Some(offset), Some(file)) = (opened.facts.dl_debug_state, opened.file.as_ref()) else {
            return;
        };
        if !self.watched.insert((pid, file.dev, file.ino)) {
            return;
        }
        let Some(scope) = NonZeroU32::new(pid).map(UProbeScope::OneProcess) else {
            return;
        };
        let p: &mut UProbe = match ebpf.program_mut(LOADED).map(TryInto::try_into) {
            Some(Ok(p)) => p,
            _ => return,
        };
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: None,
        };
        match p.attach([point], file.kernel_path(), scope) {
            Ok(id) => self.links.push((LOADED, id)),
            Err(e) => self.report_failure("the dynamic linker", "_dl_debug_state", &e),
        }
    }

    /// Puts `pid` (a process gpu-trace started) in the kernel's `API_HOLD`: it is stopped at
    /// each change of its link map until [`Self::loaded`] continues it.
    pub fn hold(&mut self, ebpf: &mut Ebpf, pid: u32) {
        if self.held.contains(&pid) {
            return;
        }
        let Some(map) = ebpf.map_mut("API_HOLD") else {
            return;
        };
        if let Ok(mut map) = aya::maps::HashMap::<_, u32, u32>::try_from(map)
            && map.insert(&pid, &1, 0).is_ok()
        {
            self.held.insert(pid);
        }
    }

    /// A target's link map changed (`API_LOADED`, `held`: the kernel stopped it): read it
    /// and attach what it loaded now, then let it go on. Returns the symbols attached.
    pub fn loaded(&mut self, ebpf: &mut Ebpf, pid: u32, held: bool) -> usize {
        let before = self.attached.len();
        let _ = self.scan(ebpf, pid);
        if held {
            // SAFETY: a signal to a process this run started and the kernel stopped.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        self.attached.len() - before
    }

    /// Lets every held process go on for good (the end of the run: one stopped by a change
    /// of its link map that was not read any more must not stay stopped, nor one stopped
    /// later). First out of the kernel's `API_HOLD` (the probes stay on until they are
    /// removed in the background: a later change of the link map must stop no one), then a
    /// grace period, so that a program that found the process held just before has sent its
    /// stop, then SIGCONT.
    pub fn release_held(&mut self, ebpf: &mut Ebpf) {
        if self.held.is_empty() {
            return;
        }
        if let Some(Ok(mut map)) = ebpf
            .map_mut("API_HOLD")
            .map(aya::maps::HashMap::<_, u32, u32>::try_from)
        {
            for pid in &self.held {
                let _ = map.remove(pid);
            }
        }
        rcu_grace_period();
        for pid in self.held.drain() {
            // SAFETY: a process this run started.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }

    /// A lookup returned (`API_HANDOUT`): counted for its library; a table symbol handed out
    /// for the first time is located (file, offset, function name) and, when it is not its real
    /// provider's code, probed there like a table symbol (a hidden hook: its calls count under
    /// that library and the symbol asked for). Each new hand-out of a table symbol is kept for
    /// [`Self::take_handouts`].
    pub fn handout(&mut self, ebpf: &mut Ebpf, r: &gpu_trace_common::api::ApiHandoutRecord) {
        let pid = r.hdr.tgid;
        let cookie = r.cookie & !LOOKUP_PROCADDRESS;
        let lookup_lib = (cookie >> 32) as u32;
        let end = r.name.iter().position(|&b| b == 0).unwrap_or(r.name.len());
        let name = decode_lossless(&r.name[..end]);
        let api = self.table.entry_for(&name).is_some();
        self.interposers.note_lookup(pid, lookup_lib, api);
        if !api || r.addr == 0 || !self.interposers.first_handout(pid, &name, r.addr) {
            return;
        }
        let located = self.symbolizer.locate(pid, r.addr);
        let mut h = Handout {
            pid,
            comm: decode_lossless(r.hdr.comm.split(|&b| b == 0).next().unwrap_or(&[])),
            symbol: name.clone(),
            lookup: self
                .syms
                .get((cookie as u32) as usize)
                .cloned()
                .unwrap_or_default(),
            lookup_library: self
                .libs
                .get(lookup_lib as usize)
                .cloned()
                .unwrap_or_default(),
            library: None,
            offset: 0,
            address: r.addr,
            function: None,
            hidden: false,
        };
        if let Some((path, offset, function)) = located {
            h.library = Some(path.clone());
            h.offset = offset;
            h.function = function;
            let lib = Self::intern(&mut self.lib_ids, &mut self.libs, &path);
            let opened = self.files.get(&pid).and_then(|f| f.get(&path)).cloned();
            let export = opened
                .as_ref()
                .and_then(|o| o.facts.defines.get(&name))
                .is_some_and(|d| d.offset == offset);
            let real = self.interposers.is_real(pid, &name, lib)
                || self.table.entry_for(&name).is_some_and(|(_, e)| {
                    super::interpose::provides(
                        &e.library,
                        &path,
                        opened.as_ref().and_then(|o| o.facts.soname.as_deref()),
                    )
                });
            if !export && !real {
                h.hidden = true;
                self.interposers.note_hook(pid, lib, &name);
                if let (Some(opened), Some(file)) = (
                    opened.as_ref(),
                    opened.as_ref().and_then(|o| o.file.as_ref()),
                ) {
                    let key = (pid, file.dev, file.ino, format!("\0hook {offset} {name}"));
                    if !self.attached.contains(&key) {
                        let id = Self::intern(&mut self.sym_ids, &mut self.syms, &name);
                        let cookie = (u64::from(lib) << 32) | u64::from(id);
                        let new = vec![(key, offset, cookie)];
                        self.attach_points(ebpf, pid, &path, opened, new, Probes::Calls);
                    }
                    // A hidden lookup (HAMi-core's `cuGetProcAddress` hook): what it hands
                    // out is watched too.
                    if let Some((_, procaddress)) =
                        crate::probe::elf::LOOKUPS.iter().find(|(l, _)| *l == name)
                    {
                        let key = (pid, file.dev, file.ino, format!("\0lookup {offset}"));
                        if !self.attached.contains(&key) {
                            let id = Self::intern(&mut self.sym_ids, &mut self.syms, &name);
                            let cookie = (u64::from(lib) << 32) | u64::from(id);
                            let (cookie, kind) = if *procaddress {
                                (cookie | LOOKUP_PROCADDRESS, Probes::Lookups)
                            } else {
                                (cookie, Probes::LookupEntries)
                            };
                            let new = vec![(key, offset, cookie)];
                            self.attach_points(ebpf, pid, &path, opened, new, kind);
                        }
                    }
                }
            }
        }
        self.handouts.push(h);
    }

    /// Acts on a [`signal_of`] record (attach what was loaded or handed out, then continue
    /// the process when the kernel stopped it).
    pub fn signal(&mut self, ebpf: &mut Ebpf, signal: &ApiSignal) {
        match signal {
            ApiSignal::Loaded(pid, held) => {
                self.loaded(ebpf, *pid, *held);
            }
            ApiSignal::Handout(r) => {
                self.handout(ebpf, r);
                if r.held != 0 {
                    // SAFETY: a signal to a process this run started and the kernel stopped.
                    unsafe { libc::kill(r.hdr.tgid as i32, libc::SIGCONT) };
                }
            }
        }
    }

    /// The kernel's `API_RANGES` of `pid`: the code of its interposers (at most
    /// `API_RANGES_MAX` mappings; more are said once), so that a call entered from inside one
    /// counts as going through it (`API_THROUGH`), its hook exported, handed out or neither.
    fn set_ranges(&mut self, ebpf: &mut Ebpf, pid: u32) {
        use gpu_trace_common::api::{API_RANGES_MAX, ApiRange, ApiRanges};
        let libs = self.interposers.libs_of(pid);
        if libs.is_empty() {
            return;
        }
        let mut ranges = ApiRanges::default();
        let mut n = 0;
        for m in super::stuck::exec_maps(pid) {
            let Some(lib) = self.lib_ids.get(&m.path).filter(|l| libs.contains(l)) else {
                continue;
            };
            if n == API_RANGES_MAX {
                if self.failed.insert((m.path.clone(), "\0ranges".into())) {
                    crate::say!(
                        "gpu-trace: api: process {pid}: more than {API_RANGES_MAX} code \
                         mappings of interposers; calls from {} are not attributed to it",
                        escape_text(&m.path)
                    );
                }
                continue;
            }
            ranges.ranges[n] = ApiRange {
                start: m.start,
                end: m.end,
                lib: u64::from(*lib),
            };
            n += 1;
        }
        const LEN: usize = size_of::<ApiRanges>();
        let mut bytes = [0u8; LEN];
        bytes.copy_from_slice(gpu_trace_common::zerocopy::IntoBytes::as_bytes(&ranges));
        if let Some(map) = ebpf.map_mut("API_RANGES")
            && let Ok(mut map) = aya::maps::HashMap::<_, u32, [u8; LEN]>::try_from(map)
        {
            let _ = map.insert(&pid, &bytes, 0);
        }
    }

    /// The hand-outs of table symbols seen since the last call.
    pub fn take_handouts(&mut self) -> Vec<Handout> {
        std::mem::take(&mut self.handouts)
    }

    /// One `API_PATH` per (process, interposer) from the kernel's sums ([`super::sums::Sums::read`]).
    /// `through`: `API_THROUGH`'s calls entered from an interposer's code (the same read).
    pub fn paths(
        &self,
        sums: &[(ApiKey, ApiStat)],
        through: &[(ApiThroughKey, u64)],
        last: bool,
    ) -> Vec<ApiPath> {
        let name = |cookie: u64| self.syms.get((cookie as u32) as usize);
        let mut calls: HashMap<(u32, u32, String), u64> = HashMap::new();
        for (key, stat) in sums {
            if let Some(name) = name(key.cookie) {
                let lib = (key.cookie >> 32) as u32;
                *calls.entry((key.tgid, lib, name.clone())).or_default() += stat.count;
            }
        }
        // A call entered from an interposer's code went through it, whether or not its own
        // copy (an export, a probed hand-out) was seen: the larger of the two counts.
        let mut entered: HashMap<(u32, u32, String), u64> = HashMap::new();
        for (key, n) in through {
            if let Some(name) = name(key.cookie) {
                *entered
                    .entry((key.tgid, key.lib, name.clone()))
                    .or_default() += n;
            }
        }
        self.interposers.paths(
            &self.table,
            &calls,
            &entered,
            |lib| self.libs.get(lib as usize).cloned().unwrap_or_default(),
            |pid, lib| self.preloaded.contains(&(pid, lib)),
            last,
        )
    }

    /// A process whose reading did not end by its deadline: said once, never read again.
    fn give_up(&mut self, pid: u32) {
        self.given_up.insert(pid);
        crate::say!(
            "gpu-trace: api: {}: its calls are not traced",
            ReadError::TimedOut(pid)
        );
        if self.given_up.len() == MAX_GIVEN_UP {
            crate::say!(
                "gpu-trace: api: {MAX_GIVEN_UP} processes did not answer within {} s: no \
                 further process is read this run (docs/reliability.md)",
                TARGET_DEADLINE.as_secs()
            );
        }
    }

    /// [`Self::scan`] of each of `pids` (the main trace's targets, or a launched child):
    /// how many of them map a library that defines table symbols.
    /// During the start-up attach each process read counts in its progress.
    pub fn attach_pids(&mut self, ebpf: &mut Ebpf, pids: impl IntoIterator<Item = u32>) -> usize {
        let pids: Vec<u32> = pids.into_iter().collect();
        if let Some(p) = self.progress.as_mut() {
            p.targets(pids.len());
        }
        let mut with = 0;
        for pid in pids {
            with += usize::from(self.scan(ebpf, pid).is_some_and(|n| n > 0));
            if let Some(p) = self.progress.as_mut() {
                p.read_one();
            }
            self.progress_tick();
        }
        with
    }

    /// Detaches everything now.
    pub fn detach(&mut self, ebpf: &mut Ebpf) {
        detach_links(ebpf, std::mem::take(&mut self.links));
    }

    /// How the probes go on in this run.
    pub fn method(&self) -> &AttachMethod {
        &self.method
    }

    /// How many times something a process controls was left out (past a read limit, or not a
    /// regular file) or a process did not answer in time.
    pub fn skipped(&self) -> u64 {
        self.reader.as_ref().map_or(0, Reader::skipped) + self.given_up.len() as u64
    }

    /// The end of a run: the count of [`Self::skipped`] on stderr when there was any (each
    /// case was said once as it happened).
    pub fn report_skipped(&self) {
        let n = self.skipped();
        if n > 0 {
            crate::say!(
                "gpu-trace: api: {n} file(s) or process(es) a target controls were left out \
                 (past a read limit, not a regular file, or not answering in time): see the \
                 lines above and docs/reliability.md, section 13"
            );
        }
    }

    /// Probes attached (entry and return each count), batched or not.
    pub fn probes(&self) -> usize {
        self.probes
    }

    /// Library files with probes on (any process).
    pub fn libraries(&self) -> usize {
        self.attached
            .iter()
            .map(|(_, dev, ino, _)| (dev, ino))
            .collect::<HashSet<_>>()
            .len()
    }

    /// Links made (a batched link holds many probes; `api_loaded`'s count too).
    pub fn links(&self) -> usize {
        self.links.len()
    }

    /// The library and symbol behind a cookie (`#N` for an id this run never gave).
    pub fn site(&self, cookie: u64) -> Site {
        let name = |names: &[String], i: u64| {
            names
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| format!("#{i}"))
        };
        Site {
            library: name(&self.libs, cookie >> 32),
            symbol: name(&self.syms, cookie & 0xffff_ffff),
        }
    }

    /// The `API_SYMBOL` records of the cookies attached since the last call: the main trace
    /// puts them in the pipeline and the recording before the ring's records, which may carry
    /// those cookies only after the attach. `now_ns`: CLOCK_MONOTONIC.
    pub fn take_symbol_records(&mut self, now_ns: u64) -> Vec<ApiSymbolRecord> {
        std::mem::take(&mut self.unnamed)
            .into_iter()
            .map(|(pid, cookie)| {
                let s = self.site(cookie);
                ApiSymbolRecord {
                    hdr: gpu_trace_common::RecordHeader {
                        kind: user_kind::API_SYMBOL,
                        cpu: 0,
                        ts_ns: now_ns,
                        tgid: pid,
                        tid: pid,
                        comm: [0; 16],
                    },
                    cookie,
                    names: names(&s.symbol, &s.library),
                }
            })
            .collect()
    }

    /// The `API_CONTEXT` record of a kernel `API_TAG`: its cookies as names, its header (kind
    /// aside), so that the driver record it precedes and a replay find them.
    pub fn context(&self, tag: &ApiTagRecord) -> ApiContextRecord {
        let named = |cookie| {
            let s = self.site(cookie);
            names(&s.symbol, &s.library)
        };
        ApiContextRecord {
            hdr: gpu_trace_common::RecordHeader {
                kind: user_kind::API_CONTEXT,
                ..tag.hdr
            },
            depth: tag.depth,
            has_outer: u32::from(tag.depth > 1),
            inner: named(tag.inner),
            outer: if tag.depth > 1 {
                named(tag.outer)
            } else {
                names("", "")
            },
        }
    }
}

/// Why `--api` could not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceApiError {
    #[error(
        "--api: loading the uprobe programs: {0} (the kernel needs uprobes \
         (CONFIG_UPROBE_EVENTS) and BPF attach cookies (5.15 or later))"
    )]
    Load(String),
    #[error(
        "--api needs --pid, --comm or `-- CMD`: which processes' API calls to trace (e.g. \
         gpu-trace --api -- python3 train.py)"
    )]
    NoTarget,
}

/// The running processes `--pid`/`--comm` name (the main trace's targets), this one aside.
pub fn targets(pids: &[u32], comms: &[String]) -> Vec<u32> {
    let mut out: Vec<u32> = pids.to_vec();
    if !comms.is_empty() {
        let own = std::process::id();
        let names: Vec<&str> = comms.iter().map(|c| crate::cli::kernel_comm(c)).collect();
        out.extend(
            crate::probe::libraries::all_pids()
                .into_iter()
                .filter(|&p| {
                    p != own
                        && crate::probe::libraries::comm_of(p)
                            .is_some_and(|c| names.iter().any(|n| n.as_bytes() == c.as_slice()))
                }),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Process `pid`'s name as a record header carries it (cut to 15 bytes), while it runs.
fn comm_of(pid: u32) -> Option<[u8; 16]> {
    let name = crate::probe::libraries::comm_of(pid)?;
    let mut c = [0u8; 16];
    let n = name.len().min(15);
    c[..n].copy_from_slice(&name[..n]);
    Some(c)
}

/// `gpu-trace --api`: the attached probes and which processes they are for.
pub struct TraceApi {
    pub attacher: Attacher,
    /// The kernel's sums as read (one owner: ended processes' entries moved out, calls not
    /// counted).
    pub sums: super::sums::Sums,
    pids: Vec<u32>,
    comms: Vec<String>,
    /// What was last sent per (process, cookie) — calls, timed calls, errors: the keys of the
    /// kernel map's last read, so bounded by its size. A call is counted at its entry and
    /// timed (and its error counted) at its return, maybe reads later: a return alone is a
    /// change too.
    sent: HashMap<(u32, u64), (u64, u64, u64)>,
    /// The name of each target (read from /proc at each rescan while it runs) and of each
    /// process of the last read: the records carry it, so that `--comm` still selects the sums
    /// of a process read after it exited. Bounded by the targets and the kernel map.
    names: HashMap<u32, [u8; 16]>,
    /// The targets of the last rescan.
    targets: HashSet<u32>,
    /// The (process, cookie) sums that changed at the last read: sent once more at the next
    /// read if they did not change (a rate over the reads then falls to 0).
    grew: HashSet<(u32, u64)>,
    /// `API_STUCK`'s finder.
    stuck: super::stuck::StuckFinder,
}

impl TraceApi {
    /// How the probes go on in this run.
    pub fn method(&self) -> &AttachMethod {
        self.attacher.method()
    }

    /// The calls of the targets (as of the last rescan) open `after_ns` or longer and not
    /// reported yet (`--stuck-after`).
    pub fn stuck(
        &mut self,
        ebpf: &aya::Ebpf,
        after_ns: u64,
    ) -> Vec<gpu_trace_core::api::events::StuckEvent> {
        let (targets, at) = (&self.targets, &self.attacher);
        (self.stuck).find(ebpf, |p| targets.contains(&p), after_ns, |c| at.site(c))
    }

    /// Attaches to the targets running now what is not attached yet: a process that took a
    /// `--comm` name since, a library mapped since (`dlopen`), and the processes of `followed`
    /// (`-- CMD`'s command and the processes it created). Returns how many targets there are
    /// and how many of them map a GPU API library.
    pub fn rescan(
        &mut self,
        tracer: &mut crate::loader::Tracer,
        followed: impl IntoIterator<Item = u32>,
    ) -> (usize, usize) {
        let mut targets = targets(&self.pids, &self.comms);
        // The processes `-- CMD` created are this run's too: held at each change of their
        // link map, like the command.
        for pid in followed {
            self.attacher.hold(tracer.ebpf_mut(), pid);
            targets.push(pid);
        }
        targets.sort_unstable();
        targets.dedup();
        let with = self
            .attacher
            .attach_pids(tracer.ebpf_mut(), targets.iter().copied());
        for &pid in &targets {
            if let Some(name) = comm_of(pid) {
                self.names.insert(pid, name);
            }
        }
        self.targets = targets.iter().copied().collect();
        (targets.len(), with)
    }

    /// The `API_STATS` records of the kernel's sums `sums` ([`super::sums::Sums::read`]) whose
    /// calls, timed calls or errors changed since the last call (a call open across a read is
    /// sent again when it returns), and once more those that changed at the last call and not since
    /// (their growth over this read is 0: `top`'s rate falls to 0 when calls stop); a process
    /// that exited keeps its last record. `now_ns`: CLOCK_MONOTONIC, the records' time.
    pub fn stats_records(
        &mut self,
        sums: Vec<(ApiKey, ApiStat)>,
        now_ns: u64,
    ) -> Vec<ApiStatsRecord> {
        let mut sent = HashMap::with_capacity(sums.len());
        let mut grew = HashSet::new();
        let mut out = Vec::new();
        for (key, stat) in sums {
            let k = (key.tgid, key.cookie);
            let comm = *self
                .names
                .entry(key.tgid)
                .or_insert_with(|| comm_of(key.tgid).unwrap_or([0; 16]));
            let now = (stat.count, stat.timed, stat.errors);
            let changed = self.sent.get(&k) != Some(&now);
            if changed {
                grew.insert(k);
            }
            if changed || self.grew.contains(&k) {
                out.push(ApiStatsRecord {
                    hdr: gpu_trace_common::RecordHeader {
                        kind: user_kind::API_STATS,
                        cpu: 0,
                        ts_ns: now_ns,
                        tgid: key.tgid,
                        tid: key.tgid,
                        comm,
                    },
                    cookie: key.cookie,
                    count: stat.count,
                    errors: stat.errors,
                    total_ns: stat.total_ns,
                    hist: stat.hist,
                });
            }
            sent.insert(k, now);
        }
        self.sent = sent;
        self.grew = grew;
        // The names of the processes read now, and of the targets attached now.
        let read: HashSet<u32> = self.sent.keys().map(|&(pid, _)| pid).collect();
        let targets = &self.targets;
        self.names
            .retain(|pid, _| read.contains(pid) || targets.contains(pid));
        out
    }
}

/// `gpu-trace --api`: the uprobes loaded into the main trace's object and attached to the
/// processes `pids`/`comms` name (again at each [`TraceApi::rescan`]); says on stderr how many
/// map a GPU API library. `calls` (`--api-calls`): an `API_CALL` record per completed call;
/// `sums` (`--api-sums`): the size the kernel's sums were loaded with.
///
/// `command`: `-- CMD`'s process, forked and held before its exec, and the command line: the
/// libraries it loads at start get their probes by path now ([`Attacher::attach_launch`]),
/// so that its first calls are seen; what it loads later is attached when it loads it.
/// `stop`: whether the run is to stop (reads and attaches in progress give up).
pub fn for_trace(
    tracer: &mut crate::loader::Tracer,
    pids: &[u32],
    comms: &[String],
    command: Option<(u32, &OsString)>,
    stop: fn() -> bool,
    calls: bool,
    sums: u32,
) -> Result<TraceApi, TraceApiError> {
    if pids.is_empty() && comms.is_empty() && command.is_none() {
        return Err(TraceApiError::NoTarget);
    }
    // Every open call kept (depth cap API_STACK_MAX): the driver programs tag from them.
    let depth = gpu_trace_common::api::API_STACK_MAX as u32;
    let method = load_programs(tracer.ebpf_mut(), calls, depth).map_err(TraceApiError::Load)?;
    let start = std::time::Instant::now();
    let mut api = TraceApi {
        attacher: Attacher::new(SymbolTable::builtin(), stop, method),
        sums: super::sums::Sums::new(sums),
        pids: pids.to_vec(),
        comms: comms.to_vec(),
        sent: HashMap::new(),
        names: HashMap::new(),
        targets: HashSet::new(),
        grew: HashSet::new(),
        stuck: Default::default(),
    };
    api.attacher.begin_progress("--api");
    let before_exec = command.map_or(0, |(pid, cmd)| {
        api.attacher.attach_launch(tracer.ebpf_mut(), pid, cmd)
    });
    let (targets, with) = api.rescan(tracer, command.map(|(pid, _)| pid));
    api.attacher.end_progress();
    let launch = if before_exec > 0 {
        format!(" ({before_exec} symbols of the command's start-up libraries before its exec)")
    } else {
        String::new()
    };
    let libraries = api.attacher.libraries();
    // A start-up report line: not with -q (warnings only).
    if !crate::flags::quiet() {
        crate::say!(
            "gpu-trace: --api: {with} of {targets} target process(es) map a GPU API library; \
             {} uprobes attached in {libraries} librar{} in {} ms{launch}: {}",
            api.attacher.probes(),
            if libraries == 1 { "y" } else { "ies" },
            start.elapsed().as_millis(),
            api.attacher.method()
        );
    }
    Ok(api)
}

/// The libraries a command started now loads at start that define table symbols, before it
/// runs: `LD_PRELOAD`'s files, and the table's libraries in the `DT_NEEDED` closure of the
/// command's executable, found as its dynamic linker finds them (`probe::linker`: RPATH with
/// `$ORIGIN`, `LD_LIBRARY_PATH`, RUNPATH, the cache). Libraries it `dlopen`s later (Python's
/// CUDA runtime) are attached at the next rescan: a cached runtime the command never loads gets no probes
/// (each costs its removal later, docs/api.md).
pub fn launch_candidates(table: &SymbolTable, cmd: &OsString) -> Vec<(String, Opened)> {
    let mut paths: Vec<String> = libraries::split_preload(
        std::env::var_os("LD_PRELOAD")
            .unwrap_or_default()
            .as_bytes(),
    )
    .into_iter()
    .filter(|p| p.starts_with('/'))
    .collect();
    if let Some(exe) = executable_of(cmd) {
        let read = |p: &std::path::Path| libraries::dependencies_of(p, table);
        for (name, path) in crate::probe::linker::Linker::from_env().closure(&exe, read) {
            if table
                .entries()
                .iter()
                .any(|e| gpu_trace_core::api::symbols::library_matches(&e.library, &name))
            {
                paths.push(path.to_string_lossy().into_owned());
            }
        }
    }
    paths
        .into_iter()
        .filter_map(|p| {
            let real = std::fs::canonicalize(&p).ok()?;
            let opened = libraries::host_file(&real, table)?;
            let real = decode_lossless(real.as_os_str().as_bytes());
            (!opened.facts.defines.is_empty()).then_some((real, opened))
        })
        .collect()
}

/// Whether process `pid` runs this very executable (a command forked by gpu-trace and not
/// yet exec'd).
/// The dynamic linker that will run `exe`: its `PT_INTERP`, or, for a script (`#!`), its
/// interpreter's, followed through up to four scripts (a wrapper such as pyenv's `python3`
/// shim: `#!/usr/bin/env bash`, which execs the real `python3`; the linker is the same file
/// for all three, and its probe, bound to the process, stays through each exec).
fn program_interpreter(exe: &std::path::Path, table: &SymbolTable) -> Option<String> {
    let mut exe = exe.to_path_buf();
    for _ in 0..4 {
        match crate::launch::shebang(&exe) {
            Some(next) => exe = next,
            None => return libraries::host_file(&exe, table)?.facts.interp,
        }
    }
    None
}

fn runs_this_program(pid: u32) -> bool {
    let id = |path: String| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let own = id("/proc/self/exe".into());
    own.is_some() && id(format!("/proc/{pid}/exe")) == own
}

#[cfg(test)]
mod tests {
    use super::{AttachMethod, method_allowed};
    use std::ffi::OsStr;

    /// A call counted at its entry and open across three reads of the sums, then returned: the
    /// read after its return sends it again, timed (before, only a change of the count was
    /// sent, and the last record, untimed, stood for the run: found on the GPU host with a 6 s
    /// cudaDeviceSynchronize). An error counted at the return is a change too; a read with
    /// nothing new sends nothing (the once-more rule aside).
    #[test]
    fn a_call_timed_reads_after_its_entry_is_sent_again() {
        use gpu_trace_common::api::{API_HIST_BUCKETS, ApiKey, ApiStat};
        let mut api = super::TraceApi {
            attacher: super::Attacher::new(
                super::SymbolTable::builtin(),
                || false,
                AttachMethod::Batched,
            ),
            sums: crate::api::sums::Sums::new(16),
            pids: Vec::new(),
            comms: Vec::new(),
            sent: Default::default(),
            names: Default::default(),
            targets: Default::default(),
            grew: Default::default(),
            stuck: Default::default(),
        };
        let key = ApiKey {
            tgid: 4242,
            _pad: 0,
            cookie: 7,
        };
        let stat = |timed: u64, errors: u64| ApiStat {
            count: 1,
            timed,
            errors,
            total_ns: timed * 6_000_000_000,
            hist: [0; API_HIST_BUCKETS],
        };
        let mut read = |s: ApiStat| {
            (api.stats_records(vec![(key, s)], 1))
                .iter()
                .map(|r| (r.count, r.errors, r.total_ns))
                .collect::<Vec<_>>()
        };
        assert_eq!(read(stat(0, 0)), [(1, 0, 0)], "the entry: counted");
        assert_eq!(read(stat(0, 0)), [(1, 0, 0)], "once more (its growth is 0)");
        assert_eq!(read(stat(0, 0)), [], "open, nothing new");
        assert_eq!(read(stat(1, 1)), [(1, 1, 6_000_000_000)], "returned: timed");
        assert_eq!(read(stat(1, 1)), [(1, 1, 6_000_000_000)], "once more");
        assert_eq!(read(stat(1, 1)), [], "nothing new");
    }

    #[test]
    fn batched_links_from_linux_6_10_unless_the_environment_says_per_probe() {
        assert_eq!(method_allowed("6.18.44-fc-v657", None), Ok(()));
        assert_eq!(
            method_allowed("6.10.0", Some(OsStr::new("batched"))),
            Ok(())
        );
        let per = |r: Result<(), AttachMethod>| match r {
            Err(AttachMethod::PerProbe(why)) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            per(method_allowed("6.9.12", None)),
            "Linux 6.9 < 6.10: batched links filter by process reliably from 6.10"
        );
        assert_eq!(
            per(method_allowed("6.1.0-40-amd64", None)),
            "Linux 6.1 < 6.10: batched links filter by process reliably from 6.10"
        );
        assert_eq!(
            per(method_allowed("6.18.0", Some(OsStr::new("per-probe")))),
            "GPU_TRACE_UPROBE_ATTACH=per-probe"
        );
        assert_eq!(
            per(method_allowed("6.18.0", Some(OsStr::new("fast\x1b[2J")))),
            "GPU_TRACE_UPROBE_ATTACH=fast\\x1b[2J is neither `batched` nor `per-probe`"
        );
        assert_eq!(
            per(method_allowed("", None)),
            "kernel release  not understood"
        );
    }
}
