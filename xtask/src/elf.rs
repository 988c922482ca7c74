//! ELF headers of the binaries xtask builds and checks (`object`, the workspace's ELF reader):
//! whether a file is statically linked, and its machine. `cargo xtask dist` and the lab both
//! use these; neither imports the other for them.

use anyhow::{Context as _, Result, ensure};
use object::Endianness;
use object::elf::{EM_AARCH64, EM_X86_64, FileHeader64, PT_INTERP};
use object::read::elf::{FileHeader as _, ProgramHeader as _};

/// The file's 64-bit little-endian ELF header, with its endianness.
fn header(bytes: &[u8]) -> Result<(&FileHeader64<Endianness>, Endianness)> {
    let header = FileHeader64::<Endianness>::parse(bytes)
        .context("not a 64-bit ELF file (or a truncated one)")?;
    let endian = header.endian().context("not an ELF file")?;
    ensure!(
        endian == Endianness::Little,
        "not a little-endian 64-bit ELF file"
    );
    Ok((header, endian))
}

/// `uname -m`'s name of an ELF file's machine (`e_machine`), where xtask knows it.
pub(crate) fn machine(bytes: &[u8]) -> Option<&'static str> {
    let (header, endian) = header(bytes).ok()?;
    match header.e_machine(endian) {
        EM_X86_64 => Some("x86_64"),
        EM_AARCH64 => Some("aarch64"),
        _ => None,
    }
}

/// True when the ELF file has no program interpreter (PT_INTERP), i.e. is statically linked.
pub(crate) fn is_static(bytes: &[u8]) -> Result<bool> {
    let (header, endian) = header(bytes)?;
    let phdrs = header
        .program_headers(endian, bytes)
        .context("truncated ELF program headers")?;
    Ok(!phdrs.iter().any(|p| p.p_type(endian) == PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header of machine `machine` with program headers of the given types.
    fn elf(machine: u16, types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56 * types.len()];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[6] = 1;
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[52..54].copy_from_slice(&64u16.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            b[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn static_elf_has_no_interpreter() {
        assert!(is_static(&elf(62, &[1, 1, 4])).unwrap());
        assert!(!is_static(&elf(62, &[6, 3, 1])).unwrap());
        assert!(is_static(b"#!/bin/sh\n").is_err());
        // Program headers past the end of the file.
        let mut cut = elf(62, &[1, 3]);
        cut.truncate(64 + 56);
        assert!(is_static(&cut).is_err());
    }

    #[test]
    fn machine_names_x86_64_and_aarch64_only() {
        assert_eq!(machine(&elf(62, &[])), Some("x86_64"));
        assert_eq!(machine(&elf(183, &[])), Some("aarch64"));
        assert_eq!(machine(&elf(40, &[])), None);
        assert_eq!(machine(b"\x7fELF"), None);
    }

    /// The binary running this test, a real dynamically linked ELF file of this machine.
    #[test]
    fn this_test_binary_is_read_as_the_kernel_sees_it() {
        let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(machine(&bytes), Some(std::env::consts::ARCH));
        assert!(
            !is_static(&bytes).unwrap(),
            "a cargo test binary has an interpreter"
        );
    }
}
