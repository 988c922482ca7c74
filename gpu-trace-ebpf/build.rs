//! Rebuild the programs when `bpf-linker` changes (an undeclared tool dependency of this crate).
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!(
            "cargo:warning=bpf-linker not found on PATH: install it as the README's set-up says"
        ),
    }
}
