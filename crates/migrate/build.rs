//! Compiles `bpf/hold.bpf.c` (the same-namespace flow hold) with clang into
//! `$OUT_DIR/hold.bpf.o`, embedded by `src/hold.rs` (crates/bpfbuild finds clang and
//! sets the flags).

fn main() {
    farside_bpfbuild::compile(&farside_bpfbuild::Program {
        source: "hold.bpf.c",
        depends_on: &[],
        object: "hold.bpf.o",
        extra_flags: &[],
    });
}
