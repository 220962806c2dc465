//! Routing by site over dynamic roles (seed 001).
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
//!
//! The `[[sites]]` entries and their checks are configuration: [`crate::config::sites`].

use crate::config::sites::normalise_host;
use crate::config::SiteConfig;
use farside_reconf::Role;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

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
    use crate::config::sites::validate;

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
}
