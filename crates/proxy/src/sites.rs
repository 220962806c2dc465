//! Routing by site over dynamic roles (seed 001, issue 11).
//!
//! ```toml
//! [[sites]]
//! name = "shop"                 # 1..=64 of [A-Za-z0-9._-]: the back-end's site directory
//! hosts = ["shop.example", "www.shop.example"]
//! # id = 0                      # optional: the site number in role words; default: index
//! ```
//!
//! Every back-end's region holds `ROLE_SERVED` (site << 48 | version), written by the
//! node's agent (gatherd `--role-*`) once its web server serves that site. The monitor
//! reads it with the load record (one READ, words 0..36) into the table. A request
//! whose `Host` (port and trailing dot removed, case-insensitive) names a site goes only
//! to back-ends whose served role is that site with a version >= 1 (version 0: no agent).
//! If none serves it: 503 `site_unserved`, counted per site
//! (`farside_proxy_site_unserved_total{site}`). A Host that names no site keeps
//! today's routing (per-back-end `site`, else every back-end). No `[[sites]]`: today's
//! behaviour everywhere.
//!
//! A back-end whose region read fails keeps its last read role (its load goes stale and
//! the staleness policy applies as for any other request).

use crate::config::ConfigError;
use farside_reconf::Role;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most `[[sites]]` entries: sites are numbered in 16 bits in role words, and a proxy
/// config listing more than this is a mistake.
pub const SITES_MAX: usize = 1024;
/// Most `hosts` per site.
pub const HOSTS_PER_SITE_MAX: usize = 64;
/// Longest site name (as `farside backend`'s site directories).
pub const SITE_NAME_MAX: usize = 64;
/// Longest host name (DNS).
const HOST_MAX: usize = 253;

/// One `[[sites]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SiteConfig {
    /// The site's name (its directory under the back-ends' sites root).
    pub name: String,
    /// Host names whose requests belong to this site.
    pub hosts: Vec<String>,
    /// Site number in role words. Default: the entry's index.
    #[serde(default)]
    pub id: Option<u16>,
    /// With `[reconf]`: the index of the `[[backend]]` that holds this site's lock word
    /// and is never moved.
    #[serde(default)]
    pub anchor: Option<usize>,
}

fn err(key: String, msg: impl Into<String>) -> ConfigError {
    ConfigError {
        key,
        msg: msg.into(),
    }
}

