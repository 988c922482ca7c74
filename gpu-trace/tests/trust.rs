//! Small things that cost trust (issue 30, item 7):
//!
//! - `--duration` is counted from attach: `-d 1` traces one second, not one second minus the
//!   start-up.
//!
//! Kernel tests need root; without it they print `SKIPPED: <why>`.

mod common;
mod rel_support;

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use rel_support::*;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn duration_is_counted_from_attach() {
    let _serial = serial();
    let test = "duration_is_counted_from_attach";
    if skip_unless_root(test) {
        return;
    }
    let traced = Traced::start(&["--watch-device", WATCHED, "--format", "json", "-d", "1"])
        .unwrap_or_else(|e| panic!("{test}: {e}"));
    let f = traced.wait(Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
    let traced_s = json_stats(&f.stdout)["duration_s"].as_f64().unwrap();
    // The STATS duration is the time traced (from attach to the end of the drain).
    assert!(
        (1.0..1.5).contains(&traced_s),
        "-d 1 traced {traced_s} s: {}",
        f.stderr
    );
}
