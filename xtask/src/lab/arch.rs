//! The guest's architecture: everything the lab does differently for an arm64 guest (Debian's
//! `arm64` kernel in `qemu-system-aarch64`, binaries cross-built on this x86-64 machine) than
//! for an x86-64 one, in one place.

use std::path::Path;

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arch {
    /// Debian's `amd64` kernels in `qemu-system-x86_64` (q35; KVM where it boots, else TCG).
    #[value(name = "x86-64", alias = "x86_64", alias = "amd64")]
    X86_64,
    /// Debian's `arm64` kernels in `qemu-system-aarch64` (`virt`, TCG), as on Grace Hopper
    /// nodes; gpu-trace and the test client cross-built here.
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    /// Debian's name (`dpkg --print-architecture`), also the suffix of its kernel releases.
    pub(super) fn deb(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Rust's and `uname -m`'s name.
    pub(super) fn machine(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// Whether this machine runs the guest's binaries natively (no cross toolchain).
    pub(super) fn is_host(self) -> bool {
        std::env::consts::ARCH == self.machine()
    }

    /// The GNU toolchain prefix (`aarch64-linux-gnu-gcc`, `x86_64-linux-gnu-gcc-12`).
    pub(super) fn gnu_prefix(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu-",
            Arch::Arm64 => "aarch64-linux-gnu-",
        }
    }

    /// Kbuild's `ARCH=`.
    pub(super) fn kbuild(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86",
            Arch::Arm64 => "arm64",
        }
    }

    pub(super) fn qemu(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86_64",
            Arch::Arm64 => "qemu-system-aarch64",
        }
    }

    /// The kernel's console (the first serial port) and the port the results go to. arm64's
    /// `virt` machine has one UART (PL011, `ttyAMA0`): the results port is a PCI 16550
    /// (`-device pci-serial`), the guest's `ttyS0`. `lab/init.sh` reads it from the command
    /// line (`lab.results=`).
    pub(super) fn serial(self) -> (&'static str, &'static str) {
        match self {
            Arch::X86_64 => ("ttyS0", "ttyS1"),
            Arch::Arm64 => ("ttyAMA0", "ttyS0"),
        }
    }

    /// QEMU's machine, accelerator (`accel`: `kvm` or the TCG setting), CPU and results port
    /// (the file `results`, beside the console that `-serial` names first).
    pub(super) fn machine_args(self, accel: &str, results: &Path) -> Vec<String> {
        let results = results.display();
        match self {
            Arch::X86_64 => {
                let cpu = if accel == "kvm" { "host" } else { "max" };
                vec![
                    "-machine".into(),
                    "q35".into(),
                    "-accel".into(),
                    accel.into(),
                    "-cpu".into(),
                    cpu.into(),
                    "-serial".into(),
                    format!("file:{results}"),
                ]
            }
            // `virt` has one UART (the console); the results go to a PCI 16550. `max` with
            // QEMU's own pointer-authentication algorithm: the architected one (QARMA) is
            // several times slower under TCG.
            Arch::Arm64 => vec![
                "-machine".into(),
                "virt".into(),
                "-accel".into(),
                accel.into(),
                "-cpu".into(),
                "max,pauth-impdef=on".into(),
                "-device".into(),
                "pci-serial,chardev=results".into(),
                "-chardev".into(),
                format!("file,id=results,path={results}"),
            ],
        }
    }

    /// The C compiler for the static test client.
    pub(super) fn cc(self) -> String {
        if self.is_host() {
            std::env::var("CC").unwrap_or_else(|_| "cc".into())
        } else {
            format!("{}gcc", self.gnu_prefix())
        }
    }

    /// Debian packages of this machine that the lab needs for this guest architecture, beyond
    /// the common ones: (tool or file, package, why).
    pub(super) fn host_tools(self) -> Vec<(&'static str, &'static str, &'static str)> {
        let mut tools = vec![match self {
            Arch::X86_64 => ("qemu-system-x86_64", "qemu-system-x86", "boots the guest"),
            Arch::Arm64 => ("qemu-system-aarch64", "qemu-system-arm", "boots the guest"),
        }];
        if !self.is_host() && self == Arch::Arm64 {
            tools.push((
                "aarch64-linux-gnu-gcc",
                "gcc-aarch64-linux-gnu",
                "cross-builds the test client and the test modules",
            ));
            tools.push((
                "/usr/aarch64-linux-gnu/lib/libc.a",
                "libc6-dev-arm64-cross",
                "links the test client statically",
            ));
        }
        tools
    }
}
