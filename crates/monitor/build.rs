//! Compiles `bpf/xskrx.bpf.c` (the XDP program of the AF_XDP receive path) with clang
//! into `$OUT_DIR/xskrx.bpf.o`, embedded by `src/xsk.rs` (crates/bpfbuild finds clang
//! and sets the flags).

fn main() {
    farside_bpfbuild::compile(&farside_bpfbuild::Program {
        source: "xskrx.bpf.c",
        depends_on: &[],
        object: "xskrx.bpf.o",
        extra_flags: &[],
    });
}
