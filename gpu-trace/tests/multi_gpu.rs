//! Which GPU each event is on (issue 18), on real two-GPU recordings (fixtures/h200x2_gpu_ids):
//! replayed, every event that names a GPU must name the one the oracles say, and none may be
//! guessed. The oracles are not gpu-trace's output: nvidia-smi's table (`smi.csv`), the driver's
//! own answers logged by an LD_PRELOAD witness in the workload (`*.ids`, examples/rm_ids_shim.c)
//! and the all-reduce's own log (rank → pid).

mod common;
mod rel_support;

use std::{collections::BTreeMap, fs, path::PathBuf, process::Command};

use gpu_trace::{
    record::{RecordReader, RecordWriter},
    source::nvidia::decode::{self, ControlParams, RmCall},
    wire::{self, RawRecord},
};
use rel_support::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/h200x2_gpu_ids")
        .join(name)
}

/// nvidia-smi: index → (uuid, (domain, bus, device)).
fn smi() -> BTreeMap<u64, (String, (u32, u32, u32))> {
    fs::read_to_string(fixture("smi.csv"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            let p: Vec<&str> = f[2].split([':', '.']).collect();
            let hex = |s: &str| u32::from_str_radix(s, 16).unwrap();
            (
                f[0].parse().unwrap(),
                (f[1].to_string(), (hex(p[0]), hex(p[1]), hex(p[2]))),
            )
        })
        .collect()
}

/// The witness: RM device instance → (domain, bus, device) of the GPU, from the driver's
/// answers to the workload (`gpuId` = domain << 16 | bus << 8 | device).
fn witness(name: &str) -> BTreeMap<u64, (u32, u32, u32)> {
    let mut m = BTreeMap::new();
    for line in fs::read_to_string(fixture(&format!("{name}.ids")))
        .unwrap()
        .lines()
    {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .map(str::to_string)
        };
        if let (Some(g), Some(d)) = (field("gpuId=0x"), field("deviceInstance=")) {
            let g = u32::from_str_radix(&g, 16).unwrap();
            m.insert(d.parse().unwrap(), (g >> 16, (g >> 8) & 0xff, g & 0xff));
        }
    }
    m
}

