//! Records the commit the binary is built from (`FARSIDE_BUILD_COMMIT`), so that a result
//! names the code that produced it even when the source tree has moved on since the
//! build (`sweep::source_commit`). Empty when git or the repository is absent (a source
//! tarball): the run then records no commit rather than a wrong one.

use std::process::Command;

/// This crate's directory as cargo runs the script for it (read at run time: the
/// script's binary may have been compiled for another checkout sharing the target dir).
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(format!("{}/../..", manifest_dir()))
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=FARSIDE_BUILD_COMMIT={commit}");
    // Two checkouts sharing one CARGO_TARGET_DIR share this script's output too (its
    // unit does not depend on the checkout's path): the crate compares this path with
    // its own and ignores a commit read in another checkout.
    println!("cargo:rustc-env=FARSIDE_BUILD_TREE={}", manifest_dir());
    // Rebuilt when HEAD moves (commit, checkout, reset): the reflog of HEAD changes then.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/logs/HEAD");
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
