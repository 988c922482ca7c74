//! `API_STUCK`: an API call open longer than `--stuck-after`, found in the kernel's per-thread
//! open-call stacks (`API_OPEN`) and described from /proc at report time: the thread's state,
//! wait channel and system call, and a user stack recovered by scanning the thread's stack
//! memory from its stack pointer for addresses in executable file mappings, symbolized from
//! the mapped files' ELF symbol tables (the nearest symbol at or below; the address where
//! none). A scan, not an unwind: a word that happens to point into code shows as a frame too.

use std::collections::{HashMap, HashSet};
use std::io::{Read as _, Seek as _, SeekFrom};

use aya::{Ebpf, maps::HashMap as BpfHashMap};
use gpu_trace_common::api::{API_STACK_MAX, ApiStack};
use gpu_trace_common::zerocopy::FromBytes as _;
use gpu_trace_core::api::events::{Site, StuckEvent};
use gpu_trace_core::escape::decode_lossless;
use gpu_trace_core::event::monotonic_ns;

use crate::probe::elf::{TextSymbols, text_symbols};
use crate::probe::untrusted::{self, Limit};

/// How often the live loops look for calls open past the threshold.
pub const STUCK_POLL: std::time::Duration = std::time::Duration::from_millis(250);
/// Symbol tables kept between two looks; past it they are read again (a long run meets many
/// processes: the cache is not kept for its whole life).
const FILES_KEPT: usize = 256;
const STACK_LEN: usize = size_of::<ApiStack>();

/// The stuck calls of both live commands (`gpu-trace api`, the main trace's `--api`): the
/// kernel's open-call stacks read, each call open past the threshold reported once, described
/// from /proc. What it remembers is bounded by the calls open now.
#[derive(Default)]
pub struct StuckFinder {
    symbolizer: Symbolizer,
    /// Reported and still open: (pid_tgid, cookie, entry time).
    seen: HashSet<(u64, u64, u64)>,
}

impl StuckFinder {
    /// The calls of the processes `is_target` takes, open `after_ns` or longer and not reported
    /// yet (`site`: the names behind a cookie).
    pub fn find(
        &mut self,
        ebpf: &Ebpf,
        is_target: impl Fn(u32) -> bool,
        after_ns: u64,
        site: impl Fn(u64) -> Site,
    ) -> Vec<StuckEvent> {
        let now = monotonic_ns();
        let mut open = HashSet::new();
        let mut found = Vec::new();
        if let Some(map) = ebpf.map("API_OPEN")
            && let Ok(map) = BpfHashMap::<_, u64, [u8; STACK_LEN]>::try_from(map)
        {
            for (id, raw) in map.iter().flatten() {
                let Ok(stack) = ApiStack::read_from_bytes(&raw) else {
                    continue;
                };
                if !is_target((id >> 32) as u32) {
                    continue;
                }
                let kept = (stack.depth as usize).min(API_STACK_MAX);
                for f in &stack.frames[..kept] {
                    let key = (id, f.cookie, f.entry_ns);
                    open.insert(key);
                    let long = now.saturating_sub(f.entry_ns);
                    if long >= after_ns && self.seen.insert(key) {
                        found.push((id, f.cookie, f.sp, long));
                    }
                }
            }
        }
        // A call that returned is forgotten (a later call is a new one: new entry time).
        self.seen.retain(|k| open.contains(k));
        if self.symbolizer.files.len() > FILES_KEPT {
            self.symbolizer = Symbolizer::default();
        }
        found
            .into_iter()
            .filter_map(|(id, cookie, frame_sp, open_ns)| {
                self.describe(id, frame_sp, open_ns, site(cookie))
            })
            .collect()
    }

    /// The call of thread `id` whose frame returns to `frame_sp`, described from /proc;
    /// `None` if the thread ended or has left the frame.
    fn describe(&mut self, id: u64, frame_sp: u64, open_ns: u64, site: Site) -> Option<StuckEvent> {
        let (pid, tid) = ((id >> 32) as u32, id as u32);
        // A thread that ended inside the call: nothing to report.
        let comm = std::fs::read(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
        // Its /proc entries and the files it maps are read on a worker under the deadline
        // (docs/reliability.md, section 13).
        let mut symbolizer = std::mem::take(&mut self.symbolizer);
        let (symbolizer, t) = untrusted::bounded(
            untrusted::TARGET_DEADLINE,
            &crate::flags::stop_requested,
            move || {
                let t = symbolizer.thread(pid, tid);
                (symbolizer, t)
            },
        )?;
        self.symbolizer = symbolizer;
        if t.sp.is_some_and(|sp| frame_sp <= sp) {
            // A frame the thread has left: not a call it is in.
            return None;
        }
        Some(StuckEvent {
            pid,
            tid,
            comm: decode_lossless(comm.strip_suffix(b"\n").unwrap_or(&comm)),
            site,
            open_ns,
            state: t.state,
            wchan: t.wchan,
            syscall: t.syscall,
            stack: t.stack,
        })
    }
}

/// Bytes of stack read from the stack pointer up.
const SCAN_BYTES: usize = 32 * 1024;
/// Frames kept.
const MAX_FRAMES: usize = 24;

/// What /proc says about a thread now.
pub struct ThreadState {
    /// `stat`'s state letter (`R`, `S`, `D`, …; `?` unknown).
    pub state: String,
    pub wchan: String,
    /// `syscall`'s first field: the number, `running`, or empty.
    pub syscall: String,
    /// `lib+0xoff symbol+0xoff` lines, innermost first.
    pub stack: Vec<String>,
    /// The thread's user stack pointer while it is in a system call (`None`: running, or not
    /// readable): an open-call frame whose return stack pointer is at or below it is a call
    /// the thread has left (a longjmp, an exception), not one it is stuck in.
    pub sp: Option<u64>,
}

/// One executable file mapping.
pub(crate) struct ExecMap {
    pub(crate) start: u64,
    pub(crate) end: u64,
    offset: u64,
    pub(crate) path: String,
}

/// The executable file mappings of `pid` (its maps read under their limit).
pub(crate) fn exec_maps(pid: u32) -> Vec<ExecMap> {
    let text = untrusted::read_proc(&format!("/proc/{pid}/maps"), Limit::Maps).unwrap_or_default();
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let path = f.nth(2)?;
            if !perms.contains('x') || !path.starts_with('/') {
                return None;
            }
            let (s, e) = range.split_once('-')?;
            Some(ExecMap {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                path: path.to_string(),
            })
        })
        .collect()
}

