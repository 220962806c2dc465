//! Per-packet cost through BPF_PROG_TEST_RUN (no benchmark harness): a READ of 192 bytes
//! (the size of a load record plus header) run 1e6 times, next to a frame the program
//! passes at once (the floor: timer and dispatch overhead). Prints ns per run.

mod common;

use common::*;
use farside_rmem::wire::{self, ReqHeader};
use farside_xdp::{action, TestProgram};

const PORT: u16 = 7077;
const KEY: u64 = 0x3333;
const RUNS: u32 = 1_000_000;

#[test]
fn read_192_bytes_cost_per_packet() {
    if !need_root("read_192_bytes_cost_per_packet") {
        return;
    }
    let prog = TestProgram::load(PORT, &[(KEY, false)]).expect("load");
    let mut req = Vec::new();
    wire::encode_request(
        &mut req,
        &ReqHeader {
            op: 1,
            seq: 1,
            key: KEY,
            region: 0,
            offset: 0,
            len: 192,
            ..Default::default()
        },
        &[],
    );
    // Padded to the reply's size, as clients must.
    req.resize(wire::REP_HEADER_BYTES + 192, 0);
    let read = frame(Shape::to_port(PORT), &req);
    assert_eq!(prog.run(&read).0, action::TX);
    let pass = frame(Shape::to_port(PORT + 1), &req);
    assert_eq!(prog.run(&pass).0, action::PASS);

    let t = std::time::Instant::now();
    let read_ns = prog.run_repeat(&read, RUNS).as_nanos();
    let wall = t.elapsed();
    let pass_ns = prog.run_repeat(&pass, RUNS / 10).as_nanos();
    println!(
        "xdp rmem READ 192 B: {read_ns} ns/op in the program (XDP_PASS floor {pass_ns} ns/op); \
         {RUNS} runs took {wall:?} of wall time including syscalls"
    );
    // Generous: a regression to microseconds would mean something is badly wrong.
    assert!(read_ns < 5_000, "{read_ns} ns per READ");
}
