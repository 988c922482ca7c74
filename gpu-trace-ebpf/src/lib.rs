#![no_std]
// Library target so that `gpu-trace` can declare a build dependency on this crate (cache
// invalidation); the programs themselves are in the `gpu-trace` binary target (src/main.rs).
