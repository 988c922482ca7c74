//! The one owner of what a traced process controls and gpu-trace reads: its files, its root
//! directory, its `/proc` entries. A traced process may be hostile (any user can run one, in a
//! user namespace with a root of its own), and gpu-trace runs as root, so every such read
//! follows the rules of `docs/reliability.md` ("Threat model"):
//!
//! - a path the process names is opened **inside its root** (`openat2` with
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`: an absolute symlink to `/etc/shadow` resolves
//!   to the process's own `/etc/shadow`, never the host's), or through the `map_files` entry of
//!   the mapping, which is the very file mapped;
//! - it is opened `O_NONBLOCK | O_NOCTTY` and kept only if it is a **regular file** (`fstat`):
//!   a FIFO, a device (`/dev/zero`) or a socket is refused before a byte is read;
//! - each read is **capped in bytes** ([`Limit`]); what goes past a cap is skipped, counted,
//!   and said once;
//! - the work runs on a worker thread with a **deadline** ([`bounded`]): a file that never
//!   answers (a FUSE server that does not reply) costs the target, never the caller's loop,
//!   its signals or its exit;
//! - the kernel is handed the file by this process's own descriptor (`/proc/self/fd/N`,
//!   [`Verified::kernel_path`]), never by a path the process could swap in between.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The caps on what is read of a traced process (bytes), documented in docs/reliability.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// All reads of one ELF file together: headers, dynamic section, dynamic symbols and
    /// their strings (a CUDA library reads a few MB; libtorch's largest tables are far below).
    Elf,
    /// `/proc/PID/maps`: 64 Ki mappings with long paths stay below it.
    Maps,
    /// `/proc/PID/environ` (the kernel caps a process's environment at a few MB).
    Environ,
    /// `/etc/ld.so.preload` in the process's root.
    Preload,
    /// A `--probe-file`.
    ProbeFile,
    /// `DT_NEEDED` entries kept of one ELF file.
    Needed,
}

impl Limit {
    pub const fn bytes(self) -> u64 {
        match self {
            Limit::Elf => 64 << 20,
            Limit::Maps => 16 << 20,
            Limit::Environ => 8 << 20,
            Limit::Preload => 64 << 10,
            Limit::ProbeFile => 1 << 20,
            Limit::Needed => 1024,
        }
    }

    /// How the cap is named in messages.
    pub fn describe(self) -> String {
        match self {
            Limit::Needed => format!("{} DT_NEEDED entries", self.bytes()),
            _ => format!("{} read limit", human(self.bytes())),
        }
    }
}

/// `64 MiB`, `8 KiB`.
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// How long the work on one traced process may take (reading its /proc entries and the
/// libraries it maps), documented in docs/reliability.md.
pub const TARGET_DEADLINE: Duration = Duration::from_secs(5);

/// Why a file a traced process controls was not read.
#[derive(Debug, thiserror::Error)]
pub enum UntrustedError {
    #[error("{what} is {kind}, not a regular file: not read")]
    NotRegular { what: String, kind: &'static str },
    #[error("{what} is larger than the {} (docs/reliability.md): not read", limit.describe())]
    TooLarge { what: String, limit: Limit },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

impl UntrustedError {
    fn io(what: &str, source: io::Error) -> Self {
        UntrustedError::Io {
            what: what.to_string(),
            source,
        }
    }

    /// The underlying system error, if it is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            UntrustedError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A regular file opened without following the traced process's links out of its root, with
/// its identity as `fstat` gave it.
#[derive(Debug)]
pub struct Verified {
    file: File,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

impl Verified {
    /// Checks that `file` is a regular file (`what` names it in the error).
    fn check(file: File, what: &str) -> Result<Self, UntrustedError> {
        let meta = file.metadata().map_err(|e| UntrustedError::io(what, e))?;
        let ft = meta.file_type();
        if !ft.is_file() {
            use std::os::unix::fs::FileTypeExt as _;
            let kind = if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_char_device() {
                "a character device"
            } else if ft.is_block_device() {
                "a block device"
            } else if ft.is_socket() {
                "a socket"
            } else if ft.is_dir() {
                "a directory"
            } else {
                "not a file"
            };
            return Err(UntrustedError::NotRegular {
                what: what.to_string(),
                kind,
            });
        }
        Ok(Self {
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
        })
    }

    /// The file, to read.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A path the kernel resolves to this very file in this process (`/proc/self/fd/N`):
    /// what a uprobe is attached to. Valid while `self` lives.
    pub fn kernel_path(&self) -> String {
        format!("/proc/self/fd/{}", self.file.as_raw_fd())
    }

    /// The whole file, up to `limit` bytes.
    pub fn read_all(&self, what: &str, limit: Limit) -> Result<Vec<u8>, UntrustedError> {
        read_capped(&self.file, what, limit)
    }
}

const OPEN_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// The file of the mapping at `range` (`start-end`) of `pid`, whose path is `path`: through
/// `/proc/PID/map_files/RANGE`, the very file the process mapped (also when deleted or in
/// another mount namespace); where that is refused (no `CAP_SYS_ADMIN`), `path` inside the
/// process's root. Either way a regular file.
pub fn open_mapping(pid: u32, range: &str, path: &str) -> Result<Verified, UntrustedError> {
    open_mapped(pid, range).or_else(|e| match e {
        UntrustedError::Io { .. } => open_in_root(pid, path),
        e => Err(e),
    })
}

/// `/proc/PID/map_files/RANGE` (needs `CAP_SYS_ADMIN`; fails otherwise).
fn open_mapped(pid: u32, range: &str) -> Result<Verified, UntrustedError> {
    let what = format!("/proc/{pid}/map_files/{range}");
    let file =
        open_flags(Path::new(&what), OPEN_FLAGS).map_err(|e| UntrustedError::io(&what, e))?;
    Verified::check(file, &what)
}

/// `path` as `pid` sees it, resolved inside the process's root directory: symlinks (absolute
/// ones included) and `..` never leave it, and `/proc` magic links are refused.
pub fn open_in_root(pid: u32, path: &str) -> Result<Verified, UntrustedError> {
    let what = format!("{path} in the root of process {pid}");
    let root_path = format!("/proc/{pid}/root");
    let root = open_flags(
        Path::new(&root_path),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    )
    .map_err(|e| UntrustedError::io(&what, e))?;
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let c = CString::new(rel)
        .map_err(|_| UntrustedError::io(&what, io::Error::from_raw_os_error(libc::EINVAL)))?;
    // SAFETY: zeroed is a valid open_how; its fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = OPEN_FLAGS as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a valid directory descriptor, a NUL-terminated path and an open_how of the
    // size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &raw const how,
            size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(UntrustedError::io(&what, io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just gave this process.
    let file = unsafe { File::from_raw_fd(fd as libc::c_int) };
    Verified::check(file, &what)
}

/// A file on this machine's own filesystem (an operator's `--probe-file`, a library a
/// command will load): opened without blocking, kept only if it is a regular file.
pub fn open_host(path: &Path) -> Result<Verified, UntrustedError> {
    let what = path.display().to_string();
    let file = open_flags(path, OPEN_FLAGS).map_err(|e| UntrustedError::io(&what, e))?;
    Verified::check(file, &what)
}

fn open_flags(path: &Path, flags: libc::c_int) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave this process.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Reads `r` whole, refusing it past `limit` (one byte more is read to know).
pub fn read_capped(mut r: impl Read, what: &str, limit: Limit) -> Result<Vec<u8>, UntrustedError> {
    let cap = limit.bytes();
    let mut out = Vec::new();
    (&mut r)
        .take(cap + 1)
        .read_to_end(&mut out)
        .map_err(|e| UntrustedError::io(what, e))?;
    if out.len() as u64 > cap {
        return Err(UntrustedError::TooLarge {
            what: what.to_string(),
            limit,
        });
    }
    Ok(out)
}

/// A `/proc` file of a traced process (`maps`, `environ`), read up to `limit`.
pub fn read_proc(path: &str, limit: Limit) -> Result<Vec<u8>, UntrustedError> {
    let file = File::open(path).map_err(|e| UntrustedError::io(path, e))?;
    read_capped(file, path, limit)
}

/// Runs `work` on a worker thread and waits for it until `deadline` has passed or `stop()`
/// says to stop (looked at every 50 ms): `None` then, and the worker is left to finish or
/// block on its own (it is never joined; the process exits without it).
pub fn bounded<T: Send + 'static>(
    deadline: Duration,
    stop: &dyn Fn() -> bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("gpu-trace-read".into())
        .spawn(move || {
            let _ = tx.send(work());
        });
    if spawned.is_err() {
        return None;
    }
    let end = Instant::now() + deadline;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() || stop() {
            return None;
        }
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(v) => return Some(v),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        let c = CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = open_host(&fifo).unwrap_err();
        assert!(
            matches!(err, UntrustedError::NotRegular { kind: "a FIFO", .. }),
            "{err}"
        );
        let err = open_host(Path::new("/dev/zero")).unwrap_err();
        assert!(
            matches!(
                err,
                UntrustedError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn reads_past_the_cap_are_refused() {
        let data = vec![7u8; (Limit::Preload.bytes() + 1) as usize];
        let err = read_capped(&data[..], "x", Limit::Preload).unwrap_err();
        assert!(matches!(
            err,
            UntrustedError::TooLarge {
                limit: Limit::Preload,
                ..
            }
        ));
        let ok = read_capped(&data[1..], "x", Limit::Preload).unwrap();
        assert_eq!(ok.len() as u64, Limit::Preload.bytes());
    }

    #[test]
    fn an_absolute_symlink_resolves_inside_the_root() {
        // This process's root is "/"; a link out of a chroot is tested with one
        // (tests/hostile_targets.rs). A /proc magic link is refused here too.
        let v = open_in_root(std::process::id(), "/proc/self/root/etc/passwd");
        assert!(v.is_err(), "a /proc magic link must be refused: {v:?}");
        let ok = open_in_root(std::process::id(), "/etc/passwd").unwrap();
        assert!(ok.size > 0);
    }

    #[test]
    fn bounded_gives_up_at_the_deadline_and_at_a_stop() {
        let slow = || {
            std::thread::park();
            1
        };
        assert_eq!(bounded(Duration::from_millis(100), &|| false, slow), None);
        assert_eq!(bounded(Duration::from_secs(60), &|| true, slow), None);
        assert_eq!(bounded(Duration::from_secs(60), &|| false, || 2), Some(2));
    }

    #[test]
    fn limits_read_as_people_write_them() {
        assert_eq!(human(Limit::Elf.bytes()), "64 MiB");
        assert_eq!(human(Limit::Preload.bytes()), "64 KiB");
        assert_eq!(human(1000), "1000 bytes");
    }
}
