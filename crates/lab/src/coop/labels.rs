//! The labels the tables and the lines under them give a point's load and links.

/// `1500/s` (open loop: the offered rate) or `16 clients` (closed loop).
pub fn load_label(load_model: &str, rate: f64, clients: usize) -> String {
    if load_model == "open" {
        format!("{rate:.0}/s")
    } else {
        format!("{clients} clients")
    }
}

/// `10G`, `1G`, or `-` for an unshaped link.
pub fn link_label(gbit: f64) -> String {
    if gbit <= 0.0 {
        "-".into()
    } else {
        format!("{gbit}G")
    }
}
