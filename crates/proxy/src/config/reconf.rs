//! `[reconf]`: the settings of the reconfiguration driver ([`crate::reconf`], where the
//! section is shown in full), and their checks against the back-ends and sites.

use super::error::ConfigError;
use super::sites::SiteConfig;
use farside_reconf::{BalancerConfig, Topology};
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// Most balancers (the lock word's owner field and a sane peer list).
pub const BALANCERS_MAX: usize = 64;
/// Timeout of one remote op: a reply slower than this is lost (and the lease must
/// cover a hold of several of them: `BalancerConfig::hold_max_ns`).
pub(crate) const OP_TIMEOUT: Duration = Duration::from_millis(50);

/// `[reconf]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReconfConfig {
    /// Run the driver. Default false.
    pub enabled: bool,
    /// This proxy's balancer id (index into `balancers`).
    pub balancer_id: u32,
    /// Every balancer's region (rmem target strings), this one's included.
    pub balancers: Vec<String>,
    /// Serve this proxy's own region over rmem tcp here.
    pub region_listen: Option<SocketAddr>,
    /// The balancer's rmem key, `ID:PATH` (key id and key file, 0600; `ID` alone: the
    /// systemd credential `rmem-ID`): installed on every back-end's gatherd as
    /// `--rmem-key balancer:ID:PATH`, and on this proxy's own region server.
    pub key: String,
    /// S, ms. Default 1000.
    pub sensitivity_ms: u64,
    /// T, ms. Default 5000.
    pub history_ms: u64,
    /// Lease, ms. Default 3000.
    pub lease_ms: u64,
    /// Overloaded at this mean load (ppm). Default 800000.
    pub high_ppm: u64,
    /// A donor's load over one node fewer must stay under this (ppm). Default 600000.
    pub spare_ppm: u64,
}

impl Default for ReconfConfig {
    fn default() -> Self {
        let b = BalancerConfig::default();
        ReconfConfig {
            enabled: false,
            balancer_id: 0,
            balancers: Vec::new(),
            region_listen: None,
            key: String::new(),
            sensitivity_ms: b.sensitivity_ns / 1_000_000,
            history_ms: b.history_ns / 1_000_000,
            lease_ms: b.lease_ns / 1_000_000,
            high_ppm: b.high_ppm,
            spare_ppm: b.spare_ppm,
        }
    }
}

pub(crate) fn err(key: &str, msg: impl Into<String>) -> ConfigError {
    ConfigError {
        key: format!("reconf.{key}"),
        msg: msg.into(),
    }
}

impl ReconfConfig {
    /// The form of `key` (`ID:PATH`); the file is read by [`Self::balancer_key`].
    pub(crate) fn check_key_spec(&self) -> Result<(), ConfigError> {
        farside_rmem::ClientKey::parse_spec(&self.key)
            .map(|_| ())
            .map_err(|e| err("key", format!("{:?}: expected ID:PATH: {e}", self.key)))
    }

    /// The balancer's key, read from its file.
    pub(crate) fn balancer_key(&self) -> Result<farside_rmem::ClientKey, ConfigError> {
        farside_rmem::ClientKey::load(&self.key).map_err(|e| err("key", e))
    }

    pub(crate) fn balancer_config(&self) -> BalancerConfig {
        BalancerConfig {
            sensitivity_ns: self.sensitivity_ms * 1_000_000,
            history_ns: self.history_ms * 1_000_000,
            lease_ns: self.lease_ms * 1_000_000,
            op_timeout_ns: OP_TIMEOUT.as_nanos() as u64,
            high_ppm: self.high_ppm,
            spare_ppm: self.spare_ppm,
            ..BalancerConfig::default()
        }
    }

    /// `nodes`: the back-ends, in order.
    pub(crate) fn topology(&self, sites: &[SiteConfig], nodes: usize) -> Topology {
        Topology {
            nodes: nodes as u32,
            anchors: sites.iter().map(|s| s.anchor.unwrap_or(0) as u32).collect(),
            balancers: self.balancers.len() as u32,
        }
    }

    /// Checks `[reconf]` against what it reads of the rest of the configuration:
    /// `sites` (`[[sites]]`), `nodes` (how many `[[backend]]`s) and whether every one
    /// names its `region` ([`crate::config::ProxyConfig::validate_reconf`] passes them).
    pub fn validate(
        &self,
        sites: &[SiteConfig],
        nodes: usize,
        every_node_has_region: bool,
    ) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        self.check_key_spec()?;
        if sites.is_empty() {
            return Err(err("enabled", "needs [[sites]]"));
        }
        for (i, s) in sites.iter().enumerate() {
            match s.anchor {
                Some(a) if a < nodes => {}
                _ => {
                    return Err(ConfigError {
                        key: format!("sites[{i}].anchor"),
                        msg: "with [reconf]: the index of a [[backend]] (it holds the site's \
                              lock and is never moved)"
                            .into(),
                    })
                }
            }
            if s.id.is_some_and(|id| usize::from(id) != i) {
                return Err(ConfigError {
                    key: format!("sites[{i}].id"),
                    msg: "with [reconf]: site ids must be the entries' indices".into(),
                });
            }
        }
        if !every_node_has_region {
            return Err(err("enabled", "every [[backend]] needs a `region`"));
        }
        if self.balancers.is_empty() || self.balancers.len() > BALANCERS_MAX {
            return Err(err("balancers", format!("1..={BALANCERS_MAX} regions")));
        }
        if self.balancer_id as usize >= self.balancers.len() {
            return Err(err("balancer_id", "must index `balancers`"));
        }
        for b in &self.balancers {
            farside_rmem::Target::parse(b).map_err(|m| err("balancers", m))?;
        }
        if self.region_listen.is_none() {
            return Err(err("region_listen", "required: peers update this region"));
        }
        if self.sensitivity_ms == 0 {
            return Err(err("sensitivity_ms", "at least 1"));
        }
        self.balancer_config()
            .validate(&self.topology(sites, nodes))
            .map_err(|e| err("lease_ms", e.0))
    }
}
