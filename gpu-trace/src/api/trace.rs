//! `gpu-trace api` without `--resolve`: the API layer's tracing (issue 28). Every table symbol
//! of every library mapped in each target gets a uprobe and a uretprobe, attached per process
//! (the kernel fires them for that process only), with a cookie naming the library and symbol;
//! the kernel adds the calls up (`probes/api_call.rs`) and this reads the sums each interval
//! and at exit. Launch mode (`-- CMD`) attaches by path before the child execs, so that the
//! first calls are seen; every interval rescans each target's maps and attaches new libraries.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::Write as _;
use std::num::NonZeroU32;
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::time::{Duration, Instant};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuHashMap, RingBuf},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use gpu_trace_common::api::{
    API_CALL, API_HIST_BUCKETS, API_RECURSION, API_STACK_MAX, ApiCallRecord, ApiKey,
    ApiRecursionRecord, ApiStack, ApiStat, api_switch,
};
use gpu_trace_common::zerocopy::FromBytes as _;
use gpu_trace_core::api::events::{self, CallEvent, RecursionEvent, Site, StuckEvent};
use gpu_trace_core::api::stats::{self, CallStats};
use gpu_trace_core::api::symbols::SymbolTable;
use gpu_trace_core::escape::{decode_lossless, escape_text};

use super::stuck::Symbolizer;
use super::{ApiError, symbol_table};
use crate::cli::{ApiArgs, ApiFormat, kernel_comm};
use crate::launch::{self, executable_of, reap};
use crate::loader::trampoline::run_stats;
use crate::probe::libraries::{self, Reader};

const KEY_LEN: usize = size_of::<ApiKey>();
const STAT_LEN: usize = size_of::<ApiStat>();
const STACK_LEN: usize = size_of::<ApiStack>();
/// How often the open calls are checked for `--stuck-after`.
const STUCK_POLL: Duration = Duration::from_millis(250);

/// How the tracing ended: the launched command's exit status (`None` in `--pid`/`--comm` mode).
pub struct Traced {
    pub child_status: Option<i32>,
}

/// Why tracing could not run.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(
        "loading the uprobe programs: {0} (the kernel needs uprobes (CONFIG_UPROBE_EVENTS) and \
         BPF attach cookies (5.15 or later); run as root)"
    )]
    Load(String),
    #[error("give --pid, --comm or `-- CMD` (which processes to trace)")]
    NoTarget,
    #[error("{0}")]
    NoGpuLibrary(String),
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
}

/// The loaded programs and what is attached.
struct Tracer {
    ebpf: Ebpf,
    reader: Reader,
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
    /// `API_CALL` and `API_RECURSION` records.
    ring: Option<RingBuf<MapData>>,
    symbolizer: Symbolizer,
    /// Stuck calls reported: (pid_tgid, cookie, entry time).
    stuck_seen: HashSet<(u64, u64, u64)>,
}

