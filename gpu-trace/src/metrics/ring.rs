//! How full the ring buffer is: the kernel's producer and consumer positions, read from
//! read-only mappings of the map's two metadata pages (the layout of `kernel/bpf/ringbuf.c`:
//! consumer position on page 0, producer position on page 1). Aya's `RingBuf` keeps its own
//! mappings private; these are separate, read-only, and do not disturb its reads.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicU64, Ordering},
};

/// Read-only view of a BPF ring buffer's positions.
#[derive(Debug)]
pub struct RingFill {
    consumer: *mut libc::c_void,
    producer: *mut libc::c_void,
    page: usize,
}

// SAFETY: the mappings are only read, through atomics, and live until Drop.
unsafe impl Send for RingFill {}
// SAFETY: as above; concurrent atomic loads are fine.
unsafe impl Sync for RingFill {}

fn map_page(fd: BorrowedFd<'_>, page: usize, index: usize) -> io::Result<*mut libc::c_void> {
    // SAFETY: a new shared read-only mapping of one page of the map fd; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            (index * page) as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p)
    }
}

impl RingFill {
    /// Maps the metadata pages of the ring buffer map `fd`.
    pub fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let consumer = map_page(fd, page, 0)?;
        let producer = match map_page(fd, page, 1) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: mapped above with this length.
                unsafe { libc::munmap(consumer, page) };
                return Err(e);
            }
        };
        Ok(Self {
            consumer,
            producer,
            page,
        })
    }

    /// Bytes written by the kernel programs and not yet consumed (record headers included).
    pub fn used_bytes(&self) -> u64 {
        let (c, p) = self.positions();
        p.wrapping_sub(c)
    }

    /// The consumer and producer positions: bytes read and bytes reserved since the ring was
    /// made (both only grow; every record reserved before a moment lies below the producer
    /// position read then).
    pub fn positions(&self) -> (u64, u64) {
        // SAFETY: both pages are mapped for the life of self; the kernel keeps each position in
        // the page's first (8-byte aligned) word and updates it atomically.
        unsafe {
            (
                (*(self.consumer as *const AtomicU64)).load(Ordering::Acquire),
                (*(self.producer as *const AtomicU64)).load(Ordering::Acquire),
            )
        }
    }
}

impl Drop for RingFill {
    fn drop(&mut self) {
        // SAFETY: mapped in new() with this length, unmapped once.
        unsafe {
            libc::munmap(self.consumer, self.page);
            libc::munmap(self.producer, self.page);
        }
    }
}
