//! Command line (clap). `--help` is written to teach: each common task has an example.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::engine::{ArgValueCandidates, ArgValueCompleter};

pub mod complete;
mod forgive;
pub mod recording;
pub use forgive::{parse, parse_from};

/// What a command's `--help` says after its options, and the EXAMPLES, EXIT STATUS and further
/// sections of its man page (`cargo xtask gen` renders the same text as roff).
pub struct Epilogue {
    /// One line per task, two spaces in and ending in `:`, each followed by its command lines,
    /// six spaces in. Every line fits 80 columns.
    pub examples: &'static str,
    /// Further notes: `(label in --help, man page section, text)`; the text is one paragraph
    /// (clap and man wrap it).
    pub notes: Option<(&'static str, &'static str, &'static str)>,
    /// The exit status codes and what each means.
    pub exit_status: &'static [(u8, &'static str)],
    /// Where to read more (the last line of `--help`, the man page's SEE ALSO).
    pub see_also: &'static str,
}

/// The exit status codes of `gpu-trace`, `top` and `replay` (docs/cli.md#exit-codes).
pub mod exit {
    pub const SUCCESS: u8 = 0;
    pub const RUNTIME: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const UNSUPPORTED: u8 = 3;
    pub const DROPPED: u8 = 4;
}

const SEE_ALSO: &str = "See docs/cli.md for every option, docs/json-schema.md for the JSON \
    fields, docs/events.md for the events and docs/troubleshooting.md for errors.";

const TRACE_EXIT_STATUS: &[(u8, &str)] = &[
    (exit::SUCCESS, "success"),
    (
        exit::RUNTIME,
        "a runtime error (also a --metrics endpoint that died during the run)",
    ),
    (exit::USAGE, "bad usage"),
    (
        exit::UNSUPPORTED,
        "the kernel or system cannot support tracing (privileges, BTF, hooks)",
    ),
    (
        exit::DROPPED,
        "events were dropped (or output lines: the output's reader lagged)",
    ),
];

/// `gpu-trace`'s exit codes: tracing's, and `-- CMD`'s status passed through.
const MAIN_EXIT_STATUS: &[(u8, &str)] = &[
    (
        exit::SUCCESS,
        "success (with -- CMD: gpu-trace exits with CMD's status instead, 128 + N for a \
         signal N, when CMD ended while traced)",
    ),
    TRACE_EXIT_STATUS[1],
    TRACE_EXIT_STATUS[2],
    TRACE_EXIT_STATUS[3],
    TRACE_EXIT_STATUS[4],
    CANNOT_EXECUTE_STATUS,
    NOT_FOUND_STATUS,
];

/// `-- CMD` that cannot run, as a shell exits (`gpu-trace` and `gpu-trace api`).
const CANNOT_EXECUTE_STATUS: (u8, &str) = (
    crate::launch::CANNOT_EXECUTE,
    "with -- CMD: CMD was found but cannot be executed (a directory, not executable, a bad #! \
     interpreter), said on stderr",
);
const NOT_FOUND_STATUS: (u8, &str) = (
    crate::launch::NOT_FOUND,
    "with -- CMD: CMD was not found (not on PATH, no such file), said on stderr",
);