/// `Host` header value → the key looked up: no port, no trailing dot, lower case.
fn normalise_host(h: &str) -> String {
    let h = h.trim();
    let h = if let Some(rest) = h.strip_prefix('[') {
        // [v6]:port
        rest.split(']').next().unwrap_or(rest)
    } else {
        h.rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(h, |(name, _)| name)
    };
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// Checks `[[sites]]`: names, ids and hosts unique and valid, bounded; and, if any site
/// is configured, that every back-end's role can be read (`region`, or a monitor table).
pub fn validate(sites: &[SiteConfig], every_backend_has_region: bool) -> Result<(), ConfigError> {
    if sites.is_empty() {
        return Ok(());
    }
    if sites.len() > SITES_MAX {
        return Err(err("sites".into(), format!("at most {SITES_MAX} sites")));
    }
    if !every_backend_has_region {
        return Err(err(
            "sites".into(),
            "routing by site reads every back-end's served role: every [[backend]] needs \
             a `region` (or set monitor.table)",
        ));
    }
    let mut ids = HashMap::new();
    let mut hosts = HashMap::new();
    for (i, s) in sites.iter().enumerate() {
        let key = |f: &str| format!("sites[{i}].{f}");
        let valid_name = !s.name.is_empty()
            && s.name.len() <= SITE_NAME_MAX
            && s.name != "."
            && s.name != ".."
            && s.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid_name {
            return Err(err(
                key("name"),
                format!("{:?}: 1..={SITE_NAME_MAX} of [A-Za-z0-9._-]", s.name),
            ));
        }
        let id = s.id.unwrap_or(i as u16);
        if i > usize::from(u16::MAX) && s.id.is_none() {
            return Err(err(key("id"), "needs an explicit id"));
        }
        if let Some(other) = ids.insert(id, i) {
            return Err(err(
                key("id"),
                format!("site id {id} already used by sites[{other}]"),
            ));
        }
        if s.hosts.is_empty() || s.hosts.len() > HOSTS_PER_SITE_MAX {
            return Err(err(
                key("hosts"),
                format!("1..={HOSTS_PER_SITE_MAX} host names"),
            ));
        }
        for h in &s.hosts {
            let n = normalise_host(h);
            if n.is_empty() || n.len() > HOST_MAX || n.bytes().any(|b| b.is_ascii_whitespace()) {
                return Err(err(key("hosts"), format!("{h:?} is not a host name")));
            }
            if let Some(other) = hosts.insert(n, i) {
                return Err(err(
                    key("hosts"),
                    format!("{h:?} already belongs to sites[{other}]"),
                ));
            }
        }
    }
    Ok(())
}

/// Does a `ROLE_SERVED` word say its node serves `site`?
pub fn role_serves(role_served: u64, site: u16) -> bool {
    let r = Role(role_served);
    r.version() != 0 && r.site() == site
}

/// The configured sites, looked up by Host on every request.
#[derive(Debug)]
pub struct SiteRouter {
    /// Normalised host → index into `sites`.
    by_host: HashMap<String, usize>,
    /// (name, id) per configured site.
    sites: Vec<(String, u16)>,
    /// Requests answered 503 `site_unserved`, per site.
    unserved: Vec<AtomicU64>,
}

impl SiteRouter {
    /// The router of a validated `[[sites]]` list; `None` if it is empty.
    pub fn new(cfg: &[SiteConfig]) -> Option<SiteRouter> {
        if cfg.is_empty() {
            return None;
        }
        let mut by_host = HashMap::new();
        for (i, s) in cfg.iter().enumerate() {
            for h in &s.hosts {
                by_host.insert(normalise_host(h), i);
            }
        }
        Some(SiteRouter {
            by_host,
            sites: cfg
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.clone(), s.id.unwrap_or(i as u16)))
                .collect(),
            unserved: cfg.iter().map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// The site a request's Host names: (index, site id).
    pub fn site_for_host(&self, host: Option<&str>) -> Option<(usize, u16)> {
        let i = *self.by_host.get(&normalise_host(host?))?;
        Some((i, self.sites[i].1))
    }

    /// Count a request no back-end could take because none serves site `index`.
    pub fn count_unserved(&self, index: usize) {
        self.unserved[index].fetch_add(1, Ordering::Relaxed);
    }

    /// Per-site metrics: 503s for want of a serving node, and how many back-ends serve
    /// each site now (`roles`: every back-end's `ROLE_SERVED`, `None` if never read).
    pub fn render(&self, enc: &mut farside_admin::Encoder, roles: &[Option<u64>]) {
        for (i, (name, id)) in self.sites.iter().enumerate() {
            enc.counter(
                "farside_proxy_site_unserved_total",
                "Requests answered 503 site_unserved: no back-end's served role is the site.",
                &[("site", name)],
                self.unserved[i].load(Ordering::Relaxed),
            );
            let serving = roles
                .iter()
                .filter(|r| r.is_some_and(|w| role_serves(w, *id)))
                .count() as u64;
            enc.gauge(
                "farside_proxy_site_backends",
                "Back-ends whose served role (ROLE_SERVED, as last read) is the site.",
                &[("site", name)],
                serving,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(name: &str, hosts: &[&str], id: Option<u16>) -> SiteConfig {
        SiteConfig {
            name: name.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            id,
            anchor: None,
        }
    }

    #[test]
    fn hosts_are_matched_without_port_case_or_trailing_dot() {
        let cfg = [
            site("a", &["A.example"], None),
            site("b", &["b.example", "[::1]"], Some(7)),
        ];
        validate(&cfg, true).unwrap();
        let r = SiteRouter::new(&cfg).unwrap();
        assert_eq!(r.site_for_host(Some("a.EXAMPLE:8080")), Some((0, 0)));
        assert_eq!(r.site_for_host(Some("b.example.")), Some((1, 7)));
        assert_eq!(r.site_for_host(Some("[::1]:80")), Some((1, 7)));
        assert_eq!(r.site_for_host(Some("c.example")), None);
        assert_eq!(r.site_for_host(None), None);
        assert!(role_serves(Role::new(7, 3).0, 7));
        assert!(!role_serves(Role::new(7, 0).0, 7), "version 0: no agent");
        assert!(!role_serves(Role::new(6, 3).0, 7));
    }

    #[test]
    fn bad_sites_are_refused_with_the_key() {
        let dup_host = [site("a", &["x"], None), site("b", &["X:80"], None)];
        assert_eq!(validate(&dup_host, true).unwrap_err().key, "sites[1].hosts");
        let dup_id = [site("a", &["x"], Some(1)), site("b", &["y"], None)];
        assert_eq!(validate(&dup_id, true).unwrap_err().key, "sites[1].id");
        let bad_name = [site("../a", &["x"], None)];
        assert_eq!(validate(&bad_name, true).unwrap_err().key, "sites[0].name");
        let no_hosts = [site("a", &[], None)];
        assert_eq!(validate(&no_hosts, true).unwrap_err().key, "sites[0].hosts");
        let ok = [site("a", &["x"], None)];
        assert_eq!(validate(&ok, false).unwrap_err().key, "sites");
    }
}
