//! Compiles `bpf/rmem.bpf.c` (which includes the kernel sampler, `bpf/ksamp.bpf.c`) with
//! clang into `$OUT_DIR/rmem.bpf.o`, embedded by `src/lib.rs` (crates/bpfbuild finds
//! clang and sets the flags).

fn main() {
    farside_bpfbuild::compile(&farside_bpfbuild::Program {
        source: "rmem.bpf.c",
        depends_on: &[
            "auth_siphash.h",
            "ksamp.bpf.c",
            "ksamp_consts.h",
            "ksamp_maps.h",
            "ksamp_structs.h",
            "rmem_consts.h",
            "rmem_helpers.h",
            "rmem_maps.h",
            "rmem_structs.h",
        ],
        object: "rmem.bpf.o",
        extra_flags: &[
            // v3: atomic fetch-and-add / compare-and-swap returning the old value.
            "-mcpu=v3",
            // Strict aliasing once deleted a checksum-zeroing store (DESIGN.md).
            "-fno-strict-aliasing",
        ],
    });
}
