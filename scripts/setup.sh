#!/usr/bin/env bash
# Installs what building gpu-trace needs on a fresh Debian machine (run as root, or with sudo):
# LLVM 22 for bpf-linker, the nightly toolchain's rust-src (the kernel programs are built with
# nightly for bpfel-unknown-none), and bpf-linker 0.13 itself. Idempotent: skips what is there.
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
log() { printf 'setup: %s\n' "$*"; }

if ! dpkg -s llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev >/dev/null 2>&1; then
  log "installing LLVM 22 development packages"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev >/dev/null
fi
# Test tools: bpftool (cross-checks in tests/lifecycle.rs that nothing of gpu-trace stays in the
# kernel) and setpriv from util-linux (privilege tests). The tests fall back or skip without them.
if ! command -v bpftool >/dev/null 2>&1 && [ -x /usr/bin/apt-get ]; then
  log "installing bpftool (test cross-checks)"
  $SUDO apt-get install -y -qq bpftool >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq bpftool >/dev/null; } \
    || log "bpftool not installable: the lifecycle tests check with bpf(2) only"
fi
# zsh and fish: tests/completions.rs completes a command line in each (bash is there already).
if ! { command -v zsh && command -v fish; } >/dev/null 2>&1 && [ -x /usr/bin/apt-get ]; then
  log "installing zsh and fish (completion tests)"
  $SUDO apt-get install -y -qq zsh fish >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq zsh fish >/dev/null; } \
    || log "zsh/fish not installable: their completion tests print SKIPPED"
fi
# Debian's real HIP runtime (bookworm main): tests/api_resolve.rs resolves a HIP client's calls
# through it under LD_PRELOAD shims.
if ! ldconfig -p 2>/dev/null | grep -q 'libamdhip64\.so\.5 ' && [ -x /usr/bin/apt-get ]; then
  log "installing libamdhip64-5 (the API layer's tests)"
  $SUDO apt-get install -y -qq libamdhip64-5 >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libamdhip64-5 >/dev/null; } \
    || log "libamdhip64-5 not installable: tests/api_resolve.rs prints SKIPPED"
fi
# The userspace toolchain rust-toolchain.toml pins (aya 0.16 needs Rust 1.98), with rustfmt and
# clippy (.ci/run fails on unformatted code and on clippy warnings) and the static targets.
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$(dirname "$0")/../rust-toolchain.toml")
if ! rustup toolchain list | grep -q "^$pinned"; then
  log "installing Rust $pinned (rust-toolchain.toml)"
  rustup toolchain install "$pinned" --profile minimal
fi
for c in rustfmt clippy; do
  if ! rustup component list --toolchain "$pinned" --installed | grep -q "^$c"; then
    log "adding $c to Rust $pinned"
    rustup component add --toolchain "$pinned" "$c"
  fi
done
# cargo xtask dist: the static musl target, and debootstrap for its fresh-root install check.
for t in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
  if ! rustup target list --toolchain "$pinned" --installed | grep -q "^$t\$"; then
    log "adding the $t target (static release builds)"
    rustup target add --toolchain "$pinned" "$t"
  fi
done
# debootstrap: dist --check's fresh Debian root; qemu-user-static: runs the arm64 build here;
# lintian: dist --check runs it on each .deb.
if { ! command -v debootstrap || ! command -v qemu-aarch64-static || ! command -v lintian; } \
   >/dev/null 2>&1 && [ -x /usr/bin/apt-get ]; then
  log "installing debootstrap, qemu-user-static and lintian (cargo xtask dist --check)"
  $SUDO apt-get install -y -qq debootstrap qemu-user-static lintian >/dev/null 2>&1 \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq debootstrap qemu-user-static lintian >/dev/null; }
fi
# The lab's arm64 guest (cargo xtask lab --arch arm64): QEMU for aarch64 and the cross compiler
# for its test client and test modules (and for ring's C code in dist's aarch64 musl build:
# xtask/src/dist.rs sets CC_/AR_aarch64_unknown_linux_musl to it). The lab installs what is missing itself when run as
# root; here so that the README's test command finds them without root, too.
for pkg in qemu-system-arm gcc-aarch64-linux-gnu libc6-dev-arm64-cross; do
  if ! dpkg -s "$pkg" >/dev/null 2>&1 && [ -x /usr/bin/apt-get ]; then
    log "installing $pkg (the lab's arm64 guest)"
    $SUDO apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 \
      || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; } \
      || log "$pkg not installable: cargo xtask lab --arch arm64 will say what is missing"
  fi
done
# --metrics tests and cargo xtask fleet: a real Prometheus (tests/metrics.rs scrapes gpu-trace with
# it; promtool checks deploy/*.yml) and podman + runc (the FROM scratch image). Without them those
# checks print SKIPPED. tmux: tests/top.rs drives `gpu-trace top` in a real terminal. curl and openssl: the
# metrics endpoint's TLS test (a self-signed certificate, a real HTTPS client). python3-yaml: xtask's
# tests read deploy/*.yaml and the release workflow.
for pkg in prometheus podman runc tmux curl openssl python3-yaml; do
  if ! dpkg -s "$pkg" >/dev/null 2>&1 && [ -x /usr/bin/apt-get ]; then
    log "installing $pkg (metrics and container checks)"
    $SUDO apt-get install -y -qq "$pkg" >/dev/null 2>&1 \
      || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$pkg" >/dev/null; } \
      || log "$pkg not installable: its checks print SKIPPED"
  fi
done
if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
  log "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
fi
if ! bpf-linker --version 2>/dev/null | grep -q '0\.13\.'; then
  log "building bpf-linker 0.13 against LLVM 22 (a few minutes)"
  LLVM_PREFIX=/usr/lib/llvm-22 cargo install bpf-linker --version 0.13.0 \
    --no-default-features --features llvm-22
fi
log "toolchain ready: $(rustc --version), $(rustc +nightly --version), $(bpf-linker --version)"
