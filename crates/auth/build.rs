//! Compiles the test-only `bpf/auth_test.bpf.c` (SipHash of `bpf/auth_siphash.h` over a
//! frame) with clang into `$OUT_DIR/auth_test.bpf.o`, which `tests/bpf_siphash.rs` runs
//! through BPF_PROG_TEST_RUN (crates/bpfbuild finds clang and sets the flags).

fn main() {
    farside_bpfbuild::compile(&farside_bpfbuild::Program {
        source: "auth_test.bpf.c",
        depends_on: &["auth_siphash.h", "rmem_helpers.h"],
        object: "auth_test.bpf.o",
        // The flags of rmem.bpf.c, the first program to include auth_siphash.h.
        extra_flags: &["-mcpu=v3", "-fno-strict-aliasing"],
    });
}
