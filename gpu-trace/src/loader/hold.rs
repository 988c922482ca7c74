//! The end of a run with uprobes attached (`--api`, `gpu-trace api`): the kernel removes a
//! perf-event uprobe with a grace period each, one at a time, so the descriptors go to a child
//! that pays for it after this process has exited.

/// Ends a run with uprobes attached without waiting for the kernel to remove them: it waits
/// for a grace period for each perf-event uprobe it removes (0.1 to 0.2 s each, one at a time:
/// a minute for PyTorch's libcuda and libcudart). A child process inherits the descriptors,
/// keeps only the kernel objects' (`anon_inode:`: the probes, links, programs, maps) and
/// drops them as it exits, once this process has exited (it waits for the end of a pipe only
/// this process holds): the last holder's close is the slow one, and it is the child's. It
/// leaves the terminal's session and closes everything else (standard streams, files,
/// sockets: a metrics port is free again at once). Returns whether the child holds them; the
/// caller then lets its own copies go without detaching (`std::mem::forget`).
pub fn hold_in_background() -> bool {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // The highest descriptor open now, read before fork (the child may not allocate).
    let max_fd = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .max()
                .unwrap_or(1024)
        })
        .unwrap_or(1024);
    let mut ends = [0 as libc::c_int; 2];
    // SAFETY: a valid two-int array.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return false;
    }
    let [wait_end, held_end] = ends;
    // SAFETY: the child only calls async-signal-safe functions (setsid, readlink, close, read,
    // _exit) on stack buffers.
    match unsafe { libc::fork() } {
        0 => unsafe {
            libc::setsid();
            libc::close(held_end);
            for fd in 0..=max_fd.max(wait_end) {
                if fd != wait_end && !kernel_object(fd) {
                    libc::close(fd);
                }
            }
            let mut byte = 0u8;
            while libc::read(wait_end, (&raw mut byte).cast(), 1) < 0 {}
            libc::_exit(0)
        },
        pid if pid > 0 => {
            // SAFETY: our own descriptor; `held_end` stays open until this process exits.
            unsafe { libc::close(wait_end) };
            true
        }
        _ => {
            // SAFETY: our own descriptors.
            unsafe {
                libc::close(wait_end);
                libc::close(held_end);
            }
            false
        }
    }
}

/// Whether descriptor `fd` of this process is a kernel object without a file
/// (`anon_inode:…`: a perf event, a BPF link, program or map). Async-signal-safe: a path built
/// on the stack and one `readlink`.
fn kernel_object(fd: i32) -> bool {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut path = [0u8; 32];
    path[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 11];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        path[PREFIX.len() + i] = digits[len - 1 - i];
    }
    let mut target = [0u8; 16];
    // SAFETY: a NUL-terminated path (the array is zeroed past the digits) and a buffer of
    // its stated size.
    let got = unsafe {
        libc::readlink(
            path.as_ptr().cast(),
            target.as_mut_ptr().cast(),
            target.len(),
        )
    };
    got >= 11 && target.starts_with(b"anon_inode:")
}
