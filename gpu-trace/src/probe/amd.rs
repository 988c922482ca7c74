//! The AMD KFD device on this system: its dynamic character major (`/proc/devices`), its node,
//! and the driver's version, for the start-up report and warnings.

use std::{io, path::Path};

use super::{devices, system};

/// Name of the KFD character device in `/proc/devices`.
pub const KFD_DEVICE_NAME: &str = "kfd";
/// The device node.
pub const KFD_PATH: &str = "/dev/kfd";

/// The character major of `/dev/kfd` (`register_chrdev(0, "kfd", …)` picks it when amdgpu
/// loads), from `/proc/devices`; `None` when amdgpu (KFD) is not loaded.
pub fn kfd_char_major() -> io::Result<Option<u32>> {
    Ok(devices::char_major_in(
        &devices::proc_devices()?,
        KFD_DEVICE_NAME,
    ))
}

/// What `--vendor amd` found on this system, for the start-up report and warnings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdPresence {
    /// Character major from `/proc/devices`.
    pub major: Option<u32>,
    /// `/dev/kfd` exists.
    pub node: bool,
}

impl KfdPresence {
    /// Looks at `/proc/devices` and `/dev/kfd`.
    pub fn probe() -> Self {
        Self {
            major: kfd_char_major().ok().flatten(),
            node: Path::new(KFD_PATH).exists(),
        }
    }

    /// A warning to print before tracing, when KFD calls may not be seen.
    pub fn warning(&self) -> Option<String> {
        match (self.major, self.node) {
            (Some(_), true) => None,
            (Some(major), false) => Some(format!(
                "{KFD_PATH} does not exist, although amdgpu registered KFD (char major {major}); \
                 tracing anyway: processes that open it once it exists will be seen (create it \
                 with `mknod {KFD_PATH} c {major} 0` if udev does not)"
            )),
            (None, _) => Some(format!(
                "AMD KFD is not loaded (no \"{KFD_DEVICE_NAME}\" in /proc/devices{}): its device \
                 number is assigned when amdgpu loads, so no KFD call can be seen by this run. \
                 Load amdgpu (`modprobe amdgpu`), then start gpu-trace again",
                if self.node { "" } else { ", no /dev/kfd" }
            )),
        }
    }
}

/// One line for recordings and reports: the KFD driver found here.
pub fn driver_description() -> Option<String> {
    let major = kfd_char_major().ok().flatten()?;
    let version = system::module_version(crate::targets::AMD_MODULE)
        .map(|v| format!(" {v}"))
        .unwrap_or_default();
    Some(format!("amdgpu{version} (KFD, char major {major})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_agrees_with_dev_kfd() {
        // Whatever this machine has, /proc/devices and /dev/kfd must tell the same story.
        let major = kfd_char_major().expect("/proc/devices is readable");
        match std::fs::metadata(KFD_PATH) {
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(
                    major,
                    Some(libc::major(meta.rdev())),
                    "{KFD_PATH} vs /proc/devices"
                );
            }
            Err(_) => {
                crate::say!("{KFD_PATH} absent here; kfd major from /proc/devices: {major:?}")
            }
        }
    }

    #[test]
    fn warnings_say_what_to_do() {
        assert_eq!(
            KfdPresence {
                major: Some(236),
                node: true
            }
            .warning(),
            None
        );
        let w = KfdPresence {
            major: Some(236),
            node: false,
        }
        .warning()
        .unwrap();
        assert!(w.contains("mknod /dev/kfd c 236 0"), "{w}");
        let w = KfdPresence {
            major: None,
            node: false,
        }
        .warning()
        .unwrap();
        assert!(
            w.contains("modprobe amdgpu") && w.contains("no /dev/kfd"),
            "{w}"
        );
    }
}
