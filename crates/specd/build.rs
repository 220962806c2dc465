//! Compiles `bpf/steer.bpf.c` with clang into `$OUT_DIR/steer.bpf.o`, embedded by
//! `src/steer.rs` (crates/bpfbuild finds clang and sets the flags).

fn main() {
    farside_bpfbuild::compile(&farside_bpfbuild::Program {
        source: "steer.bpf.c",
        depends_on: &[],
        object: "steer.bpf.o",
        extra_flags: &[],
    });
}
