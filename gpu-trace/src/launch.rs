//! Starting a command to trace (`gpu-trace -- CMD`, `gpu-trace api -- CMD`): the child is forked
//! and waits on a pipe until the tracer has attached, so that it is traced from its first
//! instruction; its exit status is passed through (a signal: 128 + N, as shells do).
//!
//! [`Descendants`] follows the processes the command creates, from the kernel's process
//! connector (fork events, read by this process: no kernel program needed), so that the
//! command's children are traced too.

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;

use gpu_trace_core::escape::{decode_lossless, escape_text};

/// Why the command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("starting {cmd}: {source} (check the command's name and PATH)")]
    Spawn { cmd: String, source: std::io::Error },
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
    if cmd.is_empty() {
        return Err(spawn_err(std::io::ErrorKind::InvalidInput.into()));
    }
    if executable_of(&cmd[0]).is_none() {
        return Err(spawn_err(std::io::ErrorKind::NotFound.into()));
    }
    let args: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| spawn_err(std::io::ErrorKind::InvalidInput.into()))?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let gpu_fds = own_gpu_fds();
    let mut fds = [0; 2];
    // SAFETY: a two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    // SAFETY: the child only calls async-signal-safe functions (close, read, setgroups,
    // setgid, setuid, execvp, _exit).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; argv is null-terminated and outlives the call.
        unsafe {
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
                libc::_exit(126);
            }
            libc::execvp(argv[0], argv.as_ptr());
            libc::_exit(127);
        }
    }
    // SAFETY: our own descriptors.
    unsafe { libc::close(fds[0]) };
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

/// The child's exit status (shell style: 128 + signal) once it ended; `None` while it runs.
pub fn reap(pid: u32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: our own child; status is a valid int.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if r != pid as i32 {
        return None;
    }
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}

/// At most this many processes followed (a fork bomb under the command cannot grow the set
/// without bound); past it, new descendants are not traced and [`Descendants::unfollowed`]
/// counts them.
pub const MAX_FOLLOWED: usize = 1 << 20;

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
    /// Descendants not followed ([`MAX_FOLLOWED`]).
    pub unfollowed: u64,
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
        let mut d = Self {
            root: child.pid,
            members: HashSet::from([child.pid]),
            sock: None,
            degraded: None,
            unfollowed: 0,
        };
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

    /// The launched command's process id.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// Whether `tgid` is followed now.
    pub fn contains(&self, tgid: u32) -> bool {
        self.members.contains(&tgid)
    }

    /// The processes followed now: the command and those it created.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().copied().collect()
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
        if self.members.contains(&parent) {
            if self.members.len() >= MAX_FOLLOWED {
                self.unfollowed += 1;
            } else if self.members.insert(child) {
                changes.push(Change::Follow(child));
            }
        } else if child != self.root && self.members.remove(&child) {
            changes.push(Change::Unfollow(child));
        }
        Some(child)
    }

    /// Decides on a process not in the set: the queued fork events first; without the
    /// connector, its parent chain in /proc. Returns the changes (with `tgid`'s own, if it
    /// joined).
    pub fn resolve(&mut self, tgid: u32) -> Vec<Change> {
        let mut changes = self.refresh();
        if self.sock.is_none()
            && !self.members.contains(&tgid)
            && self.members.len() < MAX_FOLLOWED
            && descends_from(tgid, self.root)
        {
            self.members.insert(tgid);
            changes.push(Change::Follow(tgid));
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