impl Tracer {
    fn load(table: SymbolTable, args: &ApiArgs) -> Result<Self, TraceError> {
        let mut ebpf =
            Ebpf::load(crate::loader::PROGRAMS).map_err(|e| TraceError::Load(e.to_string()))?;
        for name in ["api_entry", "api_return"] {
            let p: &mut UProbe = ebpf
                .program_mut(name)
                .ok_or_else(|| TraceError::Load(format!("no program {name} in the object")))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| TraceError::Load(e.to_string()))?;
            p.load().map_err(|e| TraceError::Load(e.to_string()))?;
        }
        let switches = ebpf
            .map_mut("API_SWITCHES")
            .ok_or_else(|| TraceError::Load("no map API_SWITCHES".into()))?;
        let mut switches: Array<_, u32> =
            Array::try_from(switches).map_err(|e| TraceError::Load(e.to_string()))?;
        for (i, v) in [
            (api_switch::VERBOSE, u32::from(args.verbose)),
            (api_switch::MAX_DEPTH, args.max_depth),
        ] {
            switches
                .set(i, v, 0)
                .map_err(|e| TraceError::Load(e.to_string()))?;
        }
        let ring = ebpf
            .take_map("EVENTS")
            .and_then(|m| RingBuf::try_from(m).ok());
        Ok(Self {
            ebpf,
            reader: Reader::new(table),
            libs: Vec::new(),
            lib_ids: HashMap::new(),
            syms: Vec::new(),
            sym_ids: HashMap::new(),
            attached: HashSet::new(),
            failed: HashSet::new(),
            links: Vec::new(),
            ring,
            symbolizer: Symbolizer::default(),
            stuck_seen: HashSet::new(),
        })
    }

    fn intern(ids: &mut HashMap<String, u32>, names: &mut Vec<String>, name: &str) -> u32 {
        *ids.entry(name.to_string()).or_insert_with(|| {
            names.push(name.to_string());
            names.len() as u32 - 1
        })
    }

    /// Attaches entry and return probes for `symbols` of the file `path` (as the target sees
    /// it; `file` is where this process opens it) in `pid`. Returns how many symbols are newly
    /// attached.
    fn attach_file(&mut self, pid: u32, path: &str, file: &str, symbols: &[String]) -> usize {
        let Ok(meta) = std::fs::metadata(file) else {
            return 0;
        };
        let Some(scope) = NonZeroU32::new(pid).map(UProbeScope::OneProcess) else {
            return 0;
        };
        let lib = Self::intern(&mut self.lib_ids, &mut self.libs, path);
        let mut added = 0;
        for sym in symbols {
            let key = (pid, meta.dev(), meta.ino(), sym.clone());
            if self.attached.contains(&key) {
                continue;
            }
            let id = Self::intern(&mut self.sym_ids, &mut self.syms, sym);
            let cookie = (u64::from(lib) << 32) | u64::from(id);
            let mut result = Ok(());
            for name in ["api_entry", "api_return"] {
                let p: &mut UProbe = match self.ebpf.program_mut(name).map(TryInto::try_into) {
                    Some(Ok(p)) => p,
                    _ => continue,
                };
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::Symbol(sym),
                    cookie: Some(cookie),
                };
                match p.attach(point, file, scope) {
                    Ok(link) => self.links.push((name, link)),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            match result {
                Ok(()) => {
                    self.attached.insert(key);
                    added += 1;
                }
                Err(e) => {
                    if self.failed.insert((path.to_string(), sym.clone())) {
                        let mut why = e.to_string();
                        let mut source = std::error::Error::source(&e);
                        while let Some(s) = source {
                            why.push_str(": ");
                            why.push_str(&s.to_string());
                            source = s.source();
                        }
                        eprintln!(
                            "gpu-trace: cannot probe {} in {}: {}",
                            escape_text(sym),
                            escape_text(path),
                            escape_text(&why)
                        );
                    }
                }
            }
        }
        added
    }

    /// Attaches every table symbol of every library mapped in `pid` not attached yet. Returns
    /// whether the process could be read, and how many libraries define table symbols.
    fn scan(&mut self, pid: u32) -> Option<usize> {
        let report = self.reader.read(pid).ok()?;
        let mut with_symbols = 0;
        for lib in &report.libraries {
            if lib.defines.is_empty() {
                continue;
            }
            with_symbols += 1;
            let symbols: Vec<String> = lib.defines.keys().cloned().collect();
            let file = format!("/proc/{pid}/root{}", lib.path);
            self.attach_file(pid, &lib.path, &file, &symbols);
        }
        Some(with_symbols)
    }

    /// Ends the run with the results already out, without waiting for the kernel to remove the
    /// probes: it waits for a grace period for each perf-event uprobe it removes (0.1 to 0.2 s
    /// each, one at a time: a minute for PyTorch's libcuda and libcudart on the GPU host). A
    /// child process inherits the probes' descriptors and drops them as it exits, in the
    /// background; this process then lets its own copies go without detaching (the last
    /// holder's close is the slow one). Where fork fails, detaches here.
    fn release_in_background(mut self) {
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // The child must outlive this process (the last holder pays for the removals): it
        // waits for the end of a pipe whose write end only this process holds, until exit.
        let mut ends = [0 as libc::c_int; 2];
        // SAFETY: a valid two-int array.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            self.detach();
            return;
        }
        let [wait_end, held_end] = ends;
        // SAFETY: the child only calls async-signal-safe functions (setsid, close, read, _exit).
        match unsafe { libc::fork() } {
            0 => unsafe {
                // Out of the terminal's session, and off the standard streams so that nothing
                // reading gpu-trace's output (a pipe, `$(…)`) waits for it.
                libc::setsid();
                libc::close(held_end);
                for fd in 0..3 {
                    libc::close(fd);
                }
                let mut byte = 0u8;
                while libc::read(wait_end, (&raw mut byte).cast(), 1) < 0 {}
                libc::_exit(0)
            },
            pid if pid > 0 => {
                // SAFETY: our own descriptor; `held_end` stays open until this process exits.
                unsafe { libc::close(wait_end) };
                std::mem::forget(self);
            }
            _ => {
                // SAFETY: our own descriptors.
                unsafe {
                    libc::close(wait_end);
                    libc::close(held_end);
                }
                self.detach();
            }
        }
    }

    /// Detaches everything now (the fallback of [`Self::release_in_background`]).
    fn detach(&mut self) {
        for (name, id) in std::mem::take(&mut self.links) {
            if let Some(Ok(p)) = self
                .ebpf
                .program_mut(name)
                .map(TryInto::<&mut UProbe>::try_into)
            {
                let _ = p.detach(id);
            }
        }
    }

    /// `api_entry runs=N api_return runs=M`: the kernel's run counts (BPF statistics on).
    fn runs(&self) -> String {
        ["api_entry", "api_return"]
            .iter()
            .map(|name| {
                let runs = self
                    .ebpf
                    .program(name)
                    .and_then(|p| p.fd().ok())
                    .and_then(|fd| run_stats(fd.as_fd().as_raw_fd()))
                    .map_or(0, |s| s.runs);
                format!("{name} runs={runs}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn site(&self, cookie: u64) -> Site {
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

    /// The records the ring holds now, as lines (text or JSON).
    fn drain(&mut self, json: bool) -> Vec<String> {
        let mut raw = Vec::new();
        if let Some(ring) = self.ring.as_mut() {
            while let Some(item) = ring.next() {
                raw.push(item.to_vec());
            }
        }
        raw.iter().filter_map(|b| self.decode(b, json)).collect()
    }

    fn decode(&self, b: &[u8], json: bool) -> Option<String> {
        let kind = u32::from_ne_bytes(b.get(..4)?.try_into().ok()?);
        let comm = |c: &[u8; 16]| decode_lossless(c.split(|&x| x == 0).next().unwrap_or_default());
        if kind == API_CALL {
            let (r, _) = ApiCallRecord::read_from_prefix(b).ok()?;
            let e = CallEvent {
                pid: r.hdr.tgid,
                tid: r.hdr.tid,
                comm: comm(&r.hdr.comm),
                site: self.site(r.cookie),
                caller: (r.depth > 0).then(|| self.site(r.caller_cookie)),
                duration_ns: r.duration_ns,
                ret: r.ret,
                depth: r.depth,
            };
            return Some(if json {
                events::call_json(&e)
            } else {
                events::call_text(&e)
            });
        }
        if kind == API_RECURSION {
            let (r, _) = ApiRecursionRecord::read_from_prefix(b).ok()?;
            let kept = (r.depth.saturating_sub(1) as usize).min(API_STACK_MAX);
            let e = RecursionEvent {
                pid: r.hdr.tgid,
                tid: r.hdr.tid,
                comm: comm(&r.hdr.comm),
                site: self.site(r.cookie),
                depth: r.depth,
                past_cap: r.past_cap != 0,
                chain: r.chain[..kept].iter().map(|&c| self.site(c)).collect(),
            };
            return Some(if json {
                events::recursion_json(&e)
            } else {
                events::recursion_text(&e)
            });
        }
        None
    }

    /// `API_STUCK` lines (text or JSON, newline-terminated) for the calls of `targets` open
    /// `after_ns` or longer and not reported yet.
    fn stuck(&mut self, targets: &HashSet<u32>, after_ns: u64, json: bool) -> Vec<String> {
        let now = monotonic_ns();
        let mut found = Vec::new();
        if let Some(map) = self.ebpf.map("API_OPEN")
            && let Ok(map) = BpfHashMap::<_, u64, [u8; STACK_LEN]>::try_from(map)
        {
            for (id, raw) in map.iter().flatten() {
                let Ok(stack) = ApiStack::read_from_bytes(&raw) else {
                    continue;
                };
                if !targets.contains(&((id >> 32) as u32)) {
                    continue;
                }
                let kept = (stack.depth as usize).min(API_STACK_MAX);
                for f in &stack.frames[..kept] {
                    let open = now.saturating_sub(f.entry_ns);
                    if open >= after_ns && self.stuck_seen.insert((id, f.cookie, f.entry_ns)) {
                        found.push((id, f.cookie, open));
                    }
                }
            }
        }
        let mut lines = Vec::new();
        for (id, cookie, open_ns) in found {
            let (pid, tid) = ((id >> 32) as u32, id as u32);
            let dir = format!("/proc/{pid}/task/{tid}");
            // A thread that ended inside the call: nothing to report.
            let Ok(comm) = std::fs::read(format!("{dir}/comm")) else {
                continue;
            };
            let t = self.symbolizer.thread(pid, tid);
            let e = StuckEvent {
                pid,
                tid,
                comm: decode_lossless(comm.strip_suffix(b"\n").unwrap_or(&comm)),
                site: self.site(cookie),
                open_ns,
                state: t.state,
                wchan: t.wchan,
                syscall: t.syscall,
                stack: t.stack,
            };
            lines.push(if json {
                events::stuck_json(&e) + "\n"
            } else {
                events::stuck_text(&e)
            });
        }
        lines
    }

    /// The sums the kernel holds for `pids`.
    fn read(&self, pids: &HashSet<u32>) -> Vec<CallStats> {
        let Some(map) = self.ebpf.map("API_STATS") else {
            return Vec::new();
        };
        let Ok(map) = PerCpuHashMap::<_, [u8; KEY_LEN], [u8; STAT_LEN]>::try_from(map) else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for (k, per_cpu) in map.iter().flatten() {
            let Ok(key) = ApiKey::read_from_bytes(&k) else {
                continue;
            };
            let mut stat = ApiStat {
                count: 0,
                errors: 0,
                total_ns: 0,
                hist: [0; API_HIST_BUCKETS],
            };
            for v in per_cpu.iter() {
                let Ok(s) = ApiStat::read_from_bytes(v) else {
                    continue;
                };
                stat.count += s.count;
                stat.errors += s.errors;
                stat.total_ns += s.total_ns;
                for (a, b) in stat.hist.iter_mut().zip(s.hist) {
                    *a += b;
                }
            }
            if !pids.contains(&key.tgid) {
                continue;
            }
            let site = self.site(key.cookie);
            rows.push(CallStats {
                pid: key.tgid,
                library: site.library,
                symbol: site.symbol,
                calls: stat.count,
                errors: stat.errors,
                total_ns: stat.total_ns,
                hist: stat.hist.to_vec(),
            });
        }
        stats::sort(&mut rows);
        rows
    }
}

/// The libraries a command started now loads at start that define table symbols, before it
/// runs: `LD_PRELOAD`'s files, and the table's libraries in the `DT_NEEDED` closure of the
/// command's executable, found as its dynamic linker finds them (`probe::linker`: RPATH with
/// `$ORIGIN`, `LD_LIBRARY_PATH`, RUNPATH, the cache). Libraries it `dlopen`s later (Python's
/// CUDA runtime) are attached at the next rescan: a cached runtime the command never loads gets no probes
/// (each costs its removal later, docs/api.md).
fn launch_candidates(table: &SymbolTable, cmd: &OsString) -> Vec<(String, Vec<String>)> {
    let mut paths: Vec<String> = libraries::split_preload(
        std::env::var_os("LD_PRELOAD")
            .unwrap_or_default()
            .as_bytes(),
    )
    .into_iter()
    .filter(|p| p.starts_with('/'))
    .collect();
    if let Some(exe) = executable_of(cmd) {
        for (name, path) in crate::probe::linker::Linker::from_env().closure(&exe, table) {
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
            let real = decode_lossless(real.as_os_str().as_bytes());
            let defines = libraries::defines_of(std::path::Path::new(&real), table);
            (!defines.is_empty()).then_some((real, defines))
        })
        .collect()
}

/// Two descriptors per probed symbol (entry and return), a hundred symbols in libcuda alone: a
/// soft limit of 1024 open files (a common default) leaves no room for PyTorch's runtimes. The
/// soft limit goes up to the hard one, as other tracers do.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit for both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// `gpu-trace api [--pid P]… [--comm NAME] [-- CMD]`: trace until the targets are gone, the
/// command exits, or SIGINT/SIGTERM; print the counts every `--interval` and at the end.
pub fn trace(args: &ApiArgs) -> Result<Traced, TraceError> {
    let table = symbol_table(args)?;
    if args.pids.is_empty() && args.comm.is_none() && args.command.is_empty() {
        return Err(TraceError::NoTarget);
    }
    let _ = crate::session::install_stop_signals();
    raise_open_file_limit();
    let mut tracer = Tracer::load(table.clone(), args)?;
    let mut targets: HashSet<u32> = args.pids.iter().copied().collect();
    let mut child = None;
    if !args.command.is_empty() {
        let launched = launch::fork_waiting(&args.command, None)?;
        for (path, symbols) in launch_candidates(&table, &args.command[0]) {
            tracer.attach_file(launched.pid, &path, &path, &symbols);
        }
        targets.insert(launched.pid);
        child = Some(launched.pid);
        launched.release();
    }
    if let Some(c) = args.comm.as_deref() {
        let c = kernel_comm(c);
        let own = std::process::id();
        targets.extend(
            libraries::all_pids()
                .into_iter()
                .filter(|&p| p != own && libraries::comm_of(p).as_deref() == Some(c.as_bytes())),
        );
        if targets.is_empty() {
            return Err(
                ApiError::NoComm(escape_text(&decode_lossless(c.as_bytes())).into_owned()).into(),
            );
        }
    }
    if child.is_none() {
        let mut any = false;
        for &pid in &targets {
            any |= tracer.scan(pid).is_some_and(|n| n > 0);
        }
        if !any {
            return Err(TraceError::NoGpuLibrary(format!(
                "no target maps a library that defines a GPU API symbol (see `gpu-trace api \
                 --resolve` for what each maps; add your library with --probe LIB:SYMBOL): {} \
                 process(es) checked",
                targets.len()
            )));
        }
    }
    let run_stats = if args.bpf_stats {
        Some(
            aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| TraceError::Load(format!("BPF statistics: {}", e.io_error)))?,
        )
    } else {
        None
    };
    let status = run_loop(&mut tracer, args, &mut targets, child);
    emit_events(&mut tracer, args);
    let final_rows = tracer.read(&targets);
    print(args, &final_rows, true);
    if run_stats.is_some() {
        eprintln!("gpu-trace: bpf-stats {}", tracer.runs());
    }
    tracer.release_in_background();
    Ok(Traced {
        child_status: status,
    })
}

/// CLOCK_MONOTONIC in ns (the clock of `bpf_ktime_get_ns`).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Rescans and prints each interval until the end; returns the child's exit status.
fn run_loop(
    tracer: &mut Tracer,
    args: &ApiArgs,
    targets: &mut HashSet<u32>,
    child: Option<u32>,
) -> Option<i32> {
    let every = Duration::from_secs_f64(args.interval.unwrap_or(1.0));
    let mut next = Instant::now() + every;
    let mut next_stuck = Instant::now() + STUCK_POLL;
    loop {
        if crate::session::stop_requested() {
            // Like strace: the command goes on untraced (it got the terminal's SIGINT too).
            return child.map(|c| reap(c).unwrap_or(128 + libc::SIGINT));
        }
        if let Some(c) = child
            && let Some(status) = reap(c)
        {
            return Some(status);
        }
        if child.is_none() {
            targets.retain(|&p| std::path::Path::new(&format!("/proc/{p}")).exists());
            if targets.is_empty() {
                return None;
            }
        }
        if Instant::now() >= next {
            next += every;
            for &pid in targets.iter() {
                let _ = tracer.scan(pid);
            }
            if args.interval.is_some() {
                print(args, &tracer.read(targets), false);
            }
        }
        emit_events(tracer, args);
        if Instant::now() >= next_stuck {
            next_stuck += STUCK_POLL;
            let after = (args.stuck_after * 1e9) as u64;
            let lines = tracer.stuck(targets, after, args.format == ApiFormat::Json);
            let mut out = std::io::stdout().lock();
            for l in lines {
                let _ = out.write_all(l.as_bytes());
            }
            let _ = out.flush();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Prints the ring's `API_CALL` / `API_RECURSION` records.
fn emit_events(tracer: &mut Tracer, args: &ApiArgs) {
    let lines = tracer.drain(args.format == ApiFormat::Json);
    if lines.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
}

fn print(args: &ApiArgs, rows: &[CallStats], final_: bool) {
    let mut out = std::io::stdout().lock();
    let text = match args.format {
        ApiFormat::Text => {
            let title = if final_ {
                "API calls (at exit):"
            } else {
                "API calls so far:"
            };
            stats::text(title, rows)
        }
        ApiFormat::Json => rows.iter().map(|r| stats::json(r, final_) + "\n").collect(),
    };
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
