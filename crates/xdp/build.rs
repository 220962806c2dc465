//! Compiles `bpf/rmem.bpf.c` (which includes the kernel sampler, `bpf/ksamp.bpf.c`) with clang into `$OUT_DIR/rmem.bpf.o`, embedded by `src/lib.rs`.
//! The compiler is `$CLANG` if set, else the first of `clang`, `clang-14`, or
//! `/usr/lib/llvm-14/bin/clang` that runs.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: [&str; 9] = [
    "rmem.bpf.c",
    "ksamp.bpf.c",
    "ksamp_consts.h",
    "ksamp_maps.h",
    "ksamp_structs.h",
    "rmem_consts.h",
    "rmem_helpers.h",
    "rmem_maps.h",
    "rmem_structs.h",
];

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
    let bpf_dir = manifest.join("../../bpf");
    for f in SOURCES {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("rmem.bpf.o");
    let Some(clang) = find_clang() else {
        panic!("clang not found: apt-get install clang (or set CLANG=/path/to/clang); it builds bpf/rmem.bpf.c");
    };
    // asm/types.h etc. live in the multiarch include directory on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let src = bpf_dir.join("rmem.bpf.c");
    let status = Command::new(&clang)
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
            // v3: atomic fetch-and-add / compare-and-swap returning the old value.
            "-mcpu=v3",
            // Strict aliasing once deleted a checksum-zeroing store (DESIGN.md).
            "-fno-strict-aliasing",
            "-Wall",
            "-Werror",
        ])
        .arg(format!("-I{multiarch}"))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {clang}: {e}"));
    if !status.success() {
        panic!("{clang} failed to compile {}", display(&src));
    }
}

fn display(p: &Path) -> String {
    p.canonicalize()
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}
