//! Kubernetes pods for the replay tests: a kubelet-shaped `/var/log/pods` tree, and a
//! recording's processes put in pods (the cgroup records a live run in those pods writes).

use std::{
    fs,
    path::{Path, PathBuf},
};

use gpu_trace::wire;

/// The pod `ml-team/trainer-0` (one container, `cuda`, also named by its legacy link).
pub const POD_UID: &str = "11111111-2222-4333-8444-555555555501";
/// Its container's id.
pub const CONTAINER_ID: &str = "c1c1c1c1aaaa000000000000000000000000000000000000000000000000c1c1";
/// The pod `ml-team/trainer-1` (one container, `cuda`).
pub const POD2_UID: &str = "11111111-2222-4333-8444-555555555504";
/// Its container's id.
pub const CONTAINER2_ID: &str = "c2c2c2c2bbbb000000000000000000000000000000000000000000000000c2c2";

/// A kubelet-shaped `/var/log/pods` tree (and `/var/log/containers` links) under `root`:
/// `ml-team/trainer-0` ([`POD_UID`]; containers `cuda` and `init-data`, `cuda` linked to
/// [`CONTAINER_ID`]), `ml-team/trainer-1` ([`POD2_UID`]), `other/web-1`, and a directory that is
/// no Kubernetes name (skipped, never shown). Returns the `pods` directory.
pub fn kubelet_tree(root: &Path) -> PathBuf {
    let _ = fs::remove_dir_all(root);
    let pods = root.join("pods");
    fs::create_dir_all(pods.join(format!("ml-team_trainer-0_{POD_UID}/cuda"))).unwrap();
    fs::create_dir_all(pods.join(format!("ml-team_trainer-0_{POD_UID}/init-data"))).unwrap();
    fs::create_dir_all(pods.join(format!("ml-team_trainer-1_{POD2_UID}/cuda"))).unwrap();
    fs::create_dir_all(root.join("containers")).unwrap();
    fs::File::create(root.join(format!(
        "containers/trainer-0_ml-team_cuda-{CONTAINER_ID}.log"
    )))
    .unwrap();
    fs::create_dir_all(pods.join("other_web-1_22222222-2222-4333-8444-555555555502/nginx"))
        .unwrap();
    fs::create_dir_all(pods.join("evil\u{1b}[2J_x_33333333-2222-4333-8444-555555555503/c"))
        .unwrap();
    pods
}

/// The cgroup path of container `id` of the Burstable pod `uid` (containerd, systemd driver).
pub fn pod_cgroup(uid: &str, id: &str) -> String {
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
        uid.replace('-', "_")
    )
}

/// `records` with each process of `placed` (pid, cgroup path) in its cgroup: its kernel cgroup
/// record and their resolution first, as a live run there has them; the recording's own cgroup
/// records (a later run's) are left out, so the other processes are not attributed.
pub fn in_cgroups(records: &[Vec<u8>], placed: &[(u32, &str)]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (i, &(pid, path)) in placed.iter().enumerate() {
        let first = (records.iter())
            .map(|r| wire::parse_record(r).unwrap())
            .find(|r| r.header().tgid == pid)
            .unwrap_or_else(|| panic!("no record of process {pid}"));
        let id = 4242 + i as u64;
        out.extend(super::cgroup_records(first.header(), id, path, None));
    }
    let own = |r: &&Vec<u8>| {
        matches!(
            wire::parse_record(r),
            Ok(wire::RawRecord::TaskCgroup(_) | wire::RawRecord::Attribution(_))
        )
    };
    out.extend(records.iter().filter(|r| !own(r)).cloned());
    out
}
