//! Compiles `bpf/frontend.bpf.c` with clang into `$OUT_DIR/frontend.bpf.o`, embedded by
//! `src/loader.rs`. The compiler is `$CLANG` if set, else the first of `clang`,
//! `clang-14`, or `/usr/lib/llvm-14/bin/clang` that runs (as crates/xdp/build.rs).

use std::path::PathBuf;
use std::process::Command;

const SOURCES: [&str; 4] = [
    "frontend.bpf.c",
    "frontend_consts.h",
    "frontend_maps.h",
    "frontend_structs.h",
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
    let out =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("frontend.bpf.o");
    let Some(clang) = find_clang() else {
        panic!("clang not found: apt-get install clang (or set CLANG=/path/to/clang); it builds bpf/frontend.bpf.c");
    };
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let src = bpf_dir.join("frontend.bpf.c");
    let status = Command::new(&clang)
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
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
        panic!("{clang} failed to compile {}", src.display());
    }
}
