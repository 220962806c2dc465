//! Compiles `bpf/steer.bpf.c` with clang into `$OUT_DIR/steer.bpf.o`, embedded by
//! `src/steer.rs` (as crates/xdp/build.rs does for rmem.bpf.c). The compiler is
//! `$CLANG` if set, else the first of `clang`, `clang-14`, or
//! `/usr/lib/llvm-14/bin/clang` that runs.

use std::path::PathBuf;
use std::process::Command;

fn find_clang() -> Option<String> {
    let candidates: Vec<String> = match std::env::var("CLANG") {
        Ok(c) => vec![c],
        Err(_) => ["clang", "clang-14", "/usr/lib/llvm-14/bin/clang"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let src = manifest.join("../../bpf/steer.bpf.c");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("steer.bpf.o");
    let Some(clang) = find_clang() else {
        panic!("clang not found: apt-get install clang (or set CLANG=/path/to/clang); it builds bpf/steer.bpf.c");
    };
    // asm/types.h etc. live in the multiarch include directory on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {clang}: {e}"));
    if !status.success() {
        panic!("{clang} failed to compile {}", src.display());
    }
}
