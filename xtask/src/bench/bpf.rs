//! Part: the BPF programs themselves (the kernel's statistics of instructions, JIT size, ns
//! per run).

use super::*;

pub(super) fn bpf_part(ctx: &Ctx, out: &mut String) -> Result<()> {
    writeln!(out, "\n## 3. The kernel programs (bpf_prog_info)\n")?;
    writeln!(
        out,
        "The syscall-exit program's own time per run, from the kernel's run-time statistics \
         (BPF_ENABLE_STATS, on only for this part: the kernel then reads the clock twice around \
         every run, which the empty program's figure shows). Medians [min–max] over the \
         repetitions; \"added\" is paired with the empty program on the same hook. \
         \"runs/call\" above 1: other processes' syscalls ran the program during the loop (it \
         sees every syscall of the machine).\n"
    )?;
    let _stats = RunTimeStats::enable()?;
    let iters = (ctx.iters / 4).max(1000);
    let mut setups = Vec::new();
    for h in [Hook::RawTp, Hook::TpBtf] {
        if Floor::attach(h.syscall_hook()).is_ok() {
            setups.extend([Setup::Floor(h), Setup::GpuTrace(Some(h))]);
        }
    }
    if ctx.baseline.is_some() {
        setups.push(Setup::Baseline);
    }
    const WORKLOADS: [Workload; 5] = [
        Workload::Getppid,
        Workload::IoctlPipe,
        Workload::IoctlUnwatched,
        Workload::RmIgnored,
        Workload::RmEmit,
    ];
    let hot_names = [
        "sys_exit_raw",
        "sys_exit_btf",
        floor::FLOOR_RAW_TP,
        floor::FLOOR_TP_BTF,
    ];
    // (setup, workload) → (ns per run, runs per call), one per repetition.
    let mut runs: BTreeMap<(Setup, Workload), Vec<(f64, f64)>> = BTreeMap::new();
    let mut sizes: BTreeMap<String, ProgramStats> = BTreeMap::new();
    // The hook each setup's syscall-exit program ran on (from the program's name).
    let mut hook_by_setup: BTreeMap<Setup, Hook> = BTreeMap::new();
    for rep in 0..ctx.reps {
        progress(format!("bpf: repetition {}/{}", rep + 1, ctx.reps));
        for i in 0..setups.len() {
            let setup = setups[(i + rep) % setups.len()];
            let before_ids: HashSet<u32> = floor::loaded_program_stats()?
                .iter()
                .map(|p| p.id)
                .collect();
            let running = start(ctx, setup)?;
            let ours: Vec<ProgramStats> = floor::loaded_program_stats()?
                .into_iter()
                .filter(|p| !before_ids.contains(&p.id))
                .collect();
            for p in &ours {
                sizes.insert(format!("{} ({})", p.name, setup.label()), p.clone());
            }
            let ids: HashSet<u32> = ours
                .iter()
                .filter(|p| hot_names.contains(&p.name.as_str()))
                .map(|p| p.id)
                .collect();
            if let Some(p) = ours.iter().find(|p| ids.contains(&p.id)) {
                let hook = if p.name.ends_with("_btf") {
                    Hook::TpBtf
                } else {
                    Hook::RawTp
                };
                hook_by_setup.insert(setup, hook);
            }
            let snap = || -> Result<Option<ProgramStats>> {
                Ok(floor::loaded_program_stats()?
                    .into_iter()
                    .find(|p| ids.contains(&p.id)))
            };
            for wl in WORKLOADS {
                let a = snap()?;
                let r = run_loop(ctx, wl, iters, false)?;
                let b = snap()?;
                if let (Some(a), Some(b)) = (a, b) {
                    let n = b.run_count - a.run_count;
                    let ns = (b.run_time_ns - a.run_time_ns) as f64 / n.max(1) as f64;
                    runs.entry((setup, wl))
                        .or_default()
                        .push((ns, n as f64 / (r.calls + r.warmup) as f64));
                }
            }
            if let Running::GpuTrace(run) = running {
                stop_gpu_trace(run)?;
            }
        }
    }
    writeln!(
        out,
        "| workload | syscall-exit program of | ns per run | added vs empty program | runs/call |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for wl in WORKLOADS {
        for &setup in &setups {
            let Some(v) = runs.get(&(setup, wl)) else {
                continue;
            };
            let ns: Vec<f64> = v.iter().map(|x| x.0).collect();
            let per: Vec<f64> = v.iter().map(|x| x.1).collect();
            let floor = match setup {
                Setup::GpuTrace(_) | Setup::Baseline => {
                    hook_by_setup.get(&setup).map(|h| Setup::Floor(*h))
                }
                _ => None,
            };
            let added = floor
                .and_then(|f| runs.get(&(f, wl)))
                .filter(|f| f.len() == ns.len())
                .and_then(|f| spread(&ns.iter().zip(f).map(|(a, b)| a - b.0).collect::<Vec<_>>()));
            writeln!(
                out,
                "| {} | {} | {} | {} | {:.2} |",
                wl.label(),
                setup.label(),
                fmt_ns(spread(&ns)),
                if floor.is_some() {
                    fmt_ns(added)
                } else {
                    "—".into()
                },
                spread(&per).map_or(0.0, |s| s.median)
            )?;
        }
    }
    // What each program adds on unrelated syscalls, and the cheaper hook by that measure.
    let added = |setup: Setup, wl: Workload| -> Option<f64> {
        let floor = Setup::Floor(*hook_by_setup.get(&setup)?);
        let (a, b) = (runs.get(&(setup, wl))?, runs.get(&(floor, wl))?);
        (a.len() == b.len())
            .then(|| spread(&a.iter().zip(b).map(|(x, y)| x.0 - y.0).collect::<Vec<_>>()))?
            .map(|s| s.median)
    };
    writeln!(out)?;
    for setup in setups
        .iter()
        .copied()
        .filter(|s| matches!(s, Setup::GpuTrace(_) | Setup::Baseline))
    {
        let (Some(g), Some(f)) = (
            added(setup, Workload::Getppid),
            added(setup, Workload::IoctlPipe),
        ) else {
            continue;
        };
        writeln!(
            out,
            "- {}: the program adds {g:.1} ns to getppid() and {f:.1} ns to ioctl(FIONREAD) over the \
             empty program (medians)",
            setup.label()
        )?;
        // The 1.05× target seen through the program's own cost: less noisy than part 1's
        // syscall timings on a busy machine.
        let Some(&hook) = hook_by_setup.get(&setup) else {
            continue;
        };
        for wl in Workload::UNRELATED {
            let (Some(add), Some(floor)) = (added(setup, wl), ctx.floor_cpu.get(&(hook, wl)))
            else {
                continue;
            };
            let r = (floor + add) / floor;
            writeln!(
                out,
                "- {}, {}: (floor {floor:.0} ns + program {add:.1} ns) / floor = {r:.3}× → target ≤ 1.05×: {}",
                wl.label(),
                hook.short(),
                verdict(r <= 1.05)
            )?;
        }
    }
    if let (Some(raw), Some(btf)) = (
        added(Setup::GpuTrace(Some(Hook::RawTp)), Workload::IoctlPipe),
        added(Setup::GpuTrace(Some(Hook::TpBtf)), Workload::IoctlPipe),
    ) {
        let cheaper = if btf + 1.0 < raw { "tp_btf" } else { "raw_tp" };
        writeln!(
            out,
            "- cheapest syscall hook by program cost on ordinary ioctls: {cheaper}"
        )?;
    }
    writeln!(
        out,
        "\n| program (setup) | BPF insns after verifier | JIT bytes | insns verified |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    for (name, p) in sizes {
        writeln!(
            out,
            "| {name} | {} | {} | {} |",
            p.xlated_bytes.map_or("?".into(), |b| (b / 8).to_string()),
            p.jited_bytes,
            p.verified_insns.map_or("?".into(), |n| n.to_string())
        )?;
    }
    print_now(out);
    Ok(())
}