fn replay(path: &std::path::Path) -> Vec<serde_json::Value> {
    let out = Command::new(gpu_trace_bin())
        .args(["replay", path.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    json_events(&String::from_utf8_lossy(&out.stdout))
}

/// Every event naming a GPU names the one the witness and nvidia-smi say; returns the
/// nvidia-smi indexes of the TASK_INITs and, per pid, the indexes its events name.
fn checked(name: &str) -> (Vec<u64>, BTreeMap<u64, Vec<u64>>) {
    let smi = smi();
    let wit = witness(name);
    let events = replay(&fixture(&format!("{name}.gtrace")));
    let named: Vec<_> = events
        .iter()
        .filter(|e| e.get("gpu_device").is_some())
        .collect();
    assert!(!named.is_empty(), "{name}: no event names its GPU");
    let mut inits = Vec::new();
    let mut by_pid: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in &named {
        let g = &e["gpu_device"];
        let index = g["index"].as_u64().unwrap();
        let (uuid, pci) = &smi[&index];
        let rm = g["rm_device"].as_u64().unwrap();
        assert_eq!(
            wit.get(&rm),
            Some(pci),
            "{name}: RM device {rm} is not {pci:?}: {e}"
        );
        assert_eq!(g["uuid"], **uuid, "{name}: {e}");
        assert_eq!(
            g["bus_id"].as_str().unwrap().to_ascii_lowercase(),
            format!("{:04x}:{:02x}:{:02x}.0", pci.0, pci.1, pci.2),
            "{name}: {e}"
        );
        // The event's own numbers (TASK_INIT, WORK_SUBMIT): `gpu` nvidia-smi's index, the
        // driver's device instance apart as `rm_device`.
        if let Some(gpu) = e.get("gpu") {
            assert_eq!(
                (gpu.as_u64(), e["rm_device"].as_u64()),
                (Some(index), Some(rm)),
                "{name}: {e}"
            );
        }
        if e["event"] == "TASK_INIT" {
            inits.push(index);
        }
        by_pid
            .entry(e["pid"].as_u64().unwrap())
            .or_default()
            .push(index);
    }
    inits.sort();
    inits.dedup();
    (inits, by_pid)
}

#[test]
fn one_process_on_both_gpus_names_each() {
    let (inits, _) = checked("each");
    assert_eq!(inits, vec![0, 1]);
    // The statistics' per-GPU rows carry the same names.
    let out = Command::new(gpu_trace_bin())
        .args([
            "replay",
            fixture("each.gtrace").to_str().unwrap(),
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let stats = json_stats(&String::from_utf8_lossy(&out.stdout));
    let smi = smi();
    let wit = witness("each");
    let rows = stats["gpus"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in rows {
        let rm = row["rm_device"].as_u64().unwrap();
        let index = row["gpu"].as_u64().unwrap();
        let (uuid, pci) = &smi[&index];
        assert_eq!(wit.get(&rm), Some(pci), "{row}");
        assert_eq!(row["uuid"], **uuid, "{row}");
    }
}

#[test]
fn cuda_visible_devices_1_is_physical_gpu_1() {
    // CUDA's device 0 there is nvidia-smi's GPU 1.
    let (inits, _) = checked("gpu1_only");
    assert_eq!(inits, vec![1]);
}

#[test]
fn each_all_reduce_rank_is_on_its_own_gpu() {
    let ranks: BTreeMap<u64, u64> = fs::read_to_string(fixture("allreduce.log"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("ok=True"))
        .map(|l| {
            let get = |k: &str| -> u64 {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .unwrap()
                    .parse()
                    .unwrap()
            };
            (get("pid="), get("rank="))
        })
        .collect();
    assert_eq!(ranks.len(), 2);
    let (inits, by_pid) = checked("allreduce");
    assert_eq!(inits, vec![0, 1]);
    for (pid, rank) in &ranks {
        let seen = &by_pid[pid];
        assert!(
            seen.iter().all(|i| i == rank),
            "rank {rank} (pid {pid}) events on GPUs {seen:?}"
        );
    }
}

/// Without the driver's answers a two-GPU host leaves every GPU unnamed: the same recording with
/// its GET_ID_INFO_V2 records taken out names none (instances are not guessed from order).
#[test]
fn without_the_driver_s_answer_no_gpu_is_guessed() {
    let file = fs::File::open(fixture("each.gtrace")).unwrap();
    let mut reader = RecordReader::new(std::io::BufReader::new(file)).unwrap();
    let out = common::scratch().join("each-without-answers.gtrace");
    let mut writer =
        RecordWriter::new(fs::File::create(&out).unwrap(), &reader.header.clone()).unwrap();
    let mut removed = 0;
    while let Some(bytes) = reader.next_record().unwrap() {
        if let Ok(RawRecord::NvIoctl(r)) = wire::parse_record(&bytes)
            && let RmCall::Control {
                params: ControlParams::GpuIdInfo { .. },
                ..
            } = decode::decode(&r)
        {
            removed += 1;
            continue;
        }
        writer.record(&bytes).unwrap();
    }
    assert!(removed > 0, "the recording has the driver's answers");
    let trailer = reader.trailer.clone().unwrap();
    writer.finish(&trailer).unwrap();
    let events = replay(&out);
    assert!(!events.is_empty());
    assert!(
        events.iter().all(|e| e.get("gpu_device").is_none()),
        "a GPU named without the driver's answer"
    );
    // The events that carry a GPU number keep RM's and say nvidia-smi's is not known.
    let numbered: Vec<_> = events.iter().filter(|e| e.get("gpu").is_some()).collect();
    assert!(!numbered.is_empty());
    for e in numbered {
        assert!(
            e["gpu"].is_null() && e["rm_device"].is_u64(),
            "RM's number passed for nvidia-smi's: {e}"
        );
    }
}
