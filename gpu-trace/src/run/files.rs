//! Output files: never the input or another output, FIFOs opened without hanging, and a
//! Perfetto timeline that appears only complete.
//!
//! - [`check_distinct`]: an output that is the input (`replay v.gtrace -o v.gtrace`) or another
//!   output (`--record F -o F`) is refused before anything is opened or attached. Existing files
//!   are compared by device and inode (so links and `./x` vs `x` are caught); files that do not
//!   exist yet by their canonical path. Character devices (`/dev/null`) may be shared.
//! - [`open_for_writing`]: a FIFO is opened with `O_NONBLOCK` first, so that a FIFO nobody reads
//!   does not hang the start-up; the caller decides how long to wait for a reader.
//! - [`open_untouched`]: an output opened (created if absent) without truncating it, so that a
//!   run that fails to start after opening its outputs leaves an existing file's bytes as they
//!   were; [`Untouched::commit`] empties it once every start-up check passed, and a file the
//!   open created is removed again when dropped uncommitted.
//! - [`Staged`]: a regular file written without a name (`O_TMPFILE`) in the target's directory,
//!   given a name and renamed over the target only when complete (`--perfetto`: a JSON document
//!   is valid only when closed). Dropped without [`Staged::commit`], or killed, it leaves
//!   nothing. Where the filesystem has no `O_TMPFILE`, it is written as
//!   `.NAME.gpu-trace-PID.partial`, locked (`flock`) while its writer lives; the next
//!   [`Staged::create`] for the same target removes such files whose writer is gone.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

#[derive(Debug, PartialEq, Eq)]
enum Identity {
    Inode(u64, u64),
    NotYet(PathBuf),
}

/// What identifies `path` as a file, or `None` when it may be shared (a character device).
fn identity(path: &Path) -> io::Result<Option<Identity>> {
    match fs::metadata(path) {
        Ok(m) if m.file_type().is_char_device() => Ok(None),
        Ok(m) => Ok(Some(Identity::Inode(m.dev(), m.ino()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let name = path.file_name().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "the path names no file")
            })?;
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let dir = fs::canonicalize(parent)?;
            Ok(Some(Identity::NotYet(dir.join(name))))
        }
        Err(e) => Err(e),
    }
}

/// Refuses an output that is an input or another output, or a directory. `inputs` and `outputs` are `(option, path)` pairs, e.g.
/// `("--perfetto", path)`; the error names both.
pub fn check_distinct(inputs: &[(&str, &Path)], outputs: &[(&str, &Path)]) -> Result<(), String> {
    let mut seen: Vec<(&str, &Path, Identity, bool)> = Vec::new();
    for (is_input, list) in [(true, inputs), (false, outputs)] {
        for &(what, path) in list {
            if !is_input && fs::metadata(path).is_ok_and(|m| m.is_dir()) {
                return Err(format!(
                    "{what} {}: is a directory; name a file in it to write",
                    path.display()
                ));
            }
            let id = identity(path).map_err(|e| {
                format!(
                    "{what} {}: {e}; name a file in an existing directory",
                    path.display()
                )
            })?;
            let Some(id) = id else { continue };
            if let Some((other, other_path, _, other_input)) =
                seen.iter().find(|(_, _, seen_id, _)| *seen_id == id)
            {
                let role = if *other_input { "input" } else { "output" };
                return Err(format!(
                    "{what} {} is the same file as the {role} {other} {}: it would be \
                     overwritten; write to another file",
                    path.display(),
                    other_path.display()
                ));
            }
            seen.push((what, path, id, is_input));
        }
    }
    Ok(())
}

/// Opens (creating or truncating) an output file. A FIFO is opened non-blocking: with no reader
/// this fails at once with `ENXIO` (see [`is_no_reader`]) instead of hanging; once open, the
/// FIFO is switched back to blocking writes.
pub fn open_for_writing(path: &Path) -> io::Result<File> {
    let fifo = fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    if !fifo {
        return File::create(path);
    }
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    set_blocking(&file)?;
    Ok(file)
}

/// An output opened by [`open_untouched`]: its old contents are still there until
/// [`Untouched::commit`].
pub struct Untouched {
    file: File,
    path: PathBuf,
    created: bool,
    committed: bool,
}

