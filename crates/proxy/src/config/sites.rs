//! `[[sites]]`: co-hosted sites, each named by its hosts, and the checks on them (the
//! routing by site that reads them is [`crate::sites`]).

use super::error::ConfigError;
use serde::Deserialize;
use std::collections::HashMap;

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
pub(crate) fn normalise_host(h: &str) -> String {
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
