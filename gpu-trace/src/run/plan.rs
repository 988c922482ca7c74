//! What to load before anything is attached: the kernel options from the flags, the API layer's
//! targets, KFD's presence, the `--cgroup`/`--container` selection.

use super::{error::RunError, signals::stop_requested};
use crate::{
    cli::TraceArgs,
    escape,
    loader::{LoadOptions, Tracer},
    probe::cgroup::{CgroupError, CgroupResolver, Subtree},
};

/// `--api` without `--pid`, `--comm` or `-- CMD`: bad usage, said before anything loads.
pub(super) fn check_api_targets(args: &TraceArgs) -> Result<(), RunError> {
    let none =
        args.output.pids.is_empty() && args.output.comms.is_empty() && args.launch.is_empty();
    if args.api && none {
        return Err(RunError::Usage(
            crate::api::attach::TraceApiError::NoTarget.to_string(),
        ));
    }
    Ok(())
}

/// `--api`: the API layer's uprobes on the targets (before the start-up line says "hooks"):
/// `--pid`, `--comm`, and `-- CMD`'s own process (`command`; its libraries are attached at the
/// rescans once it has exec'd and mapped them).
pub(super) fn api_layer(
    tracer: &mut Tracer,
    args: &TraceArgs,
    command: Option<u32>,
) -> Result<Option<crate::api::attach::TraceApi>, RunError> {
    if !args.api {
        return Ok(None);
    }
    let command = command.zip(args.launch.first());
    crate::api::attach::for_trace(
        tracer,
        &args.output.pids,
        &args.output.comms,
        command,
        stop_requested,
        args.api_calls,
        args.api_sums,
    )
    .map(Some)
    .map_err(|e| RunError::Unsupported(e.to_string()))
}

/// AMD: what is missing of KFD, as a warning; without KFD's device number no KFD call can be
/// seen, so the run stops (exit 3) rather than run and report nothing, unless a test device
/// stands in for it (--watch-device).
pub(super) fn check_kfd(
    args: &TraceArgs,
    kfd: Option<&crate::probe::amd::KfdPresence>,
) -> Result<(), RunError> {
    if let Some(kfd) = kfd
        && let Some(warning) = kfd.warning()
    {
        if kfd.major.is_none() && args.watch_device.is_none() {
            return Err(RunError::Unsupported(warning));
        }
        crate::say!("gpu-trace: warning: {warning}");
    }
    Ok(())
}

/// What the loader is asked for: the vendor, its device numbers (`watched`: `--watch-device`
/// adds a device of the vendor being traced), the kernel-side filters and hook choices.
pub(super) fn load_options(
    args: &TraceArgs,
    amd: bool,
    kfd: Option<&crate::probe::amd::KfdPresence>,
    watched: Option<u32>,
    subtrees: &CgroupSelection,
) -> LoadOptions {
    let (extra_device, extra_kfd_device) = if amd {
        (None, watched)
    } else {
        (watched, None)
    };
    LoadOptions {
        nvidia: !amd,
        kfd_major: kfd.and_then(|k| k.major),
        extra_kfd_device,
        extra_device,
        filter_tgid: match args.output.pids.as_slice() {
            [one] => Some(*one),
            _ => None,
        },
        ring_bytes: args.ring_size,
        syscall_hook: args.syscall_hook,
        deny_pids: args.deny_pids.clone(),
        filter_cgroups: subtrees.filter.iter().map(Subtree::kernel_match).collect(),
        deny_cgroups: subtrees.deny.iter().map(Subtree::kernel_match).collect(),
        deep_hooks: !args.no_deep_hooks,
        deep_attach: args.deep_attach,
        bpf_stats: args.bpf_stats,
        api_sums: args.api_sums,
    }
}

/// The cgroup subtrees of `--cgroup`/`--container` and `--deny-cgroup`/`--deny-container`.
#[derive(Debug, Default)]
pub(super) struct CgroupSelection {
    pub(super) filter: Vec<Subtree>,
    pub(super) deny: Vec<Subtree>,
    /// What the command line said, per subtree, for the start-up report.
    pub(super) named: Vec<String>,
    /// The cgroups with a `--container`/`--deny-container` id that were not selected (users'
    /// copies of a root container's id), for the start-up report.
    pub(super) not_meant: Vec<String>,
}

impl CgroupSelection {
    pub(super) fn resolve(
        args: &TraceArgs,
        resolver: Option<&mut CgroupResolver>,
    ) -> Result<Self, CgroupError> {
        let mut sel = Self::default();
        if args.cgroups.is_empty()
            && args.containers.is_empty()
            && args.deny_cgroups.is_empty()
            && args.deny_containers.is_empty()
        {
            return Ok(sel);
        }
        let r = resolver.ok_or(CgroupError::NoCgroup2)?;
        for (paths, ids, deny) in [
            (&args.cgroups, &args.containers, false),
            (&args.deny_cgroups, &args.deny_containers, true),
        ] {
            for p in paths {
                let s = r.subtree(p)?;
                sel.add(deny, format!("cgroup {}", s.path), s);
            }
            for id in ids {
                let found = r.find_container(id)?;
                sel.note_not_meant(deny, id, &found.not_meant);
                let s = found.subtree;
                sel.add(deny, format!("container {id}: cgroup {}", s.path), s);
            }
        }
        for (what, n) in [
            ("--cgroup/--container", sel.filter.len()),
            ("--deny-cgroup/--deny-container", sel.deny.len()),
        ] {
            if n > gpu_trace_common::CGROUP_MATCH_MAX as usize {
                return Err(CgroupError::TooMany { what, n });
            }
        }
        Ok(sel)
    }

    /// Keeps subtree `s` (`what` names it in the start-up report).
    pub(super) fn add(&mut self, deny: bool, what: String, s: Subtree) {
        let role = if deny { "denying" } else { "tracing only" };
        self.named.push(format!("{role} {what}"));
        if deny {
            &mut self.deny
        } else {
            &mut self.filter
        }
        .push(s);
    }

    /// Says which cgroups with container id `id` were not selected, and why.
    pub(super) fn note_not_meant(
        &mut self,
        deny: bool,
        id: &str,
        not_meant: &[(crate::model::workload::Maker, String)],
    ) {
        let (flag, not) = match deny {
            true => ("--deny-container", "not denied"),
            false => ("--container", "not traced"),
        };
        for (maker, path) in not_meant {
            self.not_meant.push(format!(
                "{flag} {id}: also found {maker} ({path}): {not}, not the container meant"
            ));
        }
    }

    /// One start-up line per subtree, then one per cgroup not meant (paths are the host's
    /// cgroup names, escaped).
    pub(super) fn describe(&self) -> Vec<String> {
        (self.named.iter().chain(&self.not_meant))
            .map(|n| escape::escape_text(n).into_owned())
            .collect()
    }
}
