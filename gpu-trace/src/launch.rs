//! Starting a command to trace (`gpu-trace -- CMD`, `gpu-trace api -- CMD`): the child is forked
//! and waits on a pipe until the tracer has attached, so that it is traced from its first
//! instruction; its exit status is passed through (a signal: 128 + N, as shells do).
//!
//! [`Descendants`] follows the processes the command creates, from the kernel's process
//! connector (fork events, read by this process: no kernel program needed), so that the
//! command's children are traced too.

use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use gpu_trace_core::escape::{decode_lossless, escape_text};

/// Why the command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("starting {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    /// The command cannot be run, as a shell would find: `code` is the shell's exit status for
    /// it, 127 (not found) or 126 (found but cannot be executed).
    #[error("{cmd}: {why}")]
    CannotRun { cmd: String, why: String, code: u8 },
    #[error(
        "--user {name}: {why} (give a user name from /etc/passwd, or leave --user out to run \
         the command as gpu-trace's own user)"
    )]
    User { name: String, why: String },
}

/// The user and groups the command runs as (`--user NAME`), resolved before forking (the
/// child may call only async-signal-safe functions).
#[derive(Clone, Debug)]
pub struct User {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl User {
    /// `name`'s uid, primary gid and supplementary groups (the password database).
    pub fn lookup(name: &str) -> Result<Self, LaunchError> {
        let err = |why: &str| LaunchError::User {
            name: escape_text(name).into_owned(),
            why: why.to_string(),
        };
        let cname = CString::new(name).map_err(|_| err("a user name holds no NUL byte"))?;
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: valid pointers and the buffer's length.
        let r = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if r != 0 || found.is_null() {
            return Err(err("no such user"));
        }
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` holds `n` entries.
        if unsafe { libc::getgrouplist(cname.as_ptr(), pwd.pw_gid, groups.as_mut_ptr(), &mut n) }
            < 0
        {
            return Err(err("the user is in more than 256 groups"));
        }
        groups.truncate(usize::try_from(n).unwrap_or(0));
        Ok(Self {
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            groups,
        })
    }
}

/// A child forked and waiting (on a pipe) to exec the command: [`Launched::release`] lets it
/// go; if this process dies first, the child reads end-of-file and exits 127 without running
/// the command.
pub struct Launched {
    pub pid: u32,
    go: OwnedFd,
}

impl Launched {
    /// Lets the child exec the command (once the tracer is attached).
    pub fn release(self) {
        // SAFETY: our own descriptor; one byte releases the child (closed when `go` drops).
        unsafe { libc::write(self.go.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    }
}

/// Forks a child that waits for [`Launched::release`], then (as `user`, when given) execs
/// `cmd` (its first word looked up on `PATH`).
pub fn fork_waiting(cmd: &[OsString], user: Option<&User>) -> Result<Launched, LaunchError> {
    let shown = cmd.first().map_or_else(String::new, |c| {
        escape_text(&decode_lossless(c.as_bytes())).into_owned()
    });
    let spawn_err = |source| LaunchError::Spawn {
        cmd: shown.clone(),
        source,
    };
    let cannot = |(why, code): (String, u8)| LaunchError::CannotRun {
        cmd: shown.clone(),
        why,
        code,
    };
    let Some(first) = cmd.first() else {
        return Err(cannot((
            "no command after `--` (give the command to start and trace)".into(),
            NOT_FOUND,
        )));
    };
    // Said here, before anything is attached, rather than as a bare exit status later.
    resolve_command(first).map_err(cannot)?;
    let args: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            cannot((
                "an argument holds a NUL byte, which no program can be given".into(),
                CANNOT_EXECUTE,
            ))
        })?;
    // What the child says if exec fails all the same (e.g. as --user, who may not be allowed
    // to run it), made here: the child may only call async-signal-safe functions.
    let exec_failed = format!("gpu-trace: {shown}: cannot run it: ").into_bytes();
    let user_failed: &[u8] = b"gpu-trace: --user: could not switch to the user's groups and ids\n";
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let gpu_fds = own_gpu_fds();
    let mut fds = [0; 2];
    // SAFETY: a two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    // SAFETY: the child only calls async-signal-safe functions (signal, close, read, write,
    // setgroups, setgid, setuid, execvp, _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; argv is null-terminated and outlives the call.
        unsafe {
            // The handlers gpu-trace installed for SIGINT and SIGTERM stay in a forked child
            // until exec: a signal sent to the process group while it waits would be taken for
            // gpu-trace's own stop and leave the command running.
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            libc::close(fds[1]);
            // Not the tracer's own GPU files (NVML's): the waiting child would be listed as a
            // process with a GPU open before tracing, and its exec would end them as
            // PRETRACE_END of the command (seen on the GPU host).
            for &fd in &gpu_fds {
                libc::close(fd);
            }
            let mut b = 0u8;
            // Waits until the parent attached (or died: EOF).
            if libc::read(fds[0], (&raw mut b).cast(), 1) != 1 {
                libc::_exit(127);
            }
            if let Some(u) = user
                && (libc::setgroups(u.groups.len(), u.groups.as_ptr()) != 0
                    || libc::setgid(u.gid) != 0
                    || libc::setuid(u.uid) != 0)
            {
                libc::write(2, user_failed.as_ptr().cast(), user_failed.len());
                libc::_exit(CANNOT_EXECUTE.into());
            }
            libc::execvp(argv[0], argv.as_ptr());
            // As a shell: 127 when nothing was found, 126 when it could not be executed.
            let errno = *libc::__errno_location();
            let why = errno_words(errno);
            libc::write(2, exec_failed.as_ptr().cast(), exec_failed.len());
            libc::write(2, why.as_ptr().cast(), why.len());
            libc::_exit(
                if errno == libc::ENOENT {
                    NOT_FOUND
                } else {
                    CANNOT_EXECUTE
                }
                .into(),
            );
        }
    }
    // SAFETY: our own descriptors.
    unsafe { libc::close(fds[0]) };
    UNREAPED.store(pid as u32, Ordering::SeqCst);
    Ok(Launched {
        pid: pid as u32,
        // SAFETY: the write end, ours alone from here.
        go: unsafe { OwnedFd::from_raw_fd(fds[1]) },
    })
}

/// This process's descriptors that the start-up inventory would count as a GPU open
/// (`probe::inventory::classify_fd_target`): NVML's, opened for the inventory and the share
/// sampler. Read before fork (the child may only call async-signal-safe functions).
fn own_gpu_fds() -> Vec<libc::c_int> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let gpu = crate::probe::inventory::WalkOptions {
        nvidia: true,
        kfd: true,
        ..Default::default()
    };
    dir.flatten()
        .filter_map(|e| {
            let fd: libc::c_int = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            crate::probe::inventory::classify_fd_target(&target.to_string_lossy(), &gpu).map(|_| fd)
        })
        .collect()
}

/// A shell's exit status for a command that was not found.
pub const NOT_FOUND: u8 = 127;
/// A shell's exit status for a command that was found but cannot be executed.
pub const CANNOT_EXECUTE: u8 = 126;

/// `errno` after a failed exec, in words, with a newline (static: said by the forked child).
fn errno_words(errno: libc::c_int) -> &'static [u8] {
    match errno {
        libc::ENOENT => b"no such file, or its interpreter is missing\n",
        libc::EACCES => b"permission denied (not executable for this user)\n",
        libc::ENOEXEC => b"not a program this machine can run (exec format error)\n",
        libc::ETXTBSY => b"the file is open for writing (text file busy)\n",
        libc::E2BIG => b"the argument list is too long\n",
        libc::ENOMEM => b"out of memory\n",
        libc::ELOOP => b"too many symbolic links\n",
        libc::ENAMETOOLONG => b"the name is too long\n",
        libc::EISDIR => b"it is a directory\n",
        _ => b"the kernel refused to execute it\n",
    }
}

/// The program `execvp` would run for `cmd`, or why a shell would refuse it and with which
/// status: not found (127); a directory, not executable, or a script whose `#!` interpreter is
/// missing or not executable (126).
pub fn resolve_command(cmd: &OsStr) -> Result<PathBuf, (String, u8)> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = escape_text(&decode_lossless(cmd.as_bytes())).into_owned();
    let executable = |m: &std::fs::Metadata| m.is_file() && m.permissions().mode() & 0o111 != 0;
    let path = if cmd.as_bytes().contains(&b'/') {
        let path = PathBuf::from(cmd);
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(("no such file (check the path)".into(), NOT_FOUND));
            }
            Err(e) => return Err((io_words(&e), CANNOT_EXECUTE)),
            Ok(m) if m.is_dir() => {
                return Err((
                    "is a directory, not a program (name the program inside it)".into(),
                    CANNOT_EXECUTE,
                ));
            }
            Ok(m) if !executable(&m) => {
                return Err((
                    format!(
                        "permission denied: not executable (chmod +x {shown}, or give it to its \
                         interpreter: -- sh {shown})"
                    ),
                    CANNOT_EXECUTE,
                ));
            }
            Ok(_) => path,
        }
    } else {
        let search = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
        let mut denied = None;
        let found = std::env::split_paths(&search)
            .map(|dir| dir.join(cmd))
            .find(|p| match std::fs::metadata(p) {
                Ok(m) if executable(&m) => true,
                Ok(m) if m.is_file() => {
                    denied.get_or_insert_with(|| p.clone());
                    false
                }
                _ => false,
            });
        match (found, denied) {
            (Some(p), _) => p,
            (None, Some(p)) => {
                return Err((
                    format!(
                        "permission denied: {} is not executable (chmod +x it)",
                        escape_text(&decode_lossless(p.as_os_str().as_bytes()))
                    ),
                    CANNOT_EXECUTE,
                ));
            }
            (None, None) => {
                return Err((
                    "command not found (no such program in any directory of PATH: check the \
                     name, or give its path, e.g. ./NAME)"
                        .into(),
                    NOT_FOUND,
                ));
            }
        }
    };
    check_interpreter(&path)?;
    Ok(path)
}

