//! The one error of the configuration: the key at fault and what is wrong with it.

use std::fmt;

/// A configuration error that names the key at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub key: String,
    pub msg: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: `{}`: {}", self.key, self.msg)
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn err(key: impl Into<String>, msg: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        msg: msg.into(),
    }
}