/// Symbol tables by path: (address, size, name) sorted, and the PT_LOAD (offset, size,
/// vaddr) triples.
#[derive(Default)]
pub struct Symbolizer {
    files: HashMap<String, Option<TextSymbols>>,
}

/// The symbols of the file mapped at `m` in `pid`, opened as the process sees it
/// (`probe::untrusted`: the mapping itself, or its path inside the process's root; a regular
/// file, read under a budget).
fn elf_syms(pid: u32, m: &ExecMap) -> Option<TextSymbols> {
    let range = format!("{:x}-{:x}", m.start, m.end);
    let file = untrusted::open_mapping(pid, &range, &m.path).ok()?;
    text_symbols(file.file())
}

impl Symbolizer {
    /// `path+0xoff symbol+0xoff` for a file offset in the file of mapping `m` of `pid`.
    fn name(&mut self, pid: u32, m: &ExecMap, file_off: u64) -> String {
        let base = format!("{}+{file_off:#x}", m.path);
        let Some(elf) = self
            .files
            .entry(format!("{pid} {}", m.path))
            .or_insert_with(|| elf_syms(pid, m))
        else {
            return base;
        };
        let Some(vaddr) = elf
            .segments
            .iter()
            .find(|(off, size, _)| (*off..off + size).contains(&file_off))
            .map(|(off, _, va)| file_off - off + va)
        else {
            return base;
        };
        let i = elf.syms.partition_point(|s| s.0 <= vaddr);
        match i.checked_sub(1).map(|i| &elf.syms[i]) {
            Some((addr, size, name)) if *size == 0 || vaddr < addr + size => {
                format!("{base} {name}+{:#x}", vaddr - addr)
            }
            _ => base,
        }
    }

    /// Where address `addr` of `pid` is: the mapped file, the offset in it, and the name of the
    /// function that starts there when the file's symbol tables (`.symtab`, `.dynsym`) have one
    /// (`None` for the whole answer: no executable file mapping holds it).
    pub fn locate(&mut self, pid: u32, addr: u64) -> Option<(String, u64, Option<String>)> {
        let m = exec_maps(pid)
            .into_iter()
            .find(|m| (m.start..m.end).contains(&addr))?;
        let file_off = addr - m.start + m.offset;
        let function = self
            .files
            .entry(format!("{pid} {}", m.path))
            .or_insert_with(|| elf_syms(pid, &m))
            .as_ref()
            .and_then(|elf| {
                let vaddr = elf
                    .segments
                    .iter()
                    .find(|(off, size, _)| (*off..off + size).contains(&file_off))
                    .map(|(off, _, va)| file_off - off + va)?;
                let i = elf.syms.partition_point(|s| s.0 <= vaddr);
                let (start, _, name) = &elf.syms[i.checked_sub(1)?];
                (*start == vaddr).then(|| name.clone())
            });
        Some((m.path, file_off, function))
    }

    /// The thread's state and its scanned user stack.
    pub fn thread(&mut self, pid: u32, tid: u32) -> ThreadState {
        let dir = format!("/proc/{pid}/task/{tid}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).unwrap_or_default();
        let stat = read("stat");
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        let syscall = read("syscall");
        let fields: Vec<&str> = syscall.split_whitespace().collect();
        // `nr a0..a5 sp pc` while in a system call.
        let (sp, pc) = match fields.as_slice() {
            [_, _, _, _, _, _, _, sp, pc] => (parse_hex(sp), parse_hex(pc)),
            _ => (None, None),
        };
        let stack = match (sp, pc) {
            (Some(sp), Some(pc)) => self.scan(pid, sp, pc),
            _ => Vec::new(),
        };
        ThreadState {
            state,
            wchan: read("wchan"),
            syscall: fields.first().copied().unwrap_or("").to_string(),
            stack,
            sp,
        }
    }

    fn scan(&mut self, pid: u32, sp: u64, pc: u64) -> Vec<String> {
        let maps = exec_maps(pid);
        let mut buf = vec![0u8; SCAN_BYTES];
        let got = std::fs::File::open(format!("/proc/{pid}/mem"))
            .and_then(|mut f| {
                f.seek(SeekFrom::Start(sp))?;
                let mut n = 0;
                while n < buf.len() {
                    match f.read(&mut buf[n..]) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                }
                Ok(n)
            })
            .unwrap_or(0);
        let words = buf[..got - got % 8]
            .as_chunks::<8>()
            .0
            .iter()
            .map(|w| u64::from_ne_bytes(*w));
        let mut out = Vec::new();
        for addr in std::iter::once(pc).chain(words) {
            if out.len() >= MAX_FRAMES {
                break;
            }
            if let Some(m) = maps.iter().find(|m| (m.start..m.end).contains(&addr)) {
                out.push(self.name(pid, m, addr - m.start + m.offset));
            }
        }
        out
    }
}

fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}
