//! `gpu-trace api`: the API layer (issue 28). Built so far: `--resolve`, which library serves
//! each GPU API call in a process (the reads are `probe::libraries`', the logic and output
//! `gpu_trace_core::api`'s); and tracing (`trace`): uprobes on every table symbol of every
//! library mapped in the targets, with the calls counted in the kernel; `attach`: the uprobes
//! on a loaded object, shared with the main trace's `--api` (driver events tagged with the API
//! call open on their thread).

pub mod attach;
pub mod interpose;
pub mod progress;
pub mod stuck;
pub mod sums;
pub mod trace;

use std::io::Write as _;

use gpu_trace_core::api::render::{self, ProcessReport};
use gpu_trace_core::api::resolve::{Origin, Warning};
use gpu_trace_core::api::symbols::{ProbeError, SymbolTable};
use gpu_trace_core::escape::{decode_lossless, escape_text};

use crate::cli::{ApiArgs, ApiFormat, kernel_comm};
use crate::probe::libraries::{self, ReadError, Reader};
use crate::probe::untrusted::{self, Limit};

/// Why `--resolve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("--probe: {0}")]
    Probe(#[from] ProbeError),
    #[error("--probe-file: {0} (give a readable regular file of LIB:SYMBOL lines)")]
    ProbeFile(String),
    #[error("no process is named `{0}` (the kernel's name: see `ps -e -o comm`)")]
    NoComm(String),
    #[error("writing the output: {0}")]
    Output(std::io::Error),
}

impl ApiError {
    /// A mistake on the command line (exit 2) rather than a failure (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(self, ApiError::Probe(_) | ApiError::ProbeFile(_))
    }
}

/// The symbol table with the user's probes.
pub fn symbol_table(args: &ApiArgs) -> Result<SymbolTable, ApiError> {
    let mut table = SymbolTable::builtin();
    for p in &args.probes {
        table.add_probe(p)?;
    }
    for path in &args.probe_files {
        let name = path.display().to_string();
        // Opened without blocking (a FIFO would wait for a writer), a regular file only, read
        // up to its cap (docs/reliability.md).
        let text = untrusted::open_host(path)
            .and_then(|f| f.read_all(&name, Limit::ProbeFile))
            .map_err(|e| ApiError::ProbeFile(escape_text(&e.to_string()).into_owned()))?;
        let text = String::from_utf8(text)
            .map_err(|_| ApiError::ProbeFile(format!("{}: not UTF-8 text", escape_text(&name))))?;
        table.add_probe_file(&name, &text)?;
    }
    Ok(table)
}

/// `gpu-trace api --resolve`: the reports on stdout, a process that could not be read on
/// stderr. Returns whether every process asked for by `--pid` was read.
pub fn resolve(args: &ApiArgs) -> Result<bool, ApiError> {
    let table = symbol_table(args)?;
    let mut slot = Some(Reader::new(table.clone()));
    // Each process read on a worker under its deadline (docs/reliability.md).
    let mut read = |pid| {
        libraries::read_within_deadline(&mut slot, &table, pid, &|| false, |_| false)
            .unwrap_or(Err(ReadError::TimedOut(pid)))
            .and_then(|r| r.map(|(report, _)| report).ok_or(ReadError::NoProcess(pid)))
    };
    let mut out = std::io::stdout().lock();
    let mut all_read = true;
    let mut emit = |report: &ProcessReport| -> Result<(), ApiError> {
        let text = match args.format {
            ApiFormat::Text => render::text(report),
            ApiFormat::Json => render::json(report) + "\n",
        };
        let sep = if args.format == ApiFormat::Text {
            "\n"
        } else {
            ""
        };
        write!(out, "{text}{sep}").map_err(ApiError::Output)
    };
    if !args.pids.is_empty() {
        for &pid in &args.pids {
            match read(pid) {
                Ok(report) => emit(&report)?,
                Err(e) => {
                    crate::say!("gpu-trace: {e}");
                    all_read = false;
                }
            }
        }
        return Ok(all_read);
    }
    let comm = args.comm.as_deref().map(kernel_comm);
    let own = std::process::id();
    let mut shown = 0;
    let mut denied = 0;
    let mut leaks = Vec::new();
    for pid in libraries::all_pids() {
        if pid == own {
            continue;
        }
        if let Some(c) = comm
            && libraries::comm_of(pid).as_deref() != Some(c.as_bytes())
        {
            continue;
        }
        let report = match read(pid) {
            Ok(r) => r,
            Err(ReadError::Denied(_) | ReadError::DeniedToRoot(_)) => {
                denied += 1;
                continue;
            }
            // Gone since the listing: nothing to resolve.
            Err(ReadError::NoProcess(_) | ReadError::Exited(_)) => continue,
            Err(e) => {
                crate::say!("gpu-trace: {e}");
                continue;
            }
        };
        // --comm lists every process of that name; otherwise those that map an API library.
        if comm.is_none() && !report.libraries.iter().any(|l| !l.defines.is_empty()) {
            continue;
        }
        emit(&report)?;
        shown += 1;
        leaks.extend(leak_lines(&report));
    }
    if denied > 0 {
        // SAFETY: no arguments.
        let fix = if unsafe { libc::geteuid() } == 0 {
            "processes of another user namespace, or kept from ptrace-read access by Yama or an \
             LSM: run gpu-trace in their namespace"
        } else {
            "run as root to see every process"
        };
        crate::say!("gpu-trace: {denied} processes could not be read (permission denied): {fix}");
    }
    if let Some(c) = args.comm.as_deref()
        && shown == 0
    {
        return Err(ApiError::NoComm(
            escape_text(&decode_lossless(c.as_bytes())).into_owned(),
        ));
    }
    if shown == 0 {
        crate::say!("gpu-trace: no process maps a library that defines a GPU API symbol");
    }
    if args.format == ApiFormat::Text && !leaks.is_empty() {
        let mut text = format!(
            "LD_PRELOAD leak: {} processes without a GPU open map a preloaded library that \
             defines GPU API symbols (an exported LD_PRELOAD; set it on the GPU command only):\n",
            leaks.len()
        );
        for l in leaks {
            text += &l;
        }
        write!(out, "{text}").map_err(ApiError::Output)?;
    }
    Ok(all_read)
}

/// The leak summary's lines for one process (none where it has no leak warning).
fn leak_lines(report: &ProcessReport) -> Vec<String> {
    report
        .resolution
        .warnings
        .iter()
        .filter_map(|w| match w {
            Warning::PreloadLeak { library, .. } => {
                let lib = &report.libraries[*library];
                debug_assert_eq!(lib.origin, Origin::Preload);
                Some(format!(
                    "  PID {} ({}): {}\n",
                    report.pid,
                    escape_text(&report.comm),
                    escape_text(&lib.path)
                ))
            }
            _ => None,
        })
        .collect()
}
