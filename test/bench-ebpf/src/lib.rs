#![no_std]
// Library target so that xtask can declare a build dependency on this crate (cache
// invalidation); the programs themselves are in the `bench-floor` binary target (src/floor.rs).