/// The program a script's `#!` line names (its first word), from the file's first 256 bytes
/// (the kernel reads no more); `None` for a file that is not a script or cannot be read. The one
/// reader of `#!` lines: [`resolve_command`]'s check and the API layer's search for the
/// dynamic linker a script ends up running.
pub fn shebang(path: &Path) -> Option<std::path::PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    let word = line
        .split(|b| b.is_ascii_whitespace())
        .find(|w| !w.is_empty())?;
    Some(std::path::PathBuf::from(OsStr::from_bytes(word)))
}

/// A script's `#!` line names a program that exists and is executable (the kernel's exec
/// would fail with ENOENT or EACCES, which a shell reports as a bad interpreter, 126).
fn check_interpreter(path: &Path) -> Result<(), (String, u8)> {
    use std::os::unix::fs::PermissionsExt as _;
    let Some(interp) = shebang(path) else {
        return Ok(());
    };
    let interp = interp.as_os_str().as_bytes();
    let shown = escape_text(&decode_lossless(interp)).into_owned();
    let bad = |what: &str| {
        Err((
            format!(
                "bad interpreter: its first line, #!{shown}, names {what} (fix that line, or \
                 start the script with an interpreter that exists: -- sh SCRIPT)"
            ),
            CANNOT_EXECUTE,
        ))
    };
    match std::fs::metadata(OsStr::from_bytes(interp)) {
        Err(_) => bad("a program that does not exist"),
        Ok(m) if !m.is_file() || m.permissions().mode() & 0o111 == 0 => {
            bad("a file that is not an executable program")
        }
        Ok(_) => Ok(()),
    }
}