/// Opens an output for writing without truncating it (creating it when absent; a FIFO as
/// [`open_for_writing`] does). The run's start-up checks come after; only
/// [`Untouched::commit`] empties an existing regular file.
pub fn open_untouched(path: &Path) -> io::Result<Untouched> {
    let fifo = fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
    if fifo {
        return Ok(Untouched {
            file: open_for_writing(path)?,
            path: path.to_path_buf(),
            created: false,
            committed: false,
        });
    }
    let created = OpenOptions::new().write(true).create_new(true).open(path);
    let (file, created) = match created {
        Ok(f) => (f, true),
        // An existing file, or a symbolic link (O_EXCL never follows one; a dangling link's
        // target is created here, as File::create would, and left in place).
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => (
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?,
            false,
        ),
        Err(e) => return Err(e),
    };
    Ok(Untouched {
        file,
        path: path.to_path_buf(),
        created,
        committed: false,
    })
}

impl Untouched {
    /// Another handle on the same open file (same offset), for the writer.
    pub fn writer(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Every start-up check passed: an existing regular file is emptied (writes start at offset
    /// 0, as nothing was written yet), and the file stays when this is dropped.
    pub fn commit(&mut self) -> io::Result<()> {
        if self.file.metadata()?.is_file() {
            self.file.set_len(0)?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Untouched {
    fn drop(&mut self) {
        if self.created && !self.committed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Opens a recording for reading. A FIFO is opened non-blocking (no hang before a writer
/// comes), then waits for data with a message on standard error if none is there yet.
pub fn open_for_reading(path: &Path) -> io::Result<File> {
    let meta = fs::metadata(path)?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !meta.file_type().is_fifo() {
        return File::open(path);
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    set_blocking(&file)?;
    if !wait_readable(&file, 0)? {
        crate::say!(
            "gpu-trace: waiting for a writer on the FIFO {} (Ctrl-C to give up)",
            path.display()
        );
        wait_readable(&file, -1)?;
    }
    Ok(file)
}

/// poll(2) for input (or the writer's hang-up) within `timeout_ms` (-1: no limit).
fn wait_readable(file: &File, timeout_ms: i32) -> io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn set_blocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a valid fd we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The error of opening a FIFO that nobody reads.
pub fn is_no_reader(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENXIO)
}

/// A file written without a name (or under a temporary one) and renamed over `target` when
/// complete (regular files and files that do not exist yet); written in place when `target` is a
/// device or a FIFO.
pub struct Staged {
    file: File,
    target: PathBuf,
    temp: Option<Temp>,
}

/// Where a staged file's bytes are until [`Staged::commit`].
enum Temp {
    /// `O_TMPFILE`: no name at all (a killed run leaves nothing); linked under `partial` and
    /// renamed over the target at commit.
    Unnamed { partial: PathBuf },
    /// Named `partial` from the start, locked with `flock` while this process lives.
    Named { partial: PathBuf },
}

/// `.NAME.gpu-trace-` — the prefix of a target's temporary names (`PID.partial` follows).
fn partial_prefix(target: &Path) -> io::Result<std::ffi::OsString> {
    let name = target
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".gpu-trace-");
    Ok(prefix)
}

fn dir_of(target: &Path) -> &Path {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: whether the lock was taken (`false`: another open file holds it).
fn try_lock(file: &File) -> io::Result<bool> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: flock on a valid fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Removes `.NAME.gpu-trace-PID.partial` files left next to `target` by runs that died without
/// cleaning up (SIGKILL, a crash): only those whose PID is not a live process here and whose
/// lock nobody holds (a live writer in another PID namespace holds its lock). Returns what was
/// removed.
pub fn remove_stale_partials(target: &Path) -> io::Result<Vec<PathBuf>> {
    let prefix = partial_prefix(target)?;
    let prefix = prefix.as_encoded_bytes();
    let mut removed = Vec::new();
    for entry in fs::read_dir(dir_of(target))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(rest) = name.as_encoded_bytes().strip_prefix(prefix) else {
            continue;
        };
        let Some(pid) = rest
            .strip_suffix(b".partial")
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        // Only plain files: never follow a link someone else planted.
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let Ok(file) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        else {
            continue;
        };
        if try_lock(&file)? && fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Gives the open, unnamed file `file` the name `name` (`linkat` through `/proc/self/fd`, else
/// `AT_EMPTY_PATH`, which needs CAP_DAC_READ_SEARCH).
fn link_unnamed(file: &File, name: &Path) -> io::Result<()> {
    use std::os::{fd::AsRawFd as _, unix::ffi::OsStrExt as _};
    let fd = file.as_raw_fd();
    let to = std::ffi::CString::new(name.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let proc_path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    // SAFETY: NUL-terminated paths; fd is open.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let first = io::Error::last_os_error();
    // SAFETY: as above, an empty path with AT_EMPTY_PATH names fd itself.
    let rc = unsafe {
        libc::linkat(
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if rc == 0 { Ok(()) } else { Err(first) }
}

impl Staged {
    /// `target` is a device or a FIFO: written in place (see [`Staged::in_place`]).
    pub fn is_special(target: &Path) -> bool {
        fs::metadata(target).is_ok_and(|m| !m.is_file())
    }

    /// Writes to `file`, opened on a device or FIFO `target`, directly.
    pub fn in_place(file: File, target: &Path) -> Self {
        Self {
            file,
            target: target.to_path_buf(),
            temp: None,
        }
    }

    /// Creates the file that will take `target`'s name (or opens `target` itself when it is not
    /// a regular file): unnamed where the filesystem allows it, else a locked temporary name in
    /// the same directory. Stale temporary files of dead runs for the same target go first.
    pub fn create(target: &Path) -> io::Result<Self> {
        Self::create_with(target, true)
    }

    fn create_with(target: &Path, unnamed: bool) -> io::Result<Self> {
        if Self::is_special(target) {
            return Ok(Self::in_place(open_for_writing(target)?, target));
        }
        let mut partial_name = partial_prefix(target)?;
        partial_name.push(format!("{}.partial", std::process::id()));
        let partial = target.with_file_name(partial_name);
        // A leftover we cannot remove is no reason to refuse the run.
        let _ = remove_stale_partials(target);
        if unnamed && let Some(file) = Self::unnamed(target) {
            return Ok(Self {
                file,
                target: target.to_path_buf(),
                temp: Some(Temp::Unnamed { partial }),
            });
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&partial)?;
        try_lock(&file)?;
        Ok(Self {
            file,
            target: target.to_path_buf(),
            temp: Some(Temp::Named { partial }),
        })
    }

    /// An `O_TMPFILE` file in `target`'s directory (`None`: the filesystem has none). Opened
    /// for reading too, so that [`Staged::commit`] can copy it where it cannot be linked.
    fn unnamed(target: &Path) -> Option<File> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o644)
            .open(dir_of(target))
            .ok()?;
        try_lock(&file).ok()?;
        Some(file)
    }

    /// Written under a temporary name or none (the target is replaced only by
    /// [`Staged::commit`]).
    pub fn is_staged(&self) -> bool {
        self.temp.is_some()
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The complete file takes the target's name.
    pub fn commit(mut self) -> io::Result<()> {
        let partial = match self.temp.take() {
            None => return Ok(()),
            Some(Temp::Named { partial }) => partial,
            Some(Temp::Unnamed { partial }) => {
                self.file.sync_data().ok();
                // A name left by an earlier process with this PID is ours to replace.
                let _ = fs::remove_file(&partial);
                if link_unnamed(&self.file, &partial).is_err() {
                    // No /proc and no CAP_DAC_READ_SEARCH: a copy under the temporary name.
                    let mut named = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o644)
                        .open(&partial)?;
                    let mut from = &self.file;
                    io::Seek::seek(&mut from, io::SeekFrom::Start(0))?;
                    if let Err(e) = io::copy(&mut from, &mut named) {
                        let _ = fs::remove_file(&partial);
                        return Err(e);
                    }
                }
                partial
            }
        };
        self.file.sync_data().ok();
        if let Err(e) = fs::rename(&partial, &self.target) {
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(Temp::Named { partial }) = self.temp.take() {
            let _ = fs::remove_file(partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, removed when the returned guard drops.
    fn dir() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        (t, d)
    }

    #[test]
    fn the_same_file_under_other_names_is_refused() {
        let (_scratch, d) = dir();
        let a = d.join("a.gtrace");
        fs::write(&a, b"x").unwrap();
        fs::hard_link(&a, d.join("hard")).unwrap();
        std::os::unix::fs::symlink(&a, d.join("soft")).unwrap();
        for other in [
            a.clone(),
            d.join("hard"),
            d.join("soft"),
            d.join(".").join("a.gtrace"),
        ] {
            let err = check_distinct(&[("replay", &a)], &[("-o", &other)]).unwrap_err();
            assert!(err.contains("same file as the input replay"), "{err}");
        }
        // Two outputs that do not exist yet, named differently.
        let new = d.join("new.json");
        let err = check_distinct(
            &[],
            &[("-o", &new), ("--perfetto", &d.join("sub/../new.json"))],
        );
        // `sub` does not exist: canonicalizing the parent fails, which is an error too.
        assert!(err.is_err());
        fs::create_dir(d.join("sub")).unwrap();
        let err = check_distinct(
            &[],
            &[("-o", &new), ("--perfetto", &d.join("sub/../new.json"))],
        )
        .unwrap_err();
        assert!(err.contains("same file as the output -o"), "{err}");
        // Distinct files, and /dev/null twice, are fine.
        check_distinct(
            &[("replay", &a)],
            &[
                ("-o", Path::new("/dev/null")),
                ("--perfetto", Path::new("/dev/null")),
                ("--record", &new),
            ],
        )
        .unwrap();
    }

    #[test]
    fn staged_files_appear_only_when_committed() {
        for unnamed in [true, false] {
            let (_scratch, d) = dir();
            let target = d.join("t.json");
            fs::write(&target, b"old").unwrap();
            {
                let s = Staged::create_with(&target, unnamed).unwrap();
                io::Write::write_all(&mut s.file(), b"half").unwrap();
            }
            assert_eq!(
                fs::read(&target).unwrap(),
                b"old",
                "dropped: target untouched"
            );
            assert_eq!(
                fs::read_dir(&d).unwrap().count(),
                1,
                "no temporary file left"
            );
            let s = Staged::create_with(&target, unnamed).unwrap();
            if unnamed {
                assert!(
                    matches!(s.temp, Some(Temp::Unnamed { .. })),
                    "tmpfs and ext4 have O_TMPFILE"
                );
                assert_eq!(
                    fs::read_dir(&d).unwrap().count(),
                    1,
                    "no name while written"
                );
            }
            io::Write::write_all(&mut s.file(), b"new").unwrap();
            s.commit().unwrap();
            assert_eq!(fs::read(&target).unwrap(), b"new");
            assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        }
    }

    /// The PID of a process that has exited (and was reaped).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn stale_partials_of_dead_unlocked_runs_are_removed_at_the_next_start() {
        let (_scratch, d) = dir();
        let target = d.join("t.json");
        let dead = dead_pid();
        let stale = d.join(format!(".t.json.gpu-trace-{dead}.partial"));
        // pid 1 is alive: its file stays (it may be writing).
        let alive = d.join(".t.json.gpu-trace-1.partial");
        // Another target's leftovers are not this run's business.
        let other = d.join(format!(".u.json.gpu-trace-{dead}.partial"));
        for f in [&stale, &alive, &other] {
            fs::write(f, b"half").unwrap();
        }
        // A writer in another PID namespace (its PID means nothing here) holds its lock.
        let locked = d.join(format!(".t.json.gpu-trace-{}.partial", dead_pid()));
        fs::write(&locked, b"half").unwrap();
        let holder = File::open(&locked).unwrap();
        assert!(try_lock(&holder).unwrap());
        let s = Staged::create(&target).unwrap();
        assert!(!stale.exists(), "the dead run's temporary file is removed");
        for kept in [&alive, &other, &locked] {
            assert!(kept.exists(), "{} kept", kept.display());
        }
        s.commit().unwrap();
        // The fallback's own file is locked while it lives, so no other run removes it.
        let s = Staged::create_with(&d.join("v.json"), false).unwrap();
        let Some(Temp::Named { partial }) = &s.temp else {
            panic!("named")
        };
        assert!(!try_lock(&File::open(partial).unwrap()).unwrap());
    }

    #[test]
    fn untouched_outputs_keep_their_bytes_until_committed() {
        let (_scratch, d) = dir();
        let old = d.join("old.txt");
        fs::write(&old, b"yesterday").unwrap();
        let new = d.join("new.txt");
        {
            let a = open_untouched(&old).unwrap();
            let _b = open_untouched(&new).unwrap();
            assert!(new.exists());
            drop(a.writer().unwrap());
        }
        assert_eq!(fs::read(&old).unwrap(), b"yesterday", "a failed start");
        assert!(!new.exists(), "a file it created is removed again");
        // A dangling symbolic link: its target is created, as File::create does.
        let link = d.join("link");
        std::os::unix::fs::symlink(d.join("target.txt"), &link).unwrap();
        drop(open_untouched(&link).unwrap());
        assert!(d.join("target.txt").exists());
        let mut a = open_untouched(&old).unwrap();
        let mut b = open_untouched(&new).unwrap();
        a.commit().unwrap();
        b.commit().unwrap();
        io::Write::write_all(&mut a.writer().unwrap(), b"today").unwrap();
        drop((a, b));
        assert_eq!(fs::read(&old).unwrap(), b"today");
        assert_eq!(fs::read(&new).unwrap(), b"");
    }

    #[test]
    fn a_fifo_without_reader_fails_at_once() {
        let (_scratch, d) = dir();
        let f = d.join("f");
        let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = open_for_writing(&f).unwrap_err();
        assert!(is_no_reader(&err), "{err}");
    }
}
