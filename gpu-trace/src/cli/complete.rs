//! What a shell's TAB offers for an option's value: live processes for `--pid`, their names for
//! `--comm`, the GPUs for `--gpu`, recordings for `replay` and `merge`, the node's pods and
//! namespaces for `--pod`/`--namespace`, running containers for `--container`.
//!
//! The shell asks the binary itself (clap_complete's dynamic completion): the script `gpu-trace
//! completions SHELL` prints calls `GPU_TRACE_COMPLETE=SHELL gpu-trace -- WORDS…` at each TAB,
//! which [`super::forgive::parse`] answers before parsing. The candidates are read when asked,
//! from the same places the tracer reads (/proc, /proc/driver/nvidia, the kubelet's pod log
//! directory); a name that would not be safe to show in a terminal, or that is not the literal
//! value the option takes, is left out rather than shown escaped.

use std::{collections::BTreeSet, ffi::OsStr, path::Path};

use clap_complete::engine::CompletionCandidate;
use gpu_trace_core::{
    escape,
    model::{gpus::GpuDirectory, workload},
};

use crate::probe::{cgroup, inventory, libraries, pods};

/// The environment variable the completion scripts set to ask for candidates.
pub const VAR: &str = "GPU_TRACE_COMPLETE";

/// Whether `s` can be offered as typed: valid text with no character the outputs would escape.
fn showable(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| escape::is_hidden(c) || c == '\\')
}

/// `(pid, comm)` of every process (the kernel's name; `None` where it is not showable).
fn processes() -> impl Iterator<Item = (u32, Option<String>)> {
    libraries::all_pids().into_iter().map(|pid| {
        let comm = libraries::comm_of(pid)
            .and_then(|b| String::from_utf8(b).ok())
            .filter(|c| showable(c));
        (pid, comm)
    })
}

/// `--pid`, `--deny-pid`: every live process, its name as the description.
pub fn pids() -> Vec<CompletionCandidate> {
    processes()
        .map(|(pid, comm)| CompletionCandidate::new(pid.to_string()).help(comm.map(Into::into)))
        .collect()
}

/// `--comm`: the names of the live processes, once each, sorted.
pub fn comms() -> Vec<CompletionCandidate> {
    let names: BTreeSet<String> = processes().filter_map(|(_, c)| c).collect();
    names.into_iter().map(CompletionCandidate::new).collect()
}

/// `--gpu`: nvidia-smi's index of each GPU of the NVIDIA driver, its model, bus id and UUID as
/// the description.
pub fn gpus() -> Vec<CompletionCandidate> {
    let found = inventory::nvidia_gpus(Path::new("/proc"));
    GpuDirectory::new(&found)
        .all()
        .into_iter()
        .map(|g| {
            let model = (found.iter())
                .find(|f| f.bus_id.as_deref() == Some(g.bus_id.as_str()))
                .and_then(|f| f.name.as_deref());
            let about: Vec<&str> = [model, Some(g.bus_id.as_str()), g.uuid.as_deref()]
                .into_iter()
                .flatten()
                .filter(|s| showable(s))
                .collect();
            CompletionCandidate::new(g.index.to_string()).help(Some(about.join(" ").into()))
        })
        .collect()
}

/// A recording by its name: `*.gtrace`, a rotation piece `*.gtrace.NNNN`.
pub fn is_recording(path: &Path) -> bool {
    let name = path.file_name().and_then(OsStr::to_str).unwrap_or("");
    let piece = name
        .rsplit_once('.')
        .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map_or(name, |(stem, _)| stem);
    piece.ends_with(".gtrace") && path.is_file()
}

/// `replay FILE`, `merge FILE…`: recordings and directories.
pub fn recordings() -> clap_complete::engine::PathCompleter {
    clap_complete::engine::PathCompleter::any().filter(|p| p.is_dir() || is_recording(p))
}

/// `(namespace, pod)` of each pod directory in the kubelet's log directory.
fn pod_names() -> Vec<(String, String)> {
    (pods::entries(Path::new(pods::DEFAULT_DIR), pods::MAX_PODS).iter())
        .filter_map(|name| {
            let (ns, pod, _) = pods::parse_pod_dir(name)?;
            Some((ns.to_string(), pod.to_string()))
        })
        .collect()
}

/// `--pod`: the node's pods (from /var/log/pods), their namespace as the description.
pub fn pod_candidates() -> Vec<CompletionCandidate> {
    let named: BTreeSet<(String, String)> =
        pod_names().into_iter().map(|(ns, p)| (p, ns)).collect();
    (named.into_iter())
        .map(|(pod, ns)| CompletionCandidate::new(pod).help(Some(ns.into())))
        .collect()
}

/// `--namespace`: the namespaces of the node's pods.
pub fn namespaces() -> Vec<CompletionCandidate> {
    let named: BTreeSet<String> = pod_names().into_iter().map(|(ns, _)| ns).collect();
    named.into_iter().map(CompletionCandidate::new).collect()
}

/// `--container`, `--deny-container`: the first 12 hex digits of each running container's id
/// (the form `docker ps` shows), its runtime as the description.
pub fn containers() -> Vec<CompletionCandidate> {
    let mut ids = BTreeSet::new();
    for pid in libraries::all_pids() {
        let Some(path) = cgroup::process_v2_path(pid) else {
            continue;
        };
        if let Some(c) = workload::container_cgroup(&path) {
            ids.insert((c.id[..12].to_string(), c.runtime.name()));
        }
    }
    (ids.into_iter())
        .map(|(id, runtime)| CompletionCandidate::new(id).help(Some(runtime.into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recordings_are_gtrace_files_and_their_rotation_pieces() {
        let dir = std::env::temp_dir().join(format!("gpu-trace-complete-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, want) in [
            ("run.gtrace", true),
            ("run.gtrace.0001", true),
            ("run.gtrace.", false),
            ("run.gtrace.01a", false),
            ("run.json", false),
            ("gtrace", false),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, b"").unwrap();
            assert_eq!(is_recording(&p), want, "{name}");
        }
        // A directory named like one is not a recording (directories are offered apart).
        let d = dir.join("d.gtrace");
        std::fs::create_dir_all(&d).unwrap();
        assert!(!is_recording(&d));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_a_terminal_would_act_on_are_not_offered() {
        assert!(showable("python3"));
        for bad in ["", "a\u{1b}[2J", "a\nb", "x\u{202e}y", "a\\b", "\u{7f}"] {
            assert!(!showable(bad), "{bad:?}");
        }
    }
}
