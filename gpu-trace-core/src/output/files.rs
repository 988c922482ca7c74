//! Output files: never the input or another output, FIFOs opened without hanging, and a
//! Perfetto timeline that appears only complete.
//!
//! - [`check_distinct`]: an output that is the input (`replay v.gtrace -o v.gtrace`) or another
//!   output (`--record F -o F`) is refused before anything is opened or attached. Existing files
//!   are compared by device and inode (so links and `./x` vs `x` are caught); files that do not
//!   exist yet by their canonical path. Character devices (`/dev/null`) may be shared.
//! - [`open_for_writing`]: a FIFO is opened with `O_NONBLOCK` first, so that a FIFO nobody reads
//!   does not hang the start-up; the caller decides how long to wait for a reader.
//! - [`Staged`]: a regular file written under a temporary name in the same directory and
//!   renamed over the target only when complete (`--perfetto`: a JSON document is valid only
//!   when closed). Dropped without [`Staged::commit`], the temporary file is removed and the
//!   target is left as it was.

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

/// Refuses an output that is an input or another output. `inputs` and `outputs` are
/// `(option, path)` pairs, e.g. `("--perfetto", path)`; the error names both.
pub fn check_distinct(inputs: &[(&str, &Path)], outputs: &[(&str, &Path)]) -> Result<(), String> {
    let mut seen: Vec<(&str, &Path, Identity, bool)> = Vec::new();
    for (is_input, list) in [(true, inputs), (false, outputs)] {
        for &(what, path) in list {
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
        eprintln!(
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

/// A file written under a temporary name and renamed over `target` when complete (regular files
/// and files that do not exist yet); written in place when `target` is a device or a FIFO.
pub struct Staged {
    file: File,
    target: PathBuf,
    temp: Option<PathBuf>,
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

    /// Creates the temporary file next to `target` (or opens `target` itself when it is not a
    /// regular file).
    pub fn create(target: &Path) -> io::Result<Self> {
        if Self::is_special(target) {
            return Ok(Self::in_place(open_for_writing(target)?, target));
        }
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".gpu-trace-{}.partial", std::process::id()));
        let temp = target.with_file_name(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)?;
        Ok(Self {
            file,
            target: target.to_path_buf(),
            temp: Some(temp),
        })
    }

    /// Written under a temporary name (the target is replaced only by [`Staged::commit`]).
    pub fn is_staged(&self) -> bool {
        self.temp.is_some()
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// The complete file takes the target's name.
    pub fn commit(mut self) -> io::Result<()> {
        if let Some(temp) = self.temp.take() {
            self.file.sync_data().ok();
            if let Err(e) = fs::rename(&temp, &self.target) {
                let _ = fs::remove_file(&temp);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = fs::remove_file(temp);
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
        let (_scratch, d) = dir();
        let target = d.join("t.json");
        fs::write(&target, b"old").unwrap();
        {
            let s = Staged::create(&target).unwrap();
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
        let s = Staged::create(&target).unwrap();
        io::Write::write_all(&mut s.file(), b"new").unwrap();
        s.commit().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
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
