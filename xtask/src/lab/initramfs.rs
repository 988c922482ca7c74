//! The guest's initramfs: a `newc` cpio archive written directly.

use std::{
    fmt::Write as _,
    fs,
    io::{self, Write as _},
    path::{Path, PathBuf},
};

use super::debian::Kernel;
use anyhow::{Context as _, Result, anyhow};

/// A `newc` cpio archive, written directly (no cpio tool, no root needed for device nodes).
struct Cpio<W: io::Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: io::Write> Cpio<W> {
    fn new(out: W) -> Self {
        Self {
            out,
            ino: 1,
            written: 0,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.write(header.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()?;
        self.write(data)?;
        self.pad()
    }

    fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040755, (0, 0), &[])
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100000 | mode, (0, 0), data)
    }

    fn char_dev(&mut self, name: &str, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, 0o020600, (major, minor), &[])
    }

    fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        Ok(self.out)
    }

    fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.written += b.len() as u64;
        self.out.write_all(b)
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.write(&[0; 3][..n])
    }
}

pub(super) fn write_initramfs(
    path: &Path,
    root: &Path,
    kernel: &Kernel,
    busybox: &Path,
    gpu_trace: &Path,
    clients: &super::builds::Clients,
    test_modules: &[PathBuf],
) -> Result<()> {
    let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut cpio = Cpio::new(io::BufWriter::new(file));
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "lib",
        "lib/modules",
        "lib/modules/lab",
        "lib/modules/lab-extra",
    ] {
        cpio.dir(d)?;
    }
    cpio.char_dev("dev/console", 5, 1)?;
    cpio.file("init", 0o755, &fs::read(root.join("lab/init.sh"))?)?;
    cpio.file("bin/busybox", 0o755, &fs::read(busybox)?)?;
    cpio.file("bin/gpu-trace", 0o755, &fs::read(gpu_trace)?)?;
    for (name, built) in clients {
        cpio.file(&format!("bin/{name}"), 0o755, &fs::read(built)?)?;
    }
    let mut order = String::new();
    for m in &kernel.modules {
        let name = m
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| anyhow!("bad module name"))?;
        cpio.file(&format!("lib/modules/lab/{name}"), 0o644, &fs::read(m)?)?;
        writeln!(order, "{name}")?;
    }
    cpio.file("lib/modules/lab/order", 0o644, order.as_bytes())?;
    cpio.file("lib/modules/lab/config", 0o644, &fs::read(&kernel.config)?)?;
    for m in test_modules {
        let name = m
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| anyhow!("bad module name"))?;
        cpio.file(
            &format!("lib/modules/lab-extra/{name}"),
            0o644,
            &fs::read(m)?,
        )?;
    }
    cpio.finish()?.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_newc_entries_are_aligned_and_readable() {
        let mut c = Cpio::new(Vec::new());
        c.dir("bin").unwrap();
        c.file("bin/x", 0o755, b"hello").unwrap();
        c.char_dev("dev/console", 5, 1).unwrap();
        let out = c.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        // Walk it back.
        let mut off = 0;
        let mut seen = Vec::new();
        loop {
            let h = std::str::from_utf8(&out[off..off + 110]).unwrap();
            assert_eq!(&h[..6], "070701");
            let field =
                |i: usize| u32::from_str_radix(&h[6 + 8 * i..14 + 8 * i], 16).unwrap() as usize;
            let (mode, size, rmaj, rmin, namesize) =
                (field(1), field(6), field(9), field(10), field(11));
            let name = std::str::from_utf8(&out[off + 110..off + 110 + namesize - 1])
                .unwrap()
                .to_owned();
            let data_at = (off + 110 + namesize).next_multiple_of(4);
            let data = out[data_at..data_at + size].to_vec();
            off = (data_at + size).next_multiple_of(4);
            if name == "TRAILER!!!" {
                break;
            }
            seen.push((name, mode, data, rmaj, rmin));
        }
        assert_eq!(off, out.len());
        assert_eq!(seen[0], ("bin".into(), 0o040755, vec![], 0, 0));
        assert_eq!(seen[1], ("bin/x".into(), 0o100755, b"hello".to_vec(), 0, 0));
        assert_eq!(seen[2], ("dev/console".into(), 0o020600, vec![], 5, 1));
    }
}
