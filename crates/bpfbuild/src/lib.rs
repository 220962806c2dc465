//! Helper of the crates that embed BPF programs from `bpf/` (farside-xdp,
//! farside-frontend, farside-specd, farside-monitor, farside-migrate): one place that
//! finds clang, sets the project's compiler flags and tells cargo which sources to
//! watch ([`compile`], from their build scripts), and one `BPF_PROG_TEST_RUN` for
//! their packet tests ([`prog_test_run`]).
//!
//! The compiler is `$CLANG` if set, else the first of `clang`, `clang-14` or
//! `/usr/lib/llvm-14/bin/clang` that runs. Called from a build script only (it reads
//! cargo's `CARGO_MANIFEST_DIR`, `OUT_DIR`, `CARGO_CFG_TARGET_ARCH` and panics with the
//! reason when something is missing, which is how a build script reports an error).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags of every program: optimised (the verifier needs it), BTF for CO-RE and the
/// loader, warnings as errors.
pub const BASE_FLAGS: [&str; 6] = ["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"];

/// One BPF program of `bpf/`.
pub struct Program<'a> {
    /// Its C source, relative to `bpf/` (e.g. `"rmem.bpf.c"`).
    pub source: &'a str,
    /// Headers and included sources it depends on, relative to `bpf/` (rebuild when
    /// they change).
    pub depends_on: &'a [&'a str],
    /// Object file name in `$OUT_DIR` (embedded with `include_bytes_aligned!`).
    pub object: &'a str,
    /// Flags beyond [`BASE_FLAGS`] (e.g. `-mcpu=v3`).
    pub extra_flags: &'a [&'a str],
}

/// The first clang that runs.
pub fn find_clang() -> Option<String> {
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

/// Compile `p` into `$OUT_DIR/<object>`; panics (failing the build) with the reason.
pub fn compile(p: &Program) {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let bpf_dir = manifest.join("../../bpf");
    for f in std::iter::once(&p.source).chain(p.depends_on) {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join(p.object);
    let src = bpf_dir.join(p.source);
    let Some(clang) = find_clang() else {
        panic!(
            "clang not found: apt-get install clang (or set CLANG=/path/to/clang); it builds bpf/{}",
            p.source
        );
    };
    // asm/types.h etc. live in the multiarch include directory on Debian.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(BASE_FLAGS)
        .args(p.extra_flags)
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

/// The outcome of one [`prog_test_run`].
#[derive(Debug, Clone, Copy)]
pub struct TestRun {
    /// The program's return value (its verdict: XDP action, tc action, ...).
    pub retval: u32,
    /// Bytes of the frame as the program left it, written to the output buffer.
    pub data_out_len: usize,
    /// Run time of the program as the kernel measured it, ns.
    pub duration_ns: u32,
}

/// `union bpf_attr`'s `test` member (linux/bpf.h), for `BPF_PROG_TEST_RUN`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// The bpf(2) command number of `BPF_PROG_TEST_RUN`.
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs the loaded program `prog` once on `frame` with `BPF_PROG_TEST_RUN` (packet
/// tests of the crates that embed BPF programs; the maps are the live ones). The frame
/// as the program left it goes to `out` (empty: not returned; the kernel fails with
/// ENOSPC if the result does not fit).
pub fn prog_test_run(
    prog: std::os::fd::BorrowedFd<'_>,
    frame: &[u8],
    out: &mut [u8],
) -> std::io::Result<TestRun> {
    use std::os::fd::AsRawFd;
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: if out.is_empty() {
            0
        } else {
            out.as_mut_ptr() as u64
        },
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: attr points to `frame` and `out` of the stated sizes (or no output
    // buffer), both live for the call's duration.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(TestRun {
        retval: attr.retval,
        data_out_len: (attr.data_size_out as usize).min(out.len()),
        duration_ns: attr.duration,
    })
}
