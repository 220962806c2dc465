//! `[[classes]]`: request classes for class-aware admission (`crate::control::classes`),
//! each named, recognised by a path prefix or an exact path, with a priority; and the
//! checks on them. Requests that match no class are the `default` class (priority 0).

use super::error::ConfigError;
use crate::control::classes::{
    ClassSpec, PathMatch, CLASSES_MAX, CLASS_NAME_BYTES_MAX, CLASS_PATH_BYTES_MAX, DEFAULT_CLASS,
    PRIORITY_ABS_MAX,
};
use serde::Deserialize;

/// One `[[classes]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// The class's name (a metrics label): letters, digits, `-`, `_`. Required.
    pub name: String,
    /// Requests whose target starts with this (e.g. `/cgi/`). One of `prefix`, `path`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// Requests whose path (the target up to `?`) is exactly this.
    #[serde(default)]
    pub path: Option<String>,
    /// Lower is more important, as HAProxy's `set-priority-class`; the default class has
    /// 0. Classes of a larger number than the smallest present are shed first. Default
    /// 0; within ±100.
    #[serde(default)]
    pub priority: i32,
}

fn err(key: String, msg: impl Into<String>) -> ConfigError {
    ConfigError {
        key,
        msg: msg.into(),
    }
}

impl ClassConfig {
    /// The class as the control layer runs it.
    pub fn spec(&self) -> ClassSpec {
        let matcher = match (&self.prefix, &self.path) {
            (_, Some(p)) => PathMatch::Exact(p.as_bytes().to_vec()),
            (Some(p), None) => PathMatch::Prefix(p.as_bytes().to_vec()),
            (None, None) => PathMatch::Prefix(Vec::new()),
        };
        ClassSpec {
            name: self.name.clone(),
            matcher,
            priority: self.priority,
        }
    }
}

/// `--class NAME,prefix=/cgi/,priority=1` (or `path=/exact`): one class from a flag.
pub fn parse_class(s: &str) -> Result<ClassConfig, String> {
    let mut parts = s.split(',');
    let name = parts.next().unwrap_or_default().to_string();
    let mut c = ClassConfig {
        name,
        prefix: None,
        path: None,
        priority: 0,
    };
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("`{kv}`: expected key=value"))?;
        match k {
            "prefix" => c.prefix = Some(v.to_string()),
            "path" => c.path = Some(v.to_string()),
            "priority" => c.priority = v.parse().map_err(|e| format!("priority `{v}`: {e}"))?,
            _ => {
                return Err(format!(
                    "`{k}`: unknown class option (prefix, path, priority)"
                ))
            }
        }
    }
    validate_one(0, &c).map_err(|e| e.msg)?;
    Ok(c)
}

fn validate_one(i: usize, c: &ClassConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("classes[{i}].{k}");
    if c.name.is_empty()
        || c.name.len() > CLASS_NAME_BYTES_MAX
        || !c
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(err(
            key("name"),
            format!(
                "`{}`: 1..={CLASS_NAME_BYTES_MAX} letters, digits, `-` or `_`",
                c.name
            ),
        ));
    }
    if c.name == DEFAULT_CLASS {
        return Err(err(
            key("name"),
            "`default` is the class of requests that match none",
        ));
    }
    let (k, p) = match (&c.prefix, &c.path) {
        (Some(p), None) => ("prefix", p),
        (None, Some(p)) => ("path", p),
        _ => return Err(err(key("prefix"), "give exactly one of prefix, path")),
    };
    if !p.starts_with('/') || p.len() > CLASS_PATH_BYTES_MAX || p.bytes().any(|b| b <= b' ') {
        return Err(err(
            key(k),
            format!(
                "`{p}`: must start with `/`, hold no spaces or controls, at most \
                 {CLASS_PATH_BYTES_MAX} bytes"
            ),
        ));
    }
    if c.priority.abs() > PRIORITY_ABS_MAX {
        return Err(err(
            key("priority"),
            format!("must be within ±{PRIORITY_ABS_MAX}, got {}", c.priority),
        ));
    }
    Ok(())
}

/// Checks `[[classes]]`: each entry valid and bounded, names unique, at most
/// [`CLASSES_MAX`]; and, if any class is declared, that admission is on (`admission_on`)
/// with a metric (named `metric`) that has a budget of requests in flight
/// (`metric_has_budget`: `delay` or `inflight`), which the classes divide.
pub fn validate(
    classes: &[ClassConfig],
    admission_on: bool,
    metric: &str,
    metric_has_budget: bool,
) -> Result<(), ConfigError> {
    if classes.is_empty() {
        return Ok(());
    }
    if classes.len() > CLASSES_MAX {
        return Err(err(
            "classes".into(),
            format!("at most {CLASSES_MAX} classes, got {}", classes.len()),
        ));
    }
    for (i, c) in classes.iter().enumerate() {
        validate_one(i, c)?;
        if classes[..i].iter().any(|o| o.name == c.name) {
            return Err(err(
                format!("classes[{i}].name"),
                format!("`{}` declared twice", c.name),
            ));
        }
    }
    if !admission_on || !metric_has_budget {
        return Err(err(
            "classes".into(),
            format!(
                "class-aware admission divides a budget of requests in flight: it needs \
                 admission on with metric `delay` or `inflight` (got {}, metric `{}`)",
                if admission_on { "on" } else { "off" },
                metric
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_flag_parses_and_bad_ones_say_why() {
        let c = parse_class("costly,prefix=/cgi/work,priority=1").unwrap();
        assert_eq!(c.prefix.as_deref(), Some("/cgi/work"));
        assert_eq!(c.priority, 1);
        assert_eq!(c.spec().matcher, PathMatch::Prefix(b"/cgi/work".to_vec()));
        for (bad, why) in [
            ("costly", "exactly one"),
            ("costly,prefix=/a,path=/b", "exactly one"),
            ("costly,prefix=cgi", "start with"),
            ("co stly,prefix=/a", "letters"),
            ("default,prefix=/a", "match none"),
            ("c,prefix=/a,priority=1000", "±100"),
            ("c,prefix=/a,weight=2", "unknown class option"),
        ] {
            let e = parse_class(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn classes_need_a_metric_with_an_inflight_budget() {
        let c = vec![parse_class("costly,prefix=/cgi/").unwrap()];
        assert!(validate(&c, true, "delay", true).is_ok());
        let e = validate(&c, true, "backlog", false).unwrap_err();
        assert_eq!(e.key, "classes");
        assert!(e.msg.contains("metric `backlog`"), "{e:?}");
        assert!(validate(&c, false, "delay", true).is_err());
        assert!(validate(&[], false, "backlog", false).is_ok());
        let twice = vec![c[0].clone(), c[0].clone()];
        assert_eq!(
            validate(&twice, true, "delay", true).unwrap_err().key,
            "classes[1].name"
        );
        let many: Vec<_> = (0..=CLASSES_MAX)
            .map(|i| parse_class(&format!("c{i},prefix=/{i}")).unwrap())
            .collect();
        assert!(validate(&many, true, "delay", true).is_err());
    }
}
