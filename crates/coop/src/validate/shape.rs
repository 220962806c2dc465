//! The set-up a costs file was calibrated in: how many nodes shared the host and each
//! node's CPU quota. A lab configuration is checked with the costs calibrated in its
//! own shape when one is given ([`pick`]): the host's cost per request grows with the
//! number of nodes it carries (more processes, more wake-ups, more directory traffic on
//! the same CPUs), which a calibration at another node count does not hold.

use serde::{Deserialize, Serialize};
use std::ops::RangeInclusive;

/// Node counts a calibration runs: the lab's own range (`farside lab coop --nodes`).
/// Even only: the all-remote phases pair each driven node with one serving node.
pub const CALIBRATE_NODES_RANGE: RangeInclusive<usize> = 2..=8;
/// Each node's CPU quota, percent of one CPU: at least 5 % (a 500 µs quota per 10 ms
/// period, the kernel's slice floor is 100 µs), at most one whole CPU.
pub const CALIBRATE_CPU_QUOTA_PCT_RANGE: RangeInclusive<u32> = 5..=100;
/// The lab's defaults (`farside lab coop`), and the shape of every calibration made
/// before the shape was recorded in the costs file.
pub const SHAPE_NODES_DEFAULT: usize = 4;
pub const SHAPE_CPU_QUOTA_PCT_DEFAULT: u32 = 40;

/// Nodes and each node's CPU quota of a calibration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationShape {
    pub nodes: usize,
    pub cpu_quota_pct: u32,
}

impl Default for CalibrationShape {
    fn default() -> CalibrationShape {
        CalibrationShape {
            nodes: SHAPE_NODES_DEFAULT,
            cpu_quota_pct: SHAPE_CPU_QUOTA_PCT_DEFAULT,
        }
    }
}

impl CalibrationShape {
    /// A shape within the bounds.
    pub fn new(nodes: usize, cpu_quota_pct: u32) -> Result<CalibrationShape, String> {
        if !CALIBRATE_NODES_RANGE.contains(&nodes) || nodes % 2 != 0 {
            return Err(format!(
                "--calibrate-nodes {nodes}: must be even and in {CALIBRATE_NODES_RANGE:?} \
                 (the all-remote phases pair each driven node with a serving one)"
            ));
        }
        if !CALIBRATE_CPU_QUOTA_PCT_RANGE.contains(&cpu_quota_pct) {
            return Err(format!(
                "--calibrate-cpu-quota-pct {cpu_quota_pct}: must be in \
                 {CALIBRATE_CPU_QUOTA_PCT_RANGE:?} (percent of one CPU)"
            ));
        }
        Ok(CalibrationShape {
            nodes,
            cpu_quota_pct,
        })
    }

    /// Each node's share of a CPU.
    pub fn cpu_share(&self) -> f64 {
        f64::from(self.cpu_quota_pct) / 100.0
    }

    /// The all-remote phases' pairs `(initial, service)`: node `j` of the first half
    /// asks for the set of node `j + nodes / 2`.
    pub fn fetch_pairs(&self) -> Vec<(usize, usize)> {
        let half = self.nodes / 2;
        (0..half).map(|j| (j, j + half)).collect()
    }

    /// `4 nodes at 40 %`.
    pub fn label(&self) -> String {
        format!("{} nodes at {} %", self.nodes, self.cpu_quota_pct)
    }
}

/// Which of `shapes` checks a configuration of `nodes` at `cpu_quota_pct`: the first
/// calibrated in that very shape, else the first of all (0). `None` when `shapes` is
/// empty.
pub fn pick(shapes: &[CalibrationShape], nodes: usize, cpu_quota_pct: u32) -> Option<usize> {
    if shapes.is_empty() {
        return None;
    }
    Some(
        shapes
            .iter()
            .position(|s| s.nodes == nodes && s.cpu_quota_pct == cpu_quota_pct)
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_is_even_bounded_and_fits_the_host() {
        assert_eq!(
            CalibrationShape::new(8, 20),
            Ok(CalibrationShape {
                nodes: 8,
                cpu_quota_pct: 20
            })
        );
        assert!(CalibrationShape::new(3, 20).unwrap_err().contains("even"));
        assert!(CalibrationShape::new(10, 10).is_err());
        assert!(CalibrationShape::new(0, 40).is_err());
        assert!(CalibrationShape::new(4, 4).is_err());
        assert!(CalibrationShape::new(4, 101).is_err());
        assert!(CalibrationShape::new(8, 40).is_ok());
        assert_eq!(CalibrationShape::default().label(), "4 nodes at 40 %");
    }

    #[test]
    fn the_remote_phases_pair_the_first_half_with_the_second() {
        let s = CalibrationShape::new(8, 20).unwrap();
        assert_eq!(s.fetch_pairs(), vec![(0, 4), (1, 5), (2, 6), (3, 7)]);
        let s = CalibrationShape::new(2, 40).unwrap();
        assert_eq!(s.fetch_pairs(), vec![(0, 1)]);
    }

    #[test]
    fn a_configuration_takes_the_costs_of_its_own_shape_else_the_first() {
        let shapes = [
            CalibrationShape::default(),
            CalibrationShape::new(8, 20).unwrap(),
            CalibrationShape::new(2, 40).unwrap(),
        ];
        assert_eq!(pick(&shapes, 8, 20), Some(1));
        assert_eq!(pick(&shapes, 2, 40), Some(2));
        assert_eq!(pick(&shapes, 4, 40), Some(0));
        // 8 nodes at 40 % were not calibrated: the first file.
        assert_eq!(pick(&shapes, 8, 40), Some(0));
        assert_eq!(pick(&[], 4, 40), None);
    }
}