/// An I/O error's words without Rust's `(os error N)`.
fn io_words(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The file `execvp` runs for `cmd`: a path as given (when it exists), else the first match on
/// `PATH`.
pub fn executable_of(cmd: &OsString) -> Option<std::path::PathBuf> {
    let cmd = std::path::Path::new(cmd);
    if cmd.as_os_str().as_bytes().contains(&b'/') {
        return cmd.exists().then(|| cmd.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(cmd))
        .find(|p| p.is_file())
}

/// The command [`fork_waiting`] started last, until [`reap`] collected its status (0: none).
static UNREAPED: AtomicU32 = AtomicU32::new(0);

/// The command this process started and whose exit status nobody collected yet: after a stop
/// (SIGINT, SIGTERM), [`reap_within`] tells whether it ended too.
pub fn unreaped() -> Option<u32> {
    Some(UNREAPED.load(Ordering::SeqCst)).filter(|&p| p != 0)
}

/// How long the end of a run stopped by a signal waits for the command to end as well (a
/// Ctrl-C, or a signal sent to the process group as `timeout` does, reaches it too).
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// [`reap`], waiting up to `grace` for the child to end (polled every 20 ms).
pub fn reap_within(pid: u32, grace: std::time::Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + grace;
    loop {
        if let Some(status) = reap(pid) {
            return Some(status);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The child's exit status (shell style: 128 + signal) once it ended; `None` while it runs.
pub fn reap(pid: u32) -> Option<i32> {
    reap_signaled(pid).map(|(code, _)| code)
}

/// [`reap`], and whether a signal ended it (`true`: the code is 128 + the signal).
pub fn reap_signaled(pid: u32) -> Option<(i32, bool)> {
    let mut status = 0;
    // SAFETY: our own child; status is a valid int.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if r != pid as i32 {
        return None;
    }
    let _ = UNREAPED.compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
    if libc::WIFEXITED(status) {
        Some((libc::WEXITSTATUS(status), false))
    } else if libc::WIFSIGNALED(status) {
        Some((128 + libc::WTERMSIG(status), true))
    } else {
        None
    }
}

/// At most this many processes followed at once (a fork bomb under the command cannot grow the
/// set without bound). At the bound, the members that no longer exist leave the set (once their
/// records are read: [`Descendants::retire`]); only past it with that many alive are new
/// descendants not traced, counted by [`Descendants::unfollowed`].
pub const MAX_FOLLOWED: usize = 1 << 20;

/// Test-only: a lower bound than [`MAX_FOLLOWED`] (debug builds only, what `cargo test` runs;
/// a release build ignores it), so that a test reaches it with a few hundred processes.
pub const MAX_FOLLOWED_ENV: &str = "GPU_TRACE_TEST_MAX_FOLLOWED";

fn max_followed() -> usize {
    crate::test_var(MAX_FOLLOWED_ENV)
        .and_then(|v| v.to_str()?.parse().ok())
        .unwrap_or(MAX_FOLLOWED)
}

/// The ring buffer's consumer and producer positions, read by [`Descendants`] to know when the
/// records of a process that left the set have all been read.
pub type RingPositions = Box<dyn Fn() -> (u64, u64) + Send>;

/// A change in the followed set, for the filter that selects the events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A process created by a followed one: followed from now on.
    Follow(u32),
    /// A process id of the set reused by a process outside it.
    Unfollow(u32),
}

/// The launched command and every process it creates, from the kernel's process connector
/// (`PROC_EVENT_FORK`): a process is created before it can make a driver call, so its fork
/// event is queued before any record of its calls, and reading the queue before deciding on
/// an unknown process is exact. Where the connector is not available (another network or PID
/// namespace, no CONFIG_PROC_EVENTS) or its queue overflowed, the process's parent chain in
/// /proc decides instead (a process that has exited and been reaped by then is missed).
pub struct Descendants {
    root: u32,
    members: HashSet<u32>,
    sock: Option<OwnedFd>,
    /// Why the connector is not (or no longer) exact, said once.
    pub degraded: Option<String>,
    /// Descendants not followed ([`MAX_FOLLOWED`] alive at once).
    pub unfollowed: u64,
    /// The bound ([`MAX_FOLLOWED`]).
    bound: usize,
    /// Members found gone at the bound: still followed until the reader has read the ring buffer
    /// up to `retire_until` (its producer position when they were found gone), since their last
    /// records may still be unread in it.
    retiring: HashSet<u32>,
    retire_until: u64,
    /// `unfollowed` at which the next look for gone members is due (one look per
    /// `bound / 16` refusals while the set stays full of live processes).
    next_sweep: u64,
    ring: Option<RingPositions>,
}

/// How long [`Descendants::launch`] waits for the command's own fork event before it falls
/// back to /proc.
pub const CONNECTOR_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

// The process connector's messages (linux/connector.h, linux/cn_proc.h).
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;
const PROC_EVENT_FORK: u32 = 0x1;

impl Descendants {
    /// Subscribes to fork events, then forks the command ([`fork_waiting`]) and follows it.
    /// The connector is trusted only once the command's own fork event arrived (within
    /// [`CONNECTOR_CHECK`]): in a PID or network namespace other than the initial ones the
    /// kernel accepts the subscription but delivers nothing.
    pub fn launch(cmd: &[OsString], user: Option<&User>) -> Result<(Launched, Self), LaunchError> {
        let sock = subscribe();
        let child = fork_waiting(cmd, user)?;
        let mut d = Self::new(child.pid, max_followed());
        let why = match sock {
            Ok(sock) => {
                d.sock = Some(sock);
                if d.saw_fork_of(child.pid) {
                    return Ok((child, d));
                }
                d.sock = None;
                format!(
                    "the kernel's process connector sent no fork event within {} ms (gpu-trace \
                     runs in a PID or network namespace of its own?)",
                    CONNECTOR_CHECK.as_millis()
                )
            }
            Err(e) => format!("the kernel's process connector is not available ({e})"),
        };
        d.degraded = Some(format!(
            "{why}; the command's children are found from /proc instead (one that exits and is \
             reaped before its records are read is missed)"
        ));
        Ok((child, d))
    }

    fn new(root: u32, bound: usize) -> Self {
        Self {
            root,
            members: HashSet::from([root]),
            sock: None,
            degraded: None,
            unfollowed: 0,
            bound,
            retiring: HashSet::new(),
            retire_until: 0,
            next_sweep: 0,
            ring: None,
        }
    }

    /// The ring buffer's positions (the main trace's reader): a member that exited leaves the
    /// set only once its records have been read. Without them (`gpu-trace api`, which filters
    /// no records by this set) it leaves at once.
    pub fn watch_ring(&mut self, positions: RingPositions) {
        self.ring = Some(positions);
    }

    /// At the bound: the members that no longer exist (never the command) leave the set. With
    /// the ring's positions they are retired first: still followed until [`Self::retire`] sees
    /// the reader past what the ring holds now (at most `bound` retired at once). A look that
    /// frees fewer than `bound / 16` members waits for `bound / 16` refusals before the next
    /// (the cost of a look, one `kill(pid, 0)` per member, stays within 16 per process).
    fn sweep(&mut self, changes: &mut Vec<Change>) {
        if self.unfollowed < self.next_sweep || self.retiring.len() >= self.bound {
            return;
        }
        let root = self.root;
        let gone: Vec<u32> = (self.members.iter().copied())
            .filter(|&p| p != root && !crate::probe::libraries::process_exists(p))
            .collect();
        let enough = (self.bound as u64 / 16).max(1);
        if (gone.len() as u64) < enough {
            self.next_sweep = self.unfollowed + enough;
        }
        for p in &gone {
            self.members.remove(p);
        }
        match &self.ring {
            Some(positions) => {
                self.retire_until = positions().1;
                self.retiring.extend(gone);
            }
            None => {
                changes.extend(gone.into_iter().map(Change::Unfollow));
            }
        }
    }

    /// The retired members leave the set once the reader has read the ring buffer past where
    /// it was when they were last found gone. Returns the changes.
    pub fn retire(&mut self) -> Vec<Change> {
        let read = self
            .ring
            .as_ref()
            .map_or(u64::MAX, |positions| positions().0);
        if self.retiring.is_empty() || read < self.retire_until {
            return Vec::new();
        }
        self.retiring.drain().map(Change::Unfollow).collect()
    }

    /// Whether the set is at its bound, once the retired members whose records were read
    /// have left and the gone ones were looked for.
    fn full(&mut self, changes: &mut Vec<Change>) -> bool {
        if self.members.len() >= self.bound {
            changes.extend(self.retire());
            self.sweep(changes);
        }
        self.members.len() >= self.bound
    }

    /// Reads fork events until `pid`'s own arrives ([`CONNECTOR_CHECK`] at most).
    fn saw_fork_of(&mut self, pid: u32) -> bool {
        let deadline = std::time::Instant::now() + CONNECTOR_CHECK;
        while std::time::Instant::now() < deadline {
            let Some(fd) = self.sock.as_ref().map(|s| s.as_raw_fd()) else {
                return false;
            };
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 20) };
            let mut forked = Vec::new();
            self.refresh_with(|child| forked.push(child));
            if forked.contains(&pid) {
                return true;
            }
        }
        false
    }

    /// The run's end: the processes the command created that were not traced, if any (without
    /// the `gpu-trace:` prefix).
    pub fn unfollowed_warning(&self) -> Option<String> {
        (self.unfollowed > 0).then(|| {
            format!(
                "warning: {} processes the command created were not traced: {} of its processes \
                 were alive at once, the most gpu-trace follows",
                self.unfollowed, self.bound
            )
        })
    }

    /// The launched command's process id.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// Whether `tgid` is followed now.
    pub fn contains(&self, tgid: u32) -> bool {
        self.members.contains(&tgid) || self.retiring.contains(&tgid)
    }

    /// The processes followed now: the command and those it created.
    pub fn pids(&self) -> Vec<u32> {
        (self.members.iter().chain(&self.retiring))
            .copied()
            .collect()
    }

    /// Reads the fork events queued so far; returns the changes to the set.
    pub fn refresh(&mut self) -> Vec<Change> {
        self.refresh_with(|_| {})
    }

    /// [`refresh`](Self::refresh), telling `seen` every new process's id.
    fn refresh_with(&mut self, mut seen: impl FnMut(u32)) -> Vec<Change> {
        let mut changes = Vec::new();
        let Some(sock) = self.sock.as_ref() else {
            return changes;
        };
        let fd = sock.as_raw_fd();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: a valid buffer and its length.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => break,
                    _ => {
                        // ENOBUFS: events were lost; /proc decides from now on.
                        self.degraded = Some(format!(
                            "the process connector lost fork events ({e}); the command's \
                             children are found from /proc from now on"
                        ));
                        self.sock = None;
                        break;
                    }
                }
            }
            if let Some(child) = self.fork_events(&buf[..n as usize], &mut changes) {
                seen(child);
            }
        }
        changes
    }

    /// The fork event of one datagram, into the set; returns the new process's id.
    fn fork_events(&mut self, msg: &[u8], changes: &mut Vec<Change>) -> Option<u32> {
        let word = |at: usize| {
            msg.get(at..at + 4)
                .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])))
        };
        // struct proc_event: what, cpu, timestamp_ns, then the fork's parent_pid, parent_tgid,
        // child_pid, child_tgid.
        let ev = NLMSG_HDR + CN_MSG;
        if word(ev) != Some(PROC_EVENT_FORK) {
            return None;
        }
        let (Some(parent), Some(child_pid), Some(child)) =
            (word(ev + 20), word(ev + 24), word(ev + 28))
        else {
            return None;
        };
        if child_pid != child {
            return None; // a thread
        }
        if self.contains(parent) {
            if self.full(changes) {
                self.unfollowed += 1;
            } else if self.members.insert(child) {
                changes.push(Change::Follow(child));
            }
        } else if child != self.root
            && (self.members.remove(&child) || self.retiring.remove(&child))
        {
            changes.push(Change::Unfollow(child));
        }
        Some(child)
    }

    /// Without the connector (it sent nothing, or lost events): the processes now in /proc
    /// whose parent chain reaches the command, not followed yet, join (the connector's set
    /// otherwise). A process that makes no driver call — an API-only child under `--api` or
    /// `gpu-trace api` — is found only so; called at the rescans (each second), not per record.
    pub fn scan_proc(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        if self.sock.is_some() {
            return changes;
        }
        for pid in crate::probe::libraries::all_pids() {
            if !self.contains(pid) && descends_from(pid, self.root) {
                // Not counted here: it would be again at every scan (`resolve` counts a
                // process whose records are left out).
                if self.full(&mut changes) {
                    break;
                }
                self.members.insert(pid);
                changes.push(Change::Follow(pid));
            }
        }
        changes
    }

    /// Decides on a process not in the set: the queued fork events first; without the
    /// connector, its parent chain in /proc. Returns the changes (with `tgid`'s own, if it
    /// joined).
    pub fn resolve(&mut self, tgid: u32) -> Vec<Change> {
        let mut changes = self.refresh();
        if self.sock.is_none() && !self.contains(tgid) && descends_from(tgid, self.root) {
            if self.full(&mut changes) {
                self.unfollowed += 1;
            } else {
                self.members.insert(tgid);
                changes.push(Change::Follow(tgid));
            }
        }
        changes
    }
}

