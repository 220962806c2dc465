//! Compiles `bpf/frontend.bpf.c` with clang into `$OUT_DIR/frontend.bpf.o`, embedded by
//! `src/loader.rs` (crates/bpfbuild finds clang and sets the flags).

fn main() {
    farside_bpfbuild::compile(&farside_bpfbuild::Program {
        source: "frontend.bpf.c",
        depends_on: &[
            "frontend_consts.h",
            "frontend_maps.h",
            "frontend_structs.h",
            "auth_siphash.h",
        ],
        object: "frontend.bpf.o",
        // -mcpu=v3: the one-sided MOVE's compare-and-swap (BPF_CMPXCHG, Linux >= 5.12).
        extra_flags: &["-fno-strict-aliasing", "-mcpu=v3"],
    });
}
