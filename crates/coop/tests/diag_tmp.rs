use farside_coop::policy::{Policy, Press, RemoteMode};
use farside_coop::sim::{run, Arrival, DirectoryUpdate, SessionReplay, SimConfig};
use farside_coop::trace::{world_cup_sample_path, Trace};
use farside_coop::validate::*;

#[test]
#[ignore]
fn diag() {
    let trace = Trace::read_world_cup(&world_cup_sample_path()).unwrap();
    let f = CostsFile::parse(
        &std::fs::read_to_string("../../docs/results/coop/model-20261130-costs-a/costs.json")
            .unwrap(),
    )
    .unwrap();
    let variant = std::env::var("DIAG").unwrap_or_default();
    let only = std::env::var("ONLY").unwrap_or_default();
    for (dir, sys, per) in [
        ("20261129-n4-w99-frozen-release", "press-tcp", 13000usize),
        ("20261129-n4-w99-frozen-release", "press-xdp", 13000usize),
        ("20261129-n8-w90-frozen-release", "press-tcp", 7000),
        ("20261129-n8-w90-frozen-release", "rr", 2000),
        ("20261129-n4-w90-frozen-release", "rr", 1560),
        ("20261129-n4-w90-frozen-release", "press-tcp", 3800),
        ("20261129-n2-w90-frozen-release", "press-tcp", 3700),
        ("20261129-n2-w90-frozen-release", "rr", 2300),
    ] {
        if !only.is_empty() && !format!("{dir}{sys}").contains(&only) {
            continue;
        }
        for (i, line) in
            std::fs::read_to_string(format!("../../docs/results/coop/{dir}/points.jsonl"))
                .unwrap()
                .lines()
                .enumerate()
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v["point"]["system"] != sys {
                continue;
            }
            let runi = v["run"].as_u64().unwrap() as u32;
            let text =
                std::fs::read_to_string(format!("../../docs/results/coop/{dir}/summary.json"))
                    .unwrap();
            let lr = LabRun::parse_summary(&text).unwrap();
            let p = lr.points.iter().find(|p| p.system == sys).unwrap();
            let s = Setup::of_point(&lr, p);
            let mut cfg = SimConfig::new(s.nodes, s.cache_bytes);
            cfg.clients_per_node = s.clients_per_node as usize;
            cfg.think_ns = 20_000;
            cfg.costs = effective_costs(&f, &s);
            cfg.warmup_fraction = s.warmup_s / (s.warmup_s + s.duration_s);
            cfg.directory_period_ns = s.publish_ms * 1_000_000;
            cfg.load_period_ns = s.publish_ms * 1_000_000;
            cfg.directory_update = DirectoryUpdate::Datagram;
            cfg.arrival = Arrival::Sessions(SessionReplay {
                per_client: per,
                start_rows: (0..s.nodes)
                    .map(|i| trace.loadgen_start_row(lab_loadgen_seed(runi, i)))
                    .collect(),
            });
            let policy = if sys == "rr" {
                Policy::Independent
            } else if sys == "press-tcp" {
                Policy::Press(Press::new(RemoteMode::Forward))
            } else {
                Policy::Press(Press::new(RemoteMode::OneSided))
            };
            match variant.as_str() {
                "dir50" => {
                    cfg.directory_period_ns = 50_000_000;
                }
                "dir100" => {
                    cfg.directory_period_ns = 100_000_000;
                }
                "seed2" => {
                    cfg.seed = 2;
                }
                _ => {}
            }
            let r = run(&cfg, &trace, policy);
            r.check().unwrap();
            let fr = r.fractions();
            let lp = &v["point"];
            println!("{variant:6} {} {sys} r{runi}: sim {:.3}/{:.3}/{:.3} lab {:.3}/{:.3}/{:.3} wasted {} lab {} X {:.0} [{i}]", &dir[9..15], fr[0], fr[1], fr[2], lp["local_frac"].as_f64().unwrap(), lp["remote_frac"].as_f64().unwrap(), lp["miss_frac"].as_f64().unwrap(), r.wasted_fetches + r.wasted_forwards, lp["wasted_fetches"], r.throughput_rps());
        }
    }
}
