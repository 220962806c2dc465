//! The configuration file: TOML read into a [`ProxyConfig`], validated at once or (with
//! flags still to go over it) later.

use super::error::{err, ConfigError};
use super::ProxyConfig;
use std::path::Path;

impl ProxyConfig {
    /// Parse and validate a TOML configuration.
    pub fn from_toml_str(s: &str) -> Result<Self, ConfigError> {
        let cfg = Self::parse_toml_str(s)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parse a TOML configuration without validating it (flags go over it first, then
    /// [`ProxyConfig::validate`] checks the result).
    pub fn parse_toml_str(s: &str) -> Result<Self, ConfigError> {
        toml::from_str(s).map_err(|e| {
            let key = e
                .span()
                .map(|sp| format!("at bytes {}..{}", sp.start, sp.end));
            err(
                key.unwrap_or_else(|| "file".into()),
                e.message().to_string(),
            )
        })
    }

    /// Read, parse and validate a TOML configuration file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let cfg = Self::parse_file(path)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Read and parse a TOML configuration file without validating it (see
    /// [`ProxyConfig::parse_toml_str`]).
    pub fn parse_file(path: &Path) -> Result<Self, ConfigError> {
        let s = std::fs::read_to_string(path)
            .map_err(|e| err(path.display().to_string(), format!("cannot read: {e}")))?;
        Self::parse_toml_str(&s)
    }
}