/// `gpu-trace`'s (tracing's) epilogue.
pub const MAIN_EPILOGUE: Epilogue = Epilogue {
    examples: "  Check what this machine allows (hooks, BTF, LSMs, driver) before tracing:
      sudo gpu-trace doctor
  Trace every process on the default (NVIDIA) driver until Ctrl-C:
      sudo gpu-trace
  Also show work-submit tokens, for one process, for 30 seconds:
      sudo gpu-trace -v --pid 4242 --duration 30
  Start a command, trace it and its children until it exits, exit with its
  status (as root the command runs as root: --user runs it as someone else):
      sudo gpu-trace -- ./train.py --epochs 1
      sudo gpu-trace --user alice --format json -o t.jsonl -- ./train.py
  Only the events on one GPU (nvidia-smi's index, a UUID or a PCI bus id):
      sudo gpu-trace --gpu 1
      gpu-trace replay run.gtrace --gpu 0000:17:00.0
  AMD GPUs: KFD compute and SDMA queues (/dev/kfd); -v adds each doorbell:
      sudo gpu-trace --vendor amd -v
  Only processes whose name is python3, as JSON lines, into a file:
      sudo gpu-trace --comm python3 --format json -o trace.jsonl
  Timestamps in seconds since the first event instead of wall-clock time:
      sudo gpu-trace --timestamps relative
  A timeline for the Perfetto UI (ui.perfetto.dev), next to the usual output:
      sudo gpu-trace --perfetto trace.json
  Record the raw driver calls; replay them later, anywhere, without root, with
  the same output options (-v, --pid, --comm, --format, -o, --perfetto ...):
      sudo gpu-trace --record run.gtrace
      gpu-trace replay run.gtrace -v --perfetto run.json -o run.txt
  Statistics every second while tracing (text: on stderr; JSON: STATS lines):
      sudo gpu-trace --interval 1
  A live view, refreshed every second (per GPU, per process; s sorts, q quits):
      sudo gpu-trace top
  Serve Prometheus metrics on a loopback port while tracing, printing nothing:
      sudo gpu-trace --metrics 127.0.0.1:9464 --quiet
  Refuse GPU scheduling to one process (needs an active BPF LSM; see doctor):
      sudo gpu-trace --deny-pid 4242
  Only one container's GPU work (id prefix from podman/docker/crictl ps), or
  a pod's cgroup:
      sudo gpu-trace --container 3f2a9c1b
      sudo gpu-trace --cgroup /kubepods.slice/kubepods-besteffort.slice
  Refuse GPU scheduling to a whole container, processes it starts later too:
      sudo gpu-trace --deny-container 3f2a9c1b",
    notes: Some((
        "Output",
        "OUTPUT FORMAT",
        "one line per event (TASK_INIT, SCHEDULE, SCHED_UPDATE, WORK_SUBMIT with -v, \
         TASK_DESTROY); SCHED_UPDATE shows every timeslice, interleave, preemption and \
         disable/enable request (old -> new, allowed or not). A field the driver layer cannot \
         know is printed as `?`. A live run first lists, on stderr, the processes that already \
         had a GPU open (late attach): their end prints PRETRACE_END, calls on their old \
         objects carry [pre-trace]; MPS clients' lines carry [shared] and one MPS_SHARED names \
         the server's TSG. On exit (Ctrl-C, SIGTERM, --duration) a statistics block: counts per \
         event, dropped, read_failed, per-process, per-engine and per-task tables (latencies, \
         final timeslice), live TSGs per GPU and runlist; -v adds the kernel side's internal \
         counters.",
    )),
    exit_status: MAIN_EXIT_STATUS,
    see_also: SEE_ALSO,
};

/// `gpu-trace replay`'s epilogue.
pub const REPLAY_EPILOGUE: Epilogue = Epilogue {
    examples: "  Print a recording exactly as the live run printed it (-v if the live run had it):
      gpu-trace replay run.gtrace -v
  The same events as JSON lines, into a file; or only one process:
      gpu-trace replay run.gtrace --format json -o run.jsonl
      gpu-trace replay run.gtrace --pid 4242
  A Perfetto timeline of the recording, without the text output:
      gpu-trace replay run.gtrace --perfetto run.json -o /dev/null
  Step through the recording second by second in top's view:
      gpu-trace replay run.gtrace --top",
    notes: None,
    exit_status: &[
        (exit::SUCCESS, "success"),
        (exit::RUNTIME, "the file cannot be read or decoded"),
        (exit::USAGE, "bad usage"),
        (
            exit::DROPPED,
            "the live run had dropped records (its trailer says so)",
        ),
    ],
    see_also: SEE_ALSO,
};

/// `gpu-trace merge`'s epilogue.
pub const MERGE_EPILOGUE: Epilogue = Epilogue {
    examples: "  The recordings (or flight-recorder dumps) of two nodes on one timeline:
      gpu-trace merge node-a.gtrace node-b.gtrace
  As JSON lines, each with a host key; and a Perfetto timeline of all nodes:
      gpu-trace merge dumps/*.gtrace --format json -o all.jsonl
      gpu-trace merge dumps/*.gtrace --perfetto all.json -o /dev/null",
    notes: Some((
        "Order",
        "ORDER",
        "each recording is replayed as `gpu-trace replay` replays it alone (its own processes, \
         tasks and statistics), and the next record printed is, of the recordings' next \
         records, the earliest in real time (its monotonic time plus its recording's realtime \
         offset); a recording's own records keep their order. Text lines end with host=NAME, \
         JSON lines start with a host key (the recording's host; NAME#2 for a second recording \
         of one host). At the end, each node's statistics, then a table of every node and all \
         together. --pid, --comm and --gpu select on every node.",
    )),
    exit_status: &[
        (exit::SUCCESS, "success"),
        (exit::RUNTIME, "a file cannot be read or decoded"),
        (exit::USAGE, "bad usage"),
        (
            exit::DROPPED,
            "a live run had dropped records, or a recording was cut short",
        ),
    ],
    see_also: SEE_ALSO,
};

/// `gpu-trace top`'s epilogue.
pub const TOP_EPILOGUE: Epilogue = Epilogue {
    examples: "  Every process on the NVIDIA driver:
      sudo gpu-trace top
  Only python3 processes, keeping the events in a file as well:
      sudo gpu-trace top --comm python3 --format json -o trace.jsonl",
    notes: None,
    exit_status: TRACE_EXIT_STATUS,
    see_also: SEE_ALSO,
};

/// `gpu-trace doctor`'s epilogue.
pub const DOCTOR_EPILOGUE: Epilogue = Epilogue {
    examples: "  The table (root: the trials load test programs):
      sudo gpu-trace doctor
  In a script: go on only where tracing works, know whether --deny-pid will:
      sudo gpu-trace doctor --json > doctor.json
      case $? in 0) echo all;; 5) echo no deny;; *) echo none;; esac",
    notes: None,
    exit_status: &[
        (doctor_exit::READY, "tracing and --deny-pid can both work"),
        (exit::USAGE, "bad usage"),
        (doctor_exit::UNSUPPORTED, "tracing cannot work"),
        (doctor_exit::NO_DENY, "tracing can work, --deny-pid cannot"),
    ],
    see_also: "See docs/cli.md#doctor for each row and docs/troubleshooting.md for the fixes.",
};

/// `gpu-trace completions`' epilogue.
pub const COMPLETIONS_EPILOGUE: Epilogue = Epilogue {
    examples: "  bash, for every user:
      gpu-trace completions bash > /etc/bash_completion.d/gpu-trace
  zsh, with ~/.zfunc in $fpath:
      gpu-trace completions zsh > ~/.zfunc/_gpu-trace",
    notes: None,
    exit_status: &[
        (exit::SUCCESS, "success"),
        (exit::RUNTIME, "standard output could not be written"),
        (exit::USAGE, "bad usage (a shell not listed)"),
    ],
    see_also: "See docs/cli.md#man-pages-and-completions.",
};

/// `gpu-trace api`'s epilogue.
pub const API_EPILOGUE: Epilogue = Epilogue {
    examples: "  Which library serves each GPU API call, in every process that maps one:
      sudo gpu-trace api --resolve
  One process, as one JSON object:
      sudo gpu-trace api --resolve --pid 4242 --format json
  Every python3 process, also resolving a symbol of a shim's own:
      sudo gpu-trace api --resolve --comm python3 --probe libshimhip.so:shimInit
  Trace a command from its first call, one line per call, counts at the end:
      sudo gpu-trace api -v -- ./client
  Trace a running process, counts every 5 seconds:
      sudo gpu-trace api --pid 4242 --interval 5",
    notes: Some((
        "Output",
        "OUTPUT FORMAT",
        "per process: its LD_PRELOAD, the libraries in the dynamic linker's binding order \
         (executable, preloads, DT_NEEDED breadth-first), the dlopened ones apart, then each \
         GPU API symbol with the library whose copy the calls reach and the copies behind it \
         (what dlsym(RTLD_NEXT) reaches), and warnings: an interposer that exports an API \
         symbol and looks symbols up with dlsym (it may find itself and recurse), a preloaded \
         shim in a process with no GPU open (an exported LD_PRELOAD leak). Tracing (without \
         --resolve): a table per process, library and symbol (calls, errors, total and mean \
         time, p99 bucket), API_CALL lines with -v, API_RECURSION lines; JSON: \
         docs/json-schema.md.",
    )),
    exit_status: &[
        (
            exit::SUCCESS,
            "success (tracing -- CMD: gpu-trace exits with CMD's status instead)",
        ),
        (
            exit::RUNTIME,
            "a process could not be read (gone, or permission denied: run as root), or tracing \
             could not start (no uprobes, no target mapping a GPU API library)",
        ),
        (
            exit::USAGE,
            "bad usage (a malformed --probe; tracing without --pid, --comm or -- CMD)",
        ),
        CANNOT_EXECUTE_STATUS,
        NOT_FOUND_STATUS,
    ],
    see_also: "See docs/api.md for the output, the JSON object and the symbol table.",
};

/// The epilogue of the subcommand `name` (`None`: of `gpu-trace` itself).
pub fn epilogue(name: Option<&str>) -> Option<&'static Epilogue> {
    Some(match name {
        None => &MAIN_EPILOGUE,
        Some("replay") => &REPLAY_EPILOGUE,
        Some("merge") => &MERGE_EPILOGUE,
        Some("top") => &TOP_EPILOGUE,
        Some("doctor") => &DOCTOR_EPILOGUE,
        Some("completions") => &COMPLETIONS_EPILOGUE,
        Some("api") => &API_EPILOGUE,
        Some(_) => return None,
    })
}

impl Epilogue {
    /// The text `--help` prints after the options.
    pub fn long_help(&self) -> String {
        let mut s = format!("Examples:\n{}\n\n", self.examples);
        if let Some((label, _, text)) = self.notes {
            s += &format!("{label}: {text}\n\n");
        }
        s += "Exit status:\n";
        for (code, meaning) in self.exit_status {
            s += &format!("  {code}  {meaning}\n");
        }
        if std::ptr::eq(self, &MAIN_EPILOGUE) {
            s += "  (doctor's: see gpu-trace doctor --help)\n";
        }
        s + "\n" + self.see_also
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "gpu-trace",
    version,
    about = "Trace how GPU drivers schedule work for Linux processes (eBPF)",
    long_about = "Trace how GPU drivers schedule work for Linux processes.\n\n\
        gpu-trace attaches eBPF programs to the ioctl layer of the GPU driver and prints, for \
        every process, when the driver creates a channel group (TSG), puts it on the runlist, \
        hands out work-submit tokens, and tears it down.",
    after_long_help = MAIN_EPILOGUE.long_help(),
    after_help = "Run `gpu-trace --help` for examples, exit codes and output fields."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// With `-- CMD`: run CMD as this user (name from the password database: its uid, group
    /// and supplementary groups). Without it, CMD runs as gpu-trace's own user, which is root.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "NAME", requires = "launch")]
    #[arg(help_heading = heading::LAUNCH)]
    pub user: Option<String>,

    #[command(flatten)]
    pub trace: TraceArgs,

    /// Start CMD, trace it and its children, exit with its status.
    ///
    /// From its first instruction; stop when it exits (a signal N: 128 + N). Not with --pid; with
    /// --comm, only the command's processes of that name.
    #[arg(last = true, value_name = "CMD", conflicts_with = "pids")]
    pub launch: Vec<std::ffi::OsString>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Decode a --record recording as the live run printed it.
    ///
    /// The same decoding, model and outputs as the live run; no root needed.
    #[command(after_long_help = REPLAY_EPILOGUE.long_help())]
    Replay {
        /// The recording file.
        #[arg(add = ArgValueCompleter::new(complete::recordings()))]
        file: PathBuf,
        /// Step through the recording in `gpu-trace top`'s view: one frame per second of the
        /// recording's own time; n, space or → shows the next second, p plays (a second per
        /// second) or pauses, s sorts, q stops. Events and statistics go only to -o FILE.
        #[arg(long, conflicts_with_all = ["quiet", "interval"])]
        #[arg(display_order = 9)]
        top: bool,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Put several nodes' recordings on one timeline (no root).
    ///
    /// Each replayed as replay would, their events interleaved by real time, each line naming
    /// its node; no root needed.
    #[command(after_long_help = MERGE_EPILOGUE.long_help())]
    Merge {
        /// The recordings, one per node: --record files, --record-rotate pieces,
        /// flight-recorder dumps.
        #[arg(add = ArgValueCompleter::new(complete::recordings()), required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// What this machine allows, per vendor and hook, and why not.
    ///
    /// Each "no" names the fix.
    /// Checks privileges, kernel BTF (vmlinux and per module), tracefs, kprobes, BPF
    /// trampolines, the active LSMs, lockdown, kallsyms and ftrace's function list, the NVIDIA
    /// and AMD KFD drivers (flavour, version, device nodes and majors), tries every hook with a
    /// trivial program and loads gpu-trace's own programs, then detaches everything. Run it as
    /// root.
    #[command(after_long_help = DOCTOR_EPILOGUE.long_help())]
    Doctor {
        /// Print the report as one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A live view, per GPU and per process, refreshed every second.
    ///
    /// Per GPU and per process (container where known): live TSGs / queues by engine,
    /// schedules, refusals and scheduling updates per second, timeslice, the latest TASK_INIT →
    /// SCHEDULE latency, and the tracer's health (drops).
    /// Takes the tracing options that choose what is traced (--pid, --comm, --container,
    /// --vendor, ...); no event lines are printed, so the options that only shape them work
    /// only with -o FILE, and periodic statistics and quiet are refused. Keys: s sorts
    /// (SCHED/s, LIVE, PID); Up/Down, j/k, PgUp/PgDn, Home/End scroll; / filters by pid, comm
    /// or container; ?, h or F1 shows the keys; q / Esc / Ctrl-C quits and gives the terminal
    /// back. Exited processes are dimmed and marked x until --expire. Needs root, like tracing.
    #[command(after_long_help = TOP_EPILOGUE.long_help())]
    Top {
        #[command(flatten)]
        trace: Box<TraceArgs>,
        /// Keep an exited process's row this long (dimmed, marked x), then drop it from the
        /// view (its counts stay in the statistics): seconds or a time like 30s or 2m; 0 keeps
        /// it.
        #[arg(long, value_name = "TIME", default_value_t = gpu_trace_core::output::top::DEFAULT_EXPIRE_S, value_parser = parse_expire, allow_hyphen_values = true)]
        #[arg(display_order = 9)]
        expire: f64,
    },
    /// The GPU API layer: who serves each call, the calls traced.
    ///
    /// Which library serves each GPU API call (CUDA driver, CUDA runtime, HIP) in a process:
    /// the dynamic linker's binding order and whose copy of each symbol wins.
    /// --resolve reads /proc/PID/maps and environ and the mapped ELF files' dynamic sections
    /// and attaches nothing; its targets: --pid, --comm, or every process that maps a library
    /// defining a GPU API symbol. Without --resolve: traces the calls of --pid, --comm or
    /// `-- CMD` with uprobes, counted in the kernel. Run it as root.
    #[command(after_long_help = API_EPILOGUE.long_help())]
    Api(ApiArgs),
    /// Print the shell completion script for SHELL.
    ///
    /// On standard output.
    /// bash: `gpu-trace completions bash > /etc/bash_completion.d/gpu-trace`; zsh: save it as
    /// `_gpu-trace` in a directory of `$fpath`; fish: as
    /// `~/.config/fish/completions/gpu-trace.fish`. The .deb installs all three.
    #[command(after_long_help = COMPLETIONS_EPILOGUE.long_help())]
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// `top --expire`: a time ([`parse_time`]), finite and not negative.
fn parse_expire(s: &str) -> Result<f64, String> {
    match parse_time(s)? {
        v if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "`{s}`: give 0 or more (0 keeps exited processes), e.g. 10, 30s or 2m"
        )),
    }
}

/// `gpu-trace api`'s options.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// Print, per process, the binding order and which library's copy of each GPU API symbol
    /// the calls reach (without it: trace the calls with uprobes).
    #[arg(long)]
    pub resolve: bool,
    /// Only this process (repeat for more).
    #[arg(add = ArgValueCandidates::new(complete::pids), short = 'p', long = "pid", value_name = "PID", value_parser = parse_pid,
          allow_negative_numbers = true)]
    pub pids: Vec<u32>,
    /// Only processes with this name (as the kernel keeps it: 15 bytes).
    #[arg(add = ArgValueCandidates::new(complete::comms), short = 'c', long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Tracing: every process in this cgroup v2 subtree (a path below the cgroup2 mount, or
    /// under it), those that enter it later at the next rescan (repeatable).
    #[arg(hide_short_help = true)]
    #[arg(long = "cgroup", value_name = "PATH", conflicts_with = "resolve")]
    pub cgroups: Vec<String>,
    /// Tracing: every process of this running container (a prefix of ≥ 4 hex digits of its
    /// id, as for the main command's --container), rescanned like --cgroup (repeatable).
    #[arg(add = ArgValueCandidates::new(complete::containers), long = "container", value_name = "ID", conflicts_with = "resolve")]
    pub containers: Vec<String>,
    /// Also resolve SYMBOL, whose real provider is the library LIB (file name or soname;
    /// SYMBOL may hold one `*`). Repeatable.
    #[arg(long = "probe", value_name = "LIB:SYMBOL")]
    pub probes: Vec<String>,
    /// Read more probes from FILE: one LIB:SYMBOL a line, `#` starts a comment.
    #[arg(hide_short_help = true)]
    #[arg(long = "probe-file", value_name = "FILE")]
    pub probe_files: Vec<PathBuf>,
    /// text (one block per process) or json (one object per process and line; docs/api.md).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub format: ApiFormat,
    /// Tracing: print the counts every TIME (seconds, or 500ms, 5s, 1m…) besides at exit, and
    /// rescan the targets' libraries for new ones (dlopen) this often (1 s when not given).
    #[arg(long, value_name = "TIME", value_parser = parse_api_interval, allow_hyphen_values = true)]
    pub interval: Option<f64>,
    /// Tracing: one line per completed call (API_CALL: thread, symbol, library, duration,
    /// return value, depth, the caller's library), ltrace-like.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Tracing: calls open at once on a thread past which API_RECURSION is reported and the
    /// kernel stops keeping them (1 to 16).
    #[arg(hide_short_help = true)]
    #[arg(long = "max-depth", value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=16), allow_negative_numbers = true)]
    pub max_depth: u32,
    /// Tracing: (process, symbol) sums the kernel keeps at once (16384; the entries of
    /// processes that ended are moved out once it is half full; each costs 352 bytes of
    /// kernel memory per CPU). Calls past it are counted as not counted and said at exit.
    #[arg(hide_short_help = true)]
    #[arg(long = "api-sums", value_name = "N", default_value_t = API_SUMS_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=API_SUMS_MAX))]
    pub api_sums: u32,
    /// Tracing: report a call open longer than TIME (seconds, or 500ms, 5s, 1m…; API_STUCK:
    /// thread state, wait channel, system call, user stack), once per call.
    #[arg(long = "stuck-after", value_name = "TIME", default_value_t = 5.0,
          value_parser = parse_api_interval, allow_hyphen_values = true)]
    pub stuck_after: f64,
    /// Tracing: at exit, print on stderr how many times the kernel ran the entry and return
    /// programs (BPF statistics on for the run), the whole cost's count.
    #[arg(hide_short_help = true)]
    #[arg(long = "bpf-stats")]
    pub bpf_stats: bool,
    /// Tracing: lines and tables into FILE, standard output left to CMD.
    ///
    /// FILE is created or emptied before anything is loaded or launched; a FIFO needs its
    /// reader first. Without it, CMD's output and gpu-trace's share one stream.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        conflicts_with = "resolve"
    )]
    pub output: Option<PathBuf>,
    /// Tracing: start CMD with its arguments, trace it from its first call, and exit with its
    /// status.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
}

/// `--api-sums`' default: the kernel programs' own size of the maps.
pub const API_SUMS_DEFAULT: u32 = gpu_trace_common::api::API_SUMS_DEFAULT;
/// `--api-sums`' largest value: the kernel allocates the per-CPU sums up front, 352 bytes per
/// entry and CPU (131 072 entries on 16 CPUs: 738 MiB).
pub const API_SUMS_MAX: i64 = 1 << 17;

/// `api --interval`, `api --stuck-after`: a time ([`parse_time`]) from 0.01 s to a day.
fn parse_api_interval(s: &str) -> Result<f64, String> {
    match parse_time(s)? {
        v if (0.01..=86400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{s}`: give a time from 10ms to 24h (e.g. 1, 500ms, 5s, 2m)"
        )),
    }
}

/// `gpu-trace api --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ApiFormat {
    /// One block per process.
    Text,
    /// One JSON object per process and line.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Vendor {
    /// NVIDIA (open or proprietary kernel module): the RM ioctl layer.
    Nvidia,
    /// AMD KFD compute and SDMA queues (/dev/kfd; the TSG column holds the queue id).
    Amd,
    /// Whichever driver is loaded (NVIDIA when both are).
    Auto,
}

/// `--format` and `--timestamps` take the core's own types (one definition each).
pub use gpu_trace_core::output::{Format, TimestampMode as Timestamps};

/// `--format`'s values: name, help, value.
const FORMATS: &[(&str, &str, Format)] = &[
    ("text", "One aligned line per event", Format::Text),
    (
        "json",
        "One JSON object per line (schema: docs/json-schema.md)",
        Format::Json,
    ),
];

/// `--timestamps`' values: name, help, value.
const TIMESTAMPS: &[(&str, &str, Timestamps)] = &[
    (
        "wall",
        "Local wall-clock time with microseconds",
        Timestamps::Wall,
    ),
    (
        "relative",
        "Seconds since the first event",
        Timestamps::Relative,
    ),
];

/// A parser for one of a core type's `values` (name, help, value), listed in `--help` as
/// `ValueEnum` would list them.
fn choices<T: Copy + Send + Sync + 'static>(
    values: &'static [(&'static str, &'static str, T)],
) -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    PossibleValuesParser::new(
        values
            .iter()
            .map(|&(name, help, _)| PossibleValue::new(name).help(help)),
    )
    .map(move |s| {
        // Clap has checked the name against the same list.
        values
            .iter()
            .find(|(name, ..)| *name == s)
            .map_or(values[0].2, |&(.., v)| v)
    })
}

/// The groups `--help` lists options in, after the everyday ones (no heading: `-p`, `-c`, `-v`,
/// `--format`, `-o`, `-d`, `--interval`, `--vendor`, in that `display_order`). Clap lists the
/// groups in the order their first option is declared, hence the order of `TraceArgs`' fields.
pub mod heading {
    pub const LAUNCH: &str = "Launching a command (-- CMD)";
    pub const OUTPUT: &str = "Output";
    pub const CONTAINERS: &str = "Containers";
    pub const REFUSING: &str = "Refusing GPU work";
    pub const METRICS: &str = "Metrics";
    pub const KERNEL: &str = "Kernel internals";
}

/// Filters and output options shared by live tracing and replay.
#[derive(Clone, Debug, Args)]
pub struct OutputArgs {
    /// Also WORK_SUBMIT events (work-submit tokens).
    ///
    /// The work-submit tokens the driver hands out.
    #[arg(short, long)]
    #[arg(display_order = 3)]
    pub verbose: bool,

    /// Only this process (repeatable).
    ///
    /// Live runs: with exactly one, the kernel filters too, and a PID that does not exist yet is
    /// warned about once and waited for (a process started later with that id is traced).
    #[arg(add = ArgValueCandidates::new(complete::pids), short, long = "pid", value_name = "PID", value_parser = parse_pid,
          allow_negative_numbers = true)]
    #[arg(display_order = 1)]
    pub pids: Vec<u32>,

    /// Only processes or threads named NAME.
    ///
    /// The exact `comm` name; repeatable. The kernel keeps 15 characters of a name: a longer
    /// NAME is cut to its first 15, with a warning.
    #[arg(add = ArgValueCandidates::new(complete::comms), short, long = "comm", value_name = "NAME")]
    #[arg(display_order = 2)]
    pub comms: Vec<String>,

    /// Only this GPU: nvidia-smi index, UUID or bus id.
    ///
    /// Repeatable: its index as nvidia-smi numbers it (0), its UUID (GPU-…) or its PCI bus id
    /// (0000:17:00.0). NVIDIA; an event whose GPU is not known yet (before its task's first
    /// TASK_INIT or WORK_SUBMIT names one) is left out and counted as `gpu_unknown` in the
    /// statistics.
    #[arg(add = ArgValueCandidates::new(complete::gpus), long = "gpu", value_name = "INDEX|UUID|BUS", value_parser = parse_gpu)]
    #[arg(display_order = 2)]
    pub gpus: Vec<String>,

    /// Only processes of this Kubernetes pod: its name (or UID).
    ///
    /// Repeatable. The name the node's kubelet gives the pod (/var/log/pods, or --pods-dir),
    /// as text lines show it (`pod=NAME namespace=NS`), or its UID; a process whose pod is not
    /// named is left out. Filtered in userspace (every process's calls still reach it: for a
    /// kernel filter, --cgroup with the pod's cgroup). Replay names pods only with --pods-dir.
    #[arg(hide_short_help = true)]
    #[arg(add = ArgValueCandidates::new(complete::pod_candidates), long = "pod", value_name = "NAME")]
    #[arg(display_order = 2)]
    pub pods: Vec<String>,

    /// Only processes of pods in this Kubernetes namespace.
    ///
    /// Repeatable; with --pod, both must match. As the node's kubelet names it
    /// (/var/log/pods, or --pods-dir); filtered in userspace, like --pod.
    #[arg(hide_short_help = true)]
    #[arg(add = ArgValueCandidates::new(complete::namespaces), long = "namespace", value_name = "NS")]
    #[arg(display_order = 2)]
    pub namespaces: Vec<String>,

    /// Output format.
    #[arg(long, value_parser = choices(FORMATS), default_value = "text")]
    #[arg(display_order = 4)]
    pub format: Format,

    /// Write events and statistics to FILE.
    ///
    /// Instead of standard output (any --format).
    #[arg(short, long, value_name = "FILE")]
    #[arg(display_order = 5)]
    pub output: Option<PathBuf>,

    /// Also a timeline in FILE for ui.perfetto.dev.
    ///
    /// Chrome JSON trace format: a track group per process, a slice per TSG/queue lifetime with a
    /// point for its TASK_INIT, SCHEDULE, SCHED_UPDATE and WORK_SUBMIT events (always, -v or not;
    /// every field as args) joined by flow arrows, a track group per GPU showing every process's
    /// lifetimes on it, and live-task and schedules-per-second counters per GPU.
    ///
    /// Filters apply.
    #[arg(long, value_name = "FILE")]
    #[arg(help_heading = heading::OUTPUT)]
    pub perfetto: Option<PathBuf>,

    /// Timestamp style of the text output (JSON lines always carry both `time`, UTC wall clock,
    /// and `ts_ns`, CLOCK_MONOTONIC).
    #[arg(hide_short_help = true)]
    #[arg(long, value_parser = choices(TIMESTAMPS), default_value = "wall")]
    #[arg(help_heading = heading::OUTPUT)]
    pub timestamps: Timestamps,

    /// Do not print the statistics block at exit.
    #[arg(hide_short_help = true)]
    #[arg(long)]
    #[arg(help_heading = heading::OUTPUT)]
    pub no_stats: bool,

    /// Also print the statistics so far every TIME (seconds, or 500ms, 5s, 1m…).
    ///
    /// With --format json as a STATS object with "final": false among the events; as text, a
    /// block on standard error, so that the event stream stays one line per event. Replay counts
    /// TIME in the recording's own time.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "TIME", value_parser = positive_seconds, allow_hyphen_values = true)]
    #[arg(display_order = 7)]
    pub interval: Option<f64>,

    /// No events, no statistics; on stderr, warnings only.
    ///
    /// E.g. with --metrics, or with only --perfetto or --record; standard error keeps the
    /// warnings and the line saying tracing started.
    #[arg(short, long, conflicts_with_all = ["output", "interval"])]
    #[arg(help_heading = heading::OUTPUT)]
    pub quiet: bool,

    /// Text output: a `container=` field on every line (`-` outside containers, `?` not known
    /// yet). Without it, only lines of processes in a container or Kubernetes pod carry
    /// `container=ID pod=NAME namespace=NS nspid=N` (each when known; `pod=UID` where the node
    /// does not name the pod). JSON always carries a `cgroup` object.
    #[arg(hide_short_help = true)]
    #[arg(long)]
    #[arg(help_heading = heading::OUTPUT)]
    pub show_container: bool,

    /// The kubelet's pod log directory, which names pods by UID.
    ///
    /// Its `<namespace>_<pod>_<uid>/` directories (docs/fleet.md, "Pods by name"). Live runs
    /// read /var/log/pods without it; replay names pods (text, JSON, --pod, --namespace) only
    /// with it.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "DIR")]
    #[arg(help_heading = heading::OUTPUT)]
    pub pods_dir: Option<PathBuf>,
}

/// The shortest `--interval` accepted, in seconds: statistics more often than 100 times a
/// second are no use to a reader, and a period of 0 (what `1e-10` rounds to) cannot be timed.
pub const MIN_INTERVAL_SECS: f64 = 0.01;

/// The longest `--interval` accepted, in seconds.
pub const MAX_INTERVAL_SECS: f64 = 1e9;

/// `--interval`, `--share-interval`: a time ([`parse_time`]) from [`MIN_INTERVAL_SECS`] to
/// [`MAX_INTERVAL_SECS`].
fn positive_seconds(s: &str) -> Result<f64, String> {
    let v = parse_time(s)?;
    if v.is_finite() && (MIN_INTERVAL_SECS..=MAX_INTERVAL_SECS).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "`{s}` is not a usable interval: give a time from {MIN_INTERVAL_SECS} s to \
             {MAX_INTERVAL_SECS:e} s (e.g. 1, 0.5, 250ms, 1m)"
        ))
    }
}

/// The kernel keeps this many bytes of a thread's name (`TASK_COMM_LEN` 16, with the NUL).
pub const COMM_MAX: usize = 15;

/// `--comm NAME` as the kernel would store it: cut to [`COMM_MAX`] bytes (at a character
/// boundary; the kernel cuts bytes, and a name cut inside a character is shown lossily).
pub fn kernel_comm(name: &str) -> &str {
    if name.len() <= COMM_MAX {
        return name;
    }
    let mut end = COMM_MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl OutputArgs {
    /// Cuts `--comm` names longer than the kernel keeps to what it keeps, so that they match;
    /// returns one warning per name cut.
    pub fn normalize_comms(&mut self) -> Vec<String> {
        let mut warnings = Vec::new();
        for c in &mut self.comms {
            let cut = kernel_comm(c);
            if cut.len() != c.len() {
                warnings.push(format!(
                    "--comm {c:?} is longer than the {COMM_MAX} characters the kernel keeps of a \
                     process name: matching {cut:?} (e.g. nvidia-cuda-mps-server and \
                     nvidia-cuda-mps-control are both \"nvidia-cuda-mps\")"
                ));
                *c = cut.to_string();
            }
        }
        warnings
    }
}

/// `--metrics`: Prometheus metrics while tracing (docs/fleet.md).
#[derive(Clone, Debug, Default, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics.
    ///
    /// E.g. 127.0.0.1:9464 or localhost:9464 (port 0: any free port); `:9464` is every interface
    /// (0.0.0.0:9464), as for Prometheus exporters. A loopback address unless
    /// --metrics-allow-remote.
    #[arg(long = "metrics", value_name = "ADDR", value_parser = parse_metrics_addr)]
    #[arg(help_heading = heading::METRICS)]
    pub addr: Option<std::net::SocketAddr>,

    /// Allow --metrics on a non-loopback address (e.g. 0.0.0.0:9464 in a Kubernetes pod)
    /// without authentication: anyone who can reach it reads process names. Not needed when
    /// --metrics-web-config sets basic_auth_users or --metrics-bearer-token-file is given.
    #[arg(hide_short_help = true)]
    #[arg(long, requires = "addr")]
    #[arg(help_heading = heading::METRICS)]
    pub metrics_allow_remote: bool,

    /// TLS and basic authentication of --metrics, in the Prometheus exporter-toolkit's web
    /// configuration format (YAML): `tls_server_config: {cert_file, key_file}` and
    /// `basic_auth_users: {NAME: BCRYPT_HASH}`.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "FILE", requires = "addr")]
    pub metrics_web_config: Option<std::path::PathBuf>,

    /// Require `Authorization: Bearer TOKEN` on --metrics, the token read from FILE (one line).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "FILE", requires = "addr")]
    pub metrics_bearer_token_file: Option<std::path::PathBuf>,

    /// With --flight-recorder: POST /dump on --metrics dumps the window as SIGUSR1 does, when
    /// it carries `Authorization: Bearer TOKEN`, the token read from FILE (one line).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "FILE", requires_all = ["addr", "flight_recorder"])]
    pub dump_token_file: Option<std::path::PathBuf>,

    /// Take a label set (comm, pod, GPU, engine) out of --metrics once it has counted no event
    /// for TIME and holds no live task (default 5m), freeing its room under the label caps; one
    /// that comes back starts its counters from 0. --api's label sets likewise once their
    /// counters stop growing.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "TIME", value_parser = positive_seconds, requires = "addr")]
    #[arg(help_heading = heading::METRICS)]
    pub metrics_expire: Option<f64>,
}

#[derive(Clone, Debug, Args)]
pub struct TraceArgs {
    /// GPU driver to trace.
    #[arg(long, value_enum, default_value_t = Vendor::Nvidia)]
    #[arg(display_order = 8)]
    pub vendor: Vendor,

    /// Stop after this long (30, 250ms, 5m, 1m30s).
    ///
    /// Counted from attach (default: until Ctrl-C or SIGTERM): seconds (30, 1.5) or with units
    /// (250ms, 90s, 5m, 1m30s, 1h); > 0, at most a year.
    #[arg(short, long, value_name = "TIME", value_parser = parse_duration, allow_hyphen_values = true)]
    #[arg(display_order = 6)]
    pub duration: Option<f64>,

    /// Also the raw driver calls to FILE, for replay.
    ///
    /// `gpu-trace replay FILE` decodes them anywhere, without root.
    #[arg(long, value_name = "FILE")]
    #[arg(help_heading = heading::OUTPUT)]
    pub record: Option<PathBuf>,

    /// Trace only tasks in this cgroup v2 subtree (repeatable, with --container at most 8 in
    /// all): a path below the cgroup2 mount (`/kubepods.slice/…/kubepods-pod<uid>.slice`) or
    /// under it (`/sys/fs/cgroup/machine.slice`). Filtered in the kernel: other processes cost
    /// no records. Cgroups created below it later are included.
    #[arg(hide_short_help = true)]
    #[arg(long = "cgroup", value_name = "PATH")]
    #[arg(help_heading = heading::CONTAINERS)]
    pub cgroups: Vec<String>,

    /// Trace only this running container (repeatable): a prefix of its id.
    ///
    /// A prefix (≥ 4 hex digits) of its id as `podman ps`, `docker ps` or `crictl ps` show it
    /// (docker, containerd, CRI-O, podman; both cgroup drivers). Filtered in the kernel, like
    /// --cgroup.
    #[arg(hide_short_help = true)]
    #[arg(add = ArgValueCandidates::new(complete::containers), long = "container", value_name = "ID")]
    #[arg(help_heading = heading::CONTAINERS)]
    pub containers: Vec<String>,

    /// Refuse the GPU scheduling requests of this process and those it creates (BPF LSM).
    ///
    /// Requests are GPFIFO_SCHEDULE with bEnable, or whose bEnable cannot be read (e.g.
    /// FINN-serialized), from this process, all its threads and every process it creates (also
    /// after it exits) and its descendants alive at start, while gpu-trace runs (repeatable).
    /// Needs a kernel with an active BPF LSM (`bpf` in /sys/kernel/security/lsm); otherwise
    /// gpu-trace stops at start-up and says why. Refused requests show as `SCHEDULE … allowed=no
    /// errno=EPERM`, counted as `denied`.
    #[arg(hide_short_help = true)]
    #[arg(add = ArgValueCandidates::new(complete::pids), long = "deny-pid", value_name = "PID", value_parser = parse_pid,
          allow_negative_numbers = true)]
    #[arg(help_heading = heading::REFUSING)]
    pub deny_pids: Vec<u32>,

    /// Refuse scheduling requests, like --deny-pid, from every task in this cgroup v2 subtree,
    /// including processes that enter it after gpu-trace started (repeatable, at most 8 with
    /// --deny-container). Needs an active BPF LSM.
    #[arg(hide_short_help = true)]
    #[arg(long = "deny-cgroup", value_name = "PATH")]
    #[arg(help_heading = heading::REFUSING)]
    pub deny_cgroups: Vec<String>,

    /// Refuse scheduling requests from every task of this running container (id prefix, as
    /// for --container), including processes it starts later. Needs an active BPF LSM.
    #[arg(hide_short_help = true)]
    #[arg(add = ArgValueCandidates::new(complete::containers), long = "deny-container", value_name = "ID")]
    #[arg(help_heading = heading::REFUSING)]
    pub deny_containers: Vec<String>,

    /// Also the GPU API calls (CUDA, HIP) of the targets.
    ///
    /// The CUDA driver and runtime and HIP calls (`gpu-trace api`'s table) of the --pid/--comm
    /// processes, or of `-- CMD` and the processes it creates (the command from its first call),
    /// with uprobes on every library they map that exports them: each driver event of a thread
    /// inside such a call carries it, innermost first
    /// (text `api=SYMBOL@LIBRARY<CALLER@LIBRARY`; JSON `api`). The targets and
    /// their libraries are looked up again every second (docs/api.md).
    #[arg(long)]
    #[arg(help_heading = heading::OUTPUT)]
    pub api: bool,

    /// With --api: also one API_CALL line per completed traced call (symbol@library, return
    /// value, duration, depth, caller; a slice on the thread's track in --perfetto). Costs a
    /// ring record per call: a launch-bound loop (10⁵ calls/s and more) floods the ring and
    /// drops records (`dropped`); without it the calls are only summed in the kernel
    /// (docs/api.md, Cost). API_RECURSION lines are printed with --api alone.
    #[arg(hide_short_help = true)]
    #[arg(long, requires = "api")]
    #[arg(help_heading = heading::OUTPUT)]
    pub api_calls: bool,

    /// With --api: (process, symbol) sums the kernel keeps at once (16384; the entries of
    /// processes that ended are moved out once it is half full). Calls past it are counted as
    /// not counted (STATS `unreported.api_uncounted`) and said at exit.
    #[arg(hide_short_help = true)]
    #[arg(long = "api-sums", value_name = "N", default_value_t = API_SUMS_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=API_SUMS_MAX), requires = "api")]
    #[arg(help_heading = heading::OUTPUT)]
    pub api_sums: u32,

    /// With --api: report a traced call open longer than TIME (seconds, or 500ms, 5s, 1m…)
    /// as an API_STUCK line (thread state, wait channel, system call, user stack), once per
    /// call, as `gpu-trace api` does; `--dump-on stuck` dumps the flight recorder's window
    /// then.
    #[arg(hide_short_help = true)]
    #[arg(long = "stuck-after", value_name = "TIME", default_value_t = 5.0,
          value_parser = parse_api_interval, allow_hyphen_values = true, requires = "api")]
    #[arg(help_heading = heading::OUTPUT)]
    pub stuck_after: f64,

    #[command(flatten)]
    pub metrics: MetricsArgs,

    /// Ring-buffer size in bytes (power of two, ≥ 4096). Raise it if `dropped` is not 0.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "BYTES", default_value_t = crate::loader::DEFAULT_RING_BYTES,
          value_parser = parse_ring_size, allow_negative_numbers = true)]
    #[arg(help_heading = heading::KERNEL)]
    pub ring_size: u32,

    /// Treat this character device as a device of the traced vendor too: an NVIDIA device, or
    /// /dev/kfd with --vendor amd (experiments and tests; e.g. /dev/null to watch RM- or
    /// KFD-shaped ioctls a test program issues).
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "PATH")]
    #[arg(help_heading = heading::KERNEL)]
    pub watch_device: Option<PathBuf>,

    /// Attach type for the syscall hook (default: the cheapest the kernel allows). For
    /// comparisons and for kernels where the automatic choice misbehaves.
    #[arg(hide_short_help = true)]
    #[arg(long, value_enum, value_name = "TYPE")]
    #[arg(help_heading = heading::KERNEL)]
    pub syscall_hook: Option<crate::loader::SyscallHook>,

    /// Do not attach to the drivers' own functions (the NVIDIA driver's ioctl and release
    /// handlers, AMD KFD functions in amdgpu.ko, the scheduling hooks of a gpu_ext-patched
    /// NVIDIA driver); use the syscall layer only, which runs a program at the exit of every
    /// system call on the machine. By default gpu-trace attaches to the drivers' functions
    /// where the kernel allows it (then unrelated system calls pay nothing), and the start-up
    /// report says which it uses and why not the others.
    #[arg(hide_short_help = true)]
    #[arg(long)]
    #[arg(help_heading = heading::KERNEL)]
    pub no_deep_hooks: bool,

    /// Attach types the deep hooks may use: auto (a trampoline through the module's BTF, else a
    /// kprobe), kprobe, or trampoline. For comparisons, and for kernels where one misbehaves.
    #[arg(hide_short_help = true)]
    #[arg(long, value_enum, value_name = "TYPE", default_value_t = crate::loader::DeepAttach::Auto)]
    #[arg(help_heading = heading::KERNEL)]
    pub deep_attach: crate::loader::DeepAttach,

    /// Count every run of gpu-trace's kernel programs and their run time while tracing, and
    /// print them per program at exit (on stderr): which hooks ran how often, e.g. none for
    /// unrelated system calls with the drivers' own hooks. Turns on the kernel's BPF
    /// statistics (BPF_ENABLE_STATS) while gpu-trace runs, which adds two clock reads to every
    /// run of every BPF program on the machine.
    #[arg(hide_short_help = true)]
    #[arg(long)]
    #[arg(help_heading = heading::KERNEL)]
    pub bpf_stats: bool,

    /// How often to read each process's GPU share from NVML (per-process utilization samples;
    /// NVIDIA only): seconds, or a time like 500ms. The driver keeps only the latest sample per
    /// process (about every 200 ms on an H100), so a period longer than that loses samples and
    /// undercounts the shares: the default is 0.2 s. The shares go to the statistics, JSON
    /// (`GPU_SHARE`), `top`; see docs/events.md.
    #[arg(hide_short_help = true)]
    #[arg(long, value_name = "TIME", value_parser = positive_seconds, default_value_t = 0.2,
          allow_hyphen_values = true)]
    pub share_interval: f64,

    /// Do not sample the processes' GPU share (no NVML calls while tracing).
    #[arg(hide_short_help = true)]
    #[arg(long)]
    pub no_share: bool,

    #[command(flatten)]
    pub output: OutputArgs,

    /// `--record-rotate`, `--flight-recorder` and their options (cli/recording.rs).
    #[command(flatten)]
    pub recording: recording::RecordingArgs,

    /// `gpu-trace -- CMD` (from [`Cli::launch`]): the command to start and trace.
    #[arg(skip)]
    pub launch: Vec<std::ffi::OsString>,

    /// `--user NAME` (from [`Cli::user`]): who the command runs as.
    #[arg(skip)]
    pub launch_user: Option<String>,
}

/// The longest `--duration`: a year (anything longer is a typo, and must fit a `Duration`).
pub const MAX_DURATION_S: f64 = 366.0 * 24.0 * 3600.0;

/// A time as every option that takes one reads it: a bare number is seconds (`30`, `1.5`); a
/// unit may follow a number: `ms`, `s`, `m`, `h` (`250ms`, `90s`, `5m`, `1h`), and several such
/// parts add up, largest unit first (`1m30s`, `1h30m`, `2s500ms`). Returns seconds; a leading
/// `-` makes them negative (each option says which times it takes).
pub fn parse_time(s: &str) -> Result<f64, String> {
    let not_a_time = || {
        format!(
            "`{s}` is not a time: give seconds (30, 0.5) or numbers with units (250ms, 90s, 5m, \
             1m30s, 1h)"
        )
    };
    let t = s.trim();
    let (sign, mut rest) = match t.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, t),
    };
    if rest.is_empty() {
        return Err(not_a_time());
    }
    const UNITS: [(&str, f64); 4] = [("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 0.001)];
    let mut total = 0.0;
    // Units used so far must come in this order, each once.
    let mut next_unit = 0;
    let mut parts = 0;
    while !rest.is_empty() {
        // The number: digits and dots, and an exponent (`1e3`).
        let mut end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let exp = rest[end..]
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e));
        if let Some(e) = exp {
            let digits = e.find(|c: char| !c.is_ascii_digit()).unwrap_or(e.len());
            if digits > 0 {
                end = rest.len() - e.len() + digits;
            }
        }
        let number: f64 = rest[..end]
            .parse()
            .ok()
            .filter(|_| rest[..end].starts_with(|c: char| c.is_ascii_digit() || c == '.'))
            .ok_or_else(not_a_time)?;
        rest = rest[end..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = rest[unit_len..].trim_start();
        parts += 1;
        if unit.is_empty() {
            // A bare number is seconds, alone only (`1m30` is ambiguous).
            if parts > 1 || !rest.is_empty() {
                return Err(not_a_time());
            }
            total += number;
            break;
        }
        let Some(i) = UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(not_a_time());
        };
        if i < next_unit {
            return Err(not_a_time());
        }
        next_unit = i + 1;
        total += number * UNITS[i].1;
    }
    Ok(sign * total)
}

/// `--duration`: a time ([`parse_time`]) > 0, at most [`MAX_DURATION_S`].
fn parse_duration(s: &str) -> Result<f64, String> {
    let d = parse_time(s)?;
    if !d.is_finite() || d <= 0.0 || d > MAX_DURATION_S {
        return Err(format!(
            "`{s}`: the duration must be > 0 and at most {MAX_DURATION_S} seconds (a year); \
             leave --duration out to trace until Ctrl-C"
        ));
    }
    Ok(d)
}

/// `--gpu`: an index, a UUID (`GPU-…`) or a PCI bus id (with or without its domain).
fn parse_gpu(s: &str) -> Result<String, String> {
    let t = s.trim();
    let bus = |b: &str| gpu_trace_core::model::gpus::parse_bus_id(b).is_some();
    let ok = t.parse::<u32>().is_ok()
        || (t.len() > 4 && t.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")))
        || bus(t)
        || (t.matches(':').count() == 1 && bus(&format!("0000:{t}")));
    if ok {
        Ok(t.to_string())
    } else {
        Err(format!(
            "`{s}` names no GPU: give its index as nvidia-smi numbers it (0), its UUID \
             (GPU-…, from nvidia-smi -L) or its PCI bus id (0000:17:00.0)"
        ))
    }
}

/// `--metrics`: `IP:PORT` (`[IPv6]:PORT`), `localhost:PORT` (127.0.0.1, never a name
/// lookup), or `:PORT` (every interface: 0.0.0.0, as Prometheus exporters read it; the loopback
/// rule then asks for --metrics-allow-remote or credentials).
fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{Ipv4Addr, SocketAddr};
    let t = s.trim();
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("`{s}`: `{p}` is not a port (0 to 65535)"))
    };
    if let Some(p) = t.strip_prefix(':') {
        return Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port(p)?)));
    }
    if let Some((host, p)) = t.rsplit_once(':')
        && host.eq_ignore_ascii_case("localhost")
    {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port(p)?)));
    }
    t.parse().map_err(|_| {
        format!(
            "`{s}` is not an address to listen on: give IP:PORT (127.0.0.1:9464, [::1]:9464), \
             localhost:PORT, or :PORT for every interface"
        )
    })
}

/// `--pid`, `--deny-pid`: a process id; 0 is none (the kernel's idle task never calls a driver,
/// and 0 in the kernel filter means "no filter").
fn parse_pid(s: &str) -> Result<u32, String> {
    let pid: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a process id (a number from 1 up)"))?;
    if pid == 0 {
        return Err(
            "0 is not a process id (pid 0 is the kernel's idle task, never a traced \
                    process); give the pid of the process to trace, e.g. from `pgrep NAME`"
                .into(),
        );
    }
    Ok(pid)
}

/// `--ring-size`: a power of two ≥ 4096 bytes.
fn parse_ring_size(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size in bytes (a power of two ≥ 4096)"))?;
    if n < 4096 || !n.is_power_of_two() {
        return Err(format!(
            "{n} is not a power of two ≥ 4096 (e.g. 4096, 65536, 4194304 = the default)"
        ));
    }
    Ok(n)
}

/// The name the binary is installed under (and the completions complete).
pub const BIN_NAME: &str = "gpu-trace";

/// The completion script for `shell`, as `gpu-trace completions SHELL` prints it and the
/// packages install it (`cargo xtask gen`): it registers a function that asks `gpu-trace`
/// itself (on `PATH`) at each TAB, so option values complete from the machine (live PIDs,
/// GPUs, recordings: [`complete`]) and the options are always the binary's own.
pub fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};
    let completer: &dyn EnvCompleter = match shell {
        clap_complete::Shell::Bash => &Bash,
        clap_complete::Shell::Zsh => &Zsh,
        clap_complete::Shell::Fish => &Fish,
        clap_complete::Shell::Elvish => &Elvish,
        clap_complete::Shell::PowerShell => &Powershell,
        _ => &Bash,
    };
    let mut out = Vec::new();
    completer
        .write_registration(complete::VAR, BIN_NAME, BIN_NAME, BIN_NAME, &mut out)
        .expect("writing to a Vec cannot fail");
    if shell == clap_complete::Shell::Zsh {
        // Installed in $fpath as `_gpu-trace`, the file is the body of an autoloaded function
        // that the first TAB runs: it then defines the completer but would offer nothing that
        // first time. Completing at once is what clap_complete's own zsh script does.
        let fpath_name = format!("_{BIN_NAME}");
        let function = format!("_clap_dynamic_completer_{}", BIN_NAME.replace('-', "_"));
        out.extend_from_slice(
            format!(
                "\nif [ \"$funcstack[1]\" = \"{fpath_name}\" ]; then\n    {function} \"$@\"\nfi\n"
            )
            .as_bytes(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_comm_is_cut_to_what_the_kernel_keeps() {
        // TASK_COMM_LEN is 16: 15 bytes and a NUL. /proc/PID/comm of the MPS server
        // (tests/fixtures/h100_late_mps/mps_ps.txt) is "nvidia-cuda-mps".
        assert_eq!(kernel_comm("nvidia-cuda-mps-server"), "nvidia-cuda-mps");
        assert_eq!(kernel_comm("python3"), "python3");
        assert_eq!(kernel_comm("exactly15chars_"), "exactly15chars_");
        // 14 ASCII bytes then a 2-byte character: byte 15 falls inside it.
        assert_eq!(kernel_comm("abcdefghijklmné"), "abcdefghijklmn");
        let cli = Cli::try_parse_from([
            "gpu-trace",
            "--comm",
            "nvidia-cuda-mps-control",
            "--comm",
            "python3",
        ])
        .unwrap();
        let mut out = cli.trace.output;
        let w = out.normalize_comms();
        assert_eq!(out.comms, ["nvidia-cuda-mps", "python3"]);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("\"nvidia-cuda-mps\""), "{}", w[0]);
        assert!(out.normalize_comms().is_empty(), "warned once");
    }

    #[test]
    fn durations_outside_a_year_or_not_finite_are_refused() {
        for bad in ["-1", "0", "nan", "NaN", "inf", "-inf", "1e30", "x", ""] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("0.5"), Ok(0.5));
        assert_eq!(parse_duration("31622400"), Ok(MAX_DURATION_S));
        assert!(parse_duration("31622401").is_err());
        for bad in [
            "0s", "-5m", "infs", "nanh", "5min", "5 d", "m", "ms", "1.5.2s", "8785h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_take_a_unit_and_a_bare_number_is_seconds() {
        for (text, secs) in [
            ("90", 90.0),
            ("1.5", 1.5),
            ("90s", 90.0),
            ("5m", 300.0),
            ("1h", 3600.0),
            ("250ms", 0.25),
            (" 2m ", 120.0),
            ("8784h", MAX_DURATION_S),
        ] {
            assert_eq!(parse_duration(text), Ok(secs), "{text}");
        }
    }

    #[test]
    fn times_add_up_their_parts_largest_unit_first() {
        for (text, secs) in [
            ("1m30s", 90.0),
            ("1h30m", 5400.0),
            ("2s500ms", 2.5),
            ("1h 1m 1s", 3661.0),
            ("1.5m", 90.0),
            ("-1m30s", -90.0),
            ("1e3ms", 1.0),
        ] {
            assert_eq!(parse_time(text), Ok(secs), "{text}");
        }
        for bad in [
            "30s1m", "1m30", "1m1m", "1s1", "-", "--1", "1 x", "m30s", "1e",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_expire("0"), Ok(0.0));
        assert!(parse_expire("-1s").is_err());
        assert_eq!(parse_api_interval("10ms"), Ok(0.01));
        assert!(parse_api_interval("24h1s").is_err());
        assert_eq!(positive_seconds("1m"), Ok(60.0));
    }

    #[test]
    fn metrics_takes_localhost_and_a_bare_port() {
        let addr = |a: &str| {
            Cli::try_parse_from(["gpu-trace", "--metrics", a])
                .map(|c| c.trace.metrics.addr.unwrap().to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(addr("localhost:9464").as_deref(), Ok("127.0.0.1:9464"));
        assert_eq!(addr("LOCALHOST:0").as_deref(), Ok("127.0.0.1:0"));
        assert_eq!(addr(":9464").as_deref(), Ok("0.0.0.0:9464"));
        assert_eq!(addr("127.0.0.1:9464").as_deref(), Ok("127.0.0.1:9464"));
        assert_eq!(addr("[::1]:9464").as_deref(), Ok("[::1]:9464"));
        for bad in [
            "example.com:9464",
            ":99999",
            "localhost:",
            "localhost",
            "9464",
            ":",
        ] {
            assert!(addr(bad).is_err(), "{bad}");
        }
        // The loopback rule is unchanged: every interface needs --metrics-allow-remote.
        let any = "0.0.0.0:9464".parse().unwrap();
        assert!(crate::metrics::server::check_addr(any, false).is_err());
        assert!(crate::metrics::server::check_addr(any, true).is_ok());
    }

    #[test]
    fn pid_zero_and_odd_ring_sizes_are_refused() {
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("-3").is_err());
        assert_eq!(parse_pid("4242"), Ok(4242));
        for bad in ["0", "3", "4095", "4097", "12288", "4294967295"] {
            assert!(parse_ring_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_ring_size("4096"), Ok(4096));
        assert_eq!(parse_ring_size("2147483648"), Ok(1 << 31));
    }
}

/// Exit status of `gpu-trace doctor`.
pub mod doctor_exit {
    /// Tracing and `--deny-pid` can both work.
    pub const READY: u8 = 0;
    /// Tracing cannot work (the same code `gpu-trace` exits with when the system cannot support
    /// it).
    pub const UNSUPPORTED: u8 = 3;
    /// Tracing can work; `--deny-pid` cannot.
    pub const NO_DENY: u8 = 5;
}
