//! Character devices: the majors `/proc/devices` lists, device nodes and their numbers, and what
//! the KFD device itself says (its version, its GPUs).

use std::{fs, io, os::fd::AsRawFd, path::Path};

pub use super::system::{DevNode, char_device};

/// Where the kernel lists its device majors.
pub const PROC_DEVICES: &str = "/proc/devices";

/// The text of `/proc/devices`.
pub fn proc_devices() -> io::Result<String> {
    fs::read_to_string(PROC_DEVICES)
}

/// Character devices of a `/proc/devices` text: (major, name), in file order (only the
/// "Character devices:" section).
pub fn char_devices(proc_devices: &str) -> Vec<(u32, String)> {
    proc_devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Block devices"))
        .filter_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            Some((major.parse().ok()?, name.trim().to_string()))
        })
        .collect()
}

/// The character major registered under `name` in a `/proc/devices` text.
pub fn char_major_in(proc_devices: &str, name: &str) -> Option<u32> {
    char_devices(proc_devices)
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(major, _)| major)
}

/// `/dev/nvidiactl` and the `/dev/nvidia<N>` nodes that exist.
pub fn nvidia_nodes() -> Vec<DevNode> {
    std::iter::once("/dev/nvidiactl".to_string())
        .chain((0..64).map(|i| format!("/dev/nvidia{i}")))
        .filter_map(|p| char_device(Path::new(&p)).ok())
        .collect()
}

/// `AMDKFD_IOC_GET_VERSION` on a KFD node: (major, minor).
pub fn kfd_version(node: &DevNode) -> Result<(u32, u32), String> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&node.path)
        .map_err(|e| format!("opening {}: {e}", node.path))?;
    let mut args = [0u32; 2];
    // SAFETY: AMDKFD_IOC_GET_VERSION writes two u32 (major, minor) into `args`.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            gpu_trace_common::amd::cmd::GET_VERSION as libc::Ioctl,
            args.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(format!(
            "AMDKFD_IOC_GET_VERSION: {}",
            io::Error::last_os_error()
        ));
    }
    Ok((args[0], args[1]))
}

/// GPU nodes in the KFD topology (`/sys/class/kfd/kfd/topology/nodes/*/gpu_id` ≠ 0), or `None`
/// without a KFD topology.
pub fn kfd_gpus() -> Option<usize> {
    let nodes = fs::read_dir("/sys/class/kfd/kfd/topology/nodes").ok()?;
    Some(
        nodes
            .flatten()
            .filter(|n| {
                fs::read_to_string(n.path().join("gpu_id"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .is_some_and(|id| id != 0)
            })
            .count(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/devices` of the CI machine (6.18.44, no GPU driver), captured 2026-11-22.
    const CI_PROC_DEVICES: &str = include_str!("../../tests/fixtures/doctor/ci_proc_devices.txt");

    const PROC_DEVICES: &str = "Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
195 nvidia
236 kfd
254 gpiochip

Block devices:
  8 sd
237 kfd
";

    #[test]
    fn proc_devices_of_the_ci_machine_parse() {
        let devs = char_devices(CI_PROC_DEVICES);
        assert_eq!(devs.first(), Some(&(1, "mem".to_string())));
        assert!(devs.contains(&(136, "pts".to_string())));
        // Block devices are not character devices.
        assert!(!devs.iter().any(|(_, n)| n == "virtblk" || n == "loop"));
        assert!(
            !devs
                .iter()
                .any(|(m, _)| *m == gpu_trace_common::nvidia::NV_MAJOR)
        );
    }

    #[test]
    fn a_major_is_read_from_the_character_section() {
        assert_eq!(char_major_in(PROC_DEVICES, "kfd"), Some(236));
        assert_eq!(char_major_in(PROC_DEVICES, "nvidia"), Some(195));
        assert_eq!(
            char_major_in(PROC_DEVICES, "sd"),
            None,
            "block devices are not char devices"
        );
        assert_eq!(char_major_in(PROC_DEVICES, "/dev/vc/0"), Some(4));
        assert_eq!(char_major_in("Character devices:\n  1 mem\n", "kfd"), None);
        assert_eq!(char_major_in("", "kfd"), None);
    }
}