/// Whether process `pid` descends from `root`, by its parent chain in /proc (at most 4096
/// steps: a chain cannot be longer than the processes alive).
fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..4096 {
        if pid == root {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        match parent_of(pid) {
            Some(p) => pid = p,
            None => return false,
        }
    }
    false
}

/// The parent of process `pid` (`/proc/PID/stat`'s fourth field, after the name in
/// parentheses, which may itself hold `)` and spaces).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[after + 1..]).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// A netlink socket on the process connector, listening (root only).
fn subscribe() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::NETLINK_CONNECTOR,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, ours alone.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_nl is valid; its fields are set below.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = libc::CN_IDX_PROC;
    // SAFETY: a valid address and its length.
    let bound = unsafe {
        libc::bind(
            fd,
            (&raw const addr).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if bound != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // nlmsghdr, cn_msg {idx, val, seq, ack, len, flags}, then PROC_CN_MCAST_LISTEN.
    let mut msg = Vec::with_capacity(NLMSG_HDR + CN_MSG + 4);
    let total = (NLMSG_HDR + CN_MSG + 4) as u32;
    msg.extend_from_slice(&total.to_ne_bytes());
    msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    for v in [libc::CN_IDX_PROC, libc::CN_VAL_PROC, 0, 0] {
        msg.extend_from_slice(&v.to_ne_bytes());
    }
    msg.extend_from_slice(&4u16.to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&libc::PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: a valid buffer and its length.
    let sent = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process connector datagram of one fork: `parent` (a process) created `child`.
    fn fork(parent: u32, child: u32) -> Vec<u8> {
        let mut msg = vec![0u8; NLMSG_HDR + CN_MSG + 32];
        let ev = NLMSG_HDR + CN_MSG;
        let mut put = |at: usize, v: u32| msg[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        put(ev, PROC_EVENT_FORK);
        put(ev + 16, parent);
        put(ev + 20, parent);
        put(ev + 24, child);
        put(ev + 28, child);
        msg
    }

    /// Pids of processes that existed and are gone (spawned, exited, reaped).
    fn gone_pids(n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                let mut c = std::process::Command::new("true").spawn().unwrap();
                c.wait().unwrap();
                c.id()
            })
            .collect()
    }

    /// At the bound with every member alive, a new descendant is not followed and is counted
    /// (the run's end says so and `unfollowed` shows it); below it, followed.
    #[test]
    fn descendants_past_the_bound_of_live_ones_are_counted_not_followed() {
        let own = std::process::id();
        let mut d = Descendants::new(own, 3);
        let mut changes = Vec::new();
        assert_eq!(d.fork_events(&fork(own, 1), &mut changes), Some(1));
        assert_eq!(changes, [Change::Follow(1)]);
        // SAFETY: getppid has no preconditions.
        d.members.insert(unsafe { libc::getppid() } as u32);
        changes.clear();
        d.fork_events(&fork(1, 5), &mut changes);
        d.fork_events(&fork(own, 6), &mut changes);
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(d.unfollowed, 2);
        assert!(!d.contains(5) && !d.contains(6));
    }

    /// At the bound, the members that exited leave the set (never the command) and the new
    /// descendant is followed; without the ring's positions, at once.
    #[test]
    fn at_the_bound_members_that_exited_leave_the_set() {
        let own = std::process::id();
        let mut d = Descendants::new(own, 3);
        let gone = gone_pids(2);
        d.members.extend(&gone);
        let mut changes = Vec::new();
        d.fork_events(&fork(own, 7), &mut changes);
        assert!(changes.contains(&Change::Follow(7)), "{changes:?}");
        for p in &gone {
            assert!(changes.contains(&Change::Unfollow(*p)), "{changes:?}");
            assert!(!d.contains(*p));
        }
        assert_eq!(d.unfollowed, 0);
        assert!(d.contains(own) && d.contains(7));
    }

    /// With the ring's positions, the members found gone stay followed until the reader has
    /// read the ring past its producer position of that moment: their last records may still
    /// be in it.
    #[test]
    fn members_that_exited_are_followed_until_their_records_are_read() {
        use std::sync::{
            Arc,
            atomic::{AtomicU64, Ordering},
        };
        let own = std::process::id();
        let mut d = Descendants::new(own, 3);
        let (consumer, producer) = (Arc::new(AtomicU64::new(40)), Arc::new(AtomicU64::new(100)));
        let (c, p) = (consumer.clone(), producer.clone());
        d.watch_ring(Box::new(move || {
            (c.load(Ordering::SeqCst), p.load(Ordering::SeqCst))
        }));
        let gone = gone_pids(2);
        d.members.extend(&gone);
        let mut changes = Vec::new();
        d.fork_events(&fork(own, 7), &mut changes);
        assert_eq!(changes, [Change::Follow(7)]);
        assert!(
            gone.iter().all(|p| d.contains(*p)),
            "retired, still followed"
        );
        producer.store(500, Ordering::SeqCst);
        consumer.store(99, Ordering::SeqCst);
        assert!(d.retire().is_empty(), "records below 100 may be unread");
        assert!(gone.iter().all(|p| d.contains(*p)));
        consumer.store(100, Ordering::SeqCst);
        let left = d.retire();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(
            gone.iter()
                .all(|p| !d.contains(*p) && left.contains(&Change::Unfollow(*p)))
        );
        assert!(d.retire().is_empty());
    }

    /// Without the connector, the processes the command created are found in /proc: a child
    /// of this test process (the root here) that makes no record joins at the scan, once.
    #[test]
    fn without_the_connector_children_are_found_in_proc() {
        let own = std::process::id();
        let mut d = Descendants::new(own, MAX_FOLLOWED);
        d.degraded = Some("test".into());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let changes = d.scan_proc();
        let _ = child.kill();
        let _ = child.wait();
        assert!(changes.contains(&Change::Follow(child.id())), "{changes:?}");
        assert!(d.contains(child.id()));
        assert!(!d.scan_proc().contains(&Change::Follow(child.id())));
    }
}
