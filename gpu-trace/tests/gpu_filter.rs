//! `--gpu INDEX|UUID|BUS` (issue 30 item 3) on the real two-H200 recordings
//! (fixtures/h200x2_gpu_ids): the filtered replay prints exactly the unfiltered replay's event
//! lines whose `gpu_device` is that GPU, whichever way nvidia-smi's table (`smi.csv`, not
//! gpu-trace's output) names it; events whose GPU is not known are left out and counted as
//! `gpu_unknown` in the statistics.

mod common;
mod rel_support;

use std::{path::PathBuf, process::Command};

use rel_support::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(if name.contains('/') {
            name.to_string()
        } else {
            format!("h200x2_gpu_ids/{name}")
        })
}

/// nvidia-smi's names of each GPU: (index, uuid, bus id).
fn smi() -> Vec<(u64, String, String)> {
    std::fs::read_to_string(fixture("smi.csv"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            (f[0].parse().unwrap(), f[1].to_string(), f[2].to_string())
        })
        .collect()
}

/// The replay's stdout with `extra` options (JSON).
fn replay(name: &str, extra: &[&str]) -> String {
    let path = fixture(&format!("{name}.gtrace"));
    let out = Command::new(gpu_trace_bin())
        .args(["replay", path.to_str().unwrap(), "--format", "json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{extra:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The event lines (not the inventory, the statistics or the GPU share lines, which `--gpu`
/// does not filter).
fn event_lines(stdout: &str) -> Vec<serde_json::Value> {
    json_events(stdout)
        .into_iter()
        .filter(|e| !e["event"].as_str().unwrap().starts_with("GPU_SHARE"))
        .collect()
}

fn gpu_index(event: &serde_json::Value) -> Option<u64> {
    event
        .get("gpu_device")
        .map(|d| d["index"].as_u64().unwrap())
}

#[test]
fn gpu_filter_keeps_the_events_of_that_gpu_by_index_uuid_or_bus_id() {
    let gpus = smi();
    assert_eq!(gpus.len(), 2, "two GPUs in smi.csv");
    for name in ["allreduce", "each", "gpu1_only"] {
        let all = replay(name, &[]);
        let all = event_lines(&all);
        let unknown = all.iter().filter(|l| gpu_index(l).is_none()).count() as u64;
        let mut seen = 0;
        for (index, uuid, bus) in &gpus {
            let want: Vec<serde_json::Value> = all
                .iter()
                .filter(|l| gpu_index(l) == Some(*index))
                .cloned()
                .collect();
            seen += want.len();
            // nvidia-smi's bus id has an 8-digit domain; also the short and 4-digit forms.
            let short = bus.split_once(':').unwrap().1.to_string();
            let four = format!("0000:{short}");
            for sel in [
                index.to_string(),
                uuid.clone(),
                uuid.to_lowercase(),
                bus.clone(),
                four,
                short,
            ] {
                let out = replay(name, &["--gpu", &sel]);
                let got = event_lines(&out);
                assert_eq!(got, want, "{name} --gpu {sel}");
                let stats = json_stats(&out);
                assert_eq!(
                    stats["unreported"]["gpu_unknown"].as_u64().unwrap_or(0),
                    unknown,
                    "{name} --gpu {sel}: events of an unknown GPU counted"
                );
            }
        }
        assert!(seen > 0, "{name}: events on a known GPU");
        // Both GPUs: every event whose GPU is known, in order.
        let out = replay(name, &["--gpu", "0", "--gpu", "1"]);
        let known: Vec<serde_json::Value> = all
            .iter()
            .filter(|l| gpu_index(l).is_some())
            .cloned()
            .collect();
        assert_eq!(event_lines(&out), known, "{name}: --gpu 0 --gpu 1");
    }
    // gpu1_only ran on GPU 1 only: --gpu 0 prints no event.
    assert!(event_lines(&replay("gpu1_only", &["--gpu", "0"])).is_empty());
}

/// The older two-H200 recordings (fixtures/h200x2) lack what names each task's GPU (the
/// device-instance answers were not recorded then): every event's GPU is unknown, none is
/// printed under --gpu, and all are counted.
#[test]
fn events_of_an_unknown_gpu_are_left_out_and_counted() {
    for name in ["h200x2/allreduce", "h200x2/gpu1_only"] {
        let all = replay(name, &[]);
        let all = event_lines(&all);
        assert!(!all.is_empty() && all.iter().all(|l| gpu_index(l).is_none()));
        let out = replay(name, &["--gpu", "1"]);
        assert!(event_lines(&out).is_empty(), "{name}");
        let stats = json_stats(&out);
        assert_eq!(
            stats["unreported"]["gpu_unknown"].as_u64(),
            Some(all.len() as u64),
            "{name}"
        );
        // Without --gpu nothing is left out: no such count.
        assert!(
            json_stats(&replay(name, &[]))["unreported"]
                .get("gpu_unknown")
                .is_none()
        );
    }
}

#[test]
fn gpu_filter_refuses_what_names_no_gpu() {
    for bad in ["gpu0", "first", "00:zz.0", "-1"] {
        let out = Command::new(gpu_trace_bin())
            .args(["replay", "/dev/null", &format!("--gpu={bad}")])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--gpu {bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("nvidia-smi"),
            "--gpu {bad}: {out:?}"
        );
    }
}

/// `--gpu` naming no GPU of the recording says so on stderr, with the GPUs there are (as
/// nvidia-smi named them, `smi.csv`); a selector that names one (index, UUID, bus id) says
/// nothing.
#[test]
fn a_gpu_selector_that_names_no_gpu_of_the_run_is_said() {
    let stderr = |sel: &str| {
        let path = fixture("gpu1_only.gtrace");
        let out = Command::new(gpu_trace_bin())
            .args(["replay", path.to_str().unwrap(), "--gpu", sel])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sel}: {out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let smi = smi();
    for sel in [
        "3",
        "GPU-00000000-0000-0000-0000-000000000000",
        "0000:00:1f.0",
    ] {
        let err = stderr(sel);
        let warning = err
            .lines()
            .find(|l| l.starts_with(&format!("gpu-trace: warning: --gpu {sel} names none")))
            .unwrap_or_else(|| panic!("--gpu {sel}: no warning in {err}"));
        for (index, uuid, bus) in &smi {
            let bus = bus.trim_start_matches("0000");
            assert!(
                warning.contains(&format!("{index} {uuid} ")) && warning.contains(bus),
                "{warning} does not name GPU {index} {uuid} {bus}"
            );
        }
    }
    for (index, uuid, bus) in &smi {
        for sel in [index.to_string(), uuid.clone(), bus.clone()] {
            assert!(!stderr(&sel).contains("names none"), "--gpu {sel}");
        }
    }
}

/// The text lines' own `gpu=` (`-v`'s `WORK_SUBMIT`) of the replay with `extra` options.
fn text_gpus(name: &str, extra: &[&str]) -> Vec<(String, String)> {
    let path = fixture(name);
    let out = Command::new(gpu_trace_bin())
        .args(["replay", path.to_str().unwrap(), "-v"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{name} {extra:?}: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("WORK_SUBMIT"))
        .map(|l| {
            let gpu = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("gpu="))
                .unwrap_or_else(|| panic!("{name}: no gpu= in {l}"));
            (gpu.to_string(), l.to_string())
        })
        .collect()
}

/// One GPU numbering (issue 41 item 1): the `gpu=` a text line prints is the number `--gpu`
/// takes, nvidia-smi's index (`smi.csv`): on the two-H200 recordings `--gpu N` keeps exactly the
/// unfiltered replay's lines that print `gpu=N`, and only numbers nvidia-smi lists (or `?`)
/// are printed. The CUDA_VISIBLE_DEVICES=1 run's lines all print `gpu=1`, the GPU its README
/// says it ran on, though RM's device instance of its tasks is not what decides that.
#[test]
fn the_printed_gpu_is_the_one_gpu_selects() {
    let indexes: Vec<String> = smi().iter().map(|(i, _, _)| i.to_string()).collect();
    for name in ["each", "gpu1_only", "allreduce"] {
        let file = format!("h200x2_gpu_ids/{name}.gtrace");
        let all = text_gpus(&file, &[]);
        assert!(!all.is_empty(), "{name}: no WORK_SUBMIT line");
        for (gpu, line) in &all {
            assert!(
                indexes.contains(gpu) || gpu == "?",
                "{name}: gpu={gpu} is not an nvidia-smi index: {line}"
            );
        }
        for index in &indexes {
            let want: Vec<&String> = (all.iter())
                .filter(|(g, _)| g == index)
                .map(|(_, l)| l)
                .collect();
            let got = text_gpus(&file, &["--gpu", index]);
            let got: Vec<&String> = got.iter().map(|(_, l)| l).collect();
            assert_eq!(got, want, "{name} --gpu {index}");
        }
    }
    let only = text_gpus("h200x2_gpu_ids/gpu1_only.gtrace", &[]);
    assert!(only.iter().all(|(g, _)| g == "1"), "{only:?}");
}

/// A recording made before recordings listed the host's GPUs (two_streams.gtrace, the issue's
/// example): nvidia-smi's index of its GPU is not known, so its lines print `gpu=?` (not RM's
/// device instance, which used to print as `gpu=0` although `--gpu 0` selected nothing), and
/// `--gpu 0` says on stderr that no event can pass it.
#[test]
fn a_recording_without_its_gpus_prints_question_marks_and_says_gpu_selects_nothing() {
    let all = text_gpus("./two_streams.gtrace", &[]);
    assert!(!all.is_empty());
    assert!(all.iter().all(|(g, _)| g == "?"), "{all:?}");
    let path = fixture("./two_streams.gtrace");
    let out = Command::new(gpu_trace_bin())
        .args(["replay", path.to_str().unwrap(), "-v", "--gpu", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        !(stdout.lines()).any(|l| l.split_whitespace().nth(2) == Some("WORK_SUBMIT")),
        "{stdout}"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("gpu-trace: warning: --gpu 0: ")
                && l.ends_with("no event will pass it")),
        "{stderr}"
    );
}
