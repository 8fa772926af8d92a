//! load: the layers of the configuration (defaults, file, environment, `--set`) merged into one
//! [`Config`]. Values are checked where they are turned into settings, not here.

use std::path::Path;

use super::{Config, ConfigError};
use crate::config::files::read_capped;

/// Largest configuration file accepted. Default: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Prefix of the environment variables that override options.
pub const ENV_PREFIX: &str = "QUOTAGATE_";

impl Config {
    /// Loads the configuration: defaults, then `file`, then the environment, then `overrides`
    /// (`section.key=value` strings, as given to `--set`).
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        overrides: &[String],
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = read_capped(path, MAX_CONFIG_BYTES).map_err(|e| {
                    ConfigError::general(format!("cannot read config file {}: {e}", path.display()))
                })?;
                // Parse into the typed struct first: that gives line and column for mistakes.
                let typed: Config = toml::from_str(&text).map_err(|e| {
                    ConfigError::general(format!("config file {}: {e}", path.display()))
                })?;
                toml::Table::try_from(typed).map_err(|e| ConfigError::general(e.to_string()))?
            }
            None => toml::Table::try_from(Config::default())
                .map_err(|e| ConfigError::general(e.to_string()))?,
        };
        let known = toml::Table::try_from(Config::default())
            .map_err(|e| ConfigError::general(e.to_string()))?;
        for (section, keys) in &known {
            let Some(keys) = keys.as_table() else {
                continue;
            };
            for (key, default) in keys {
                let var = format!(
                    "{ENV_PREFIX}{}_{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                );
                if let Some(raw) = env(&var) {
                    let value = coerce(&var, default, &raw)?;
                    set(&mut table, section, key, value);
                }
            }
        }
        for o in overrides {
            let (name, raw) = o.split_once('=').ok_or_else(|| {
                ConfigError::option(format!("--set {o:?}"), "expected section.key=value")
            })?;
            let (section, key) = name.split_once('.').ok_or_else(|| {
                ConfigError::option(format!("--set {o:?}"), "expected section.key=value")
            })?;
            let default = known.get(section).and_then(|s| s.get(key)).ok_or_else(|| {
                ConfigError::option(format!("--set {o:?}"), format!("there is no option {name}"))
            })?;
            let value = coerce(&format!("--set {name}"), default, raw)?;
            set(&mut table, section, key, value);
        }
        // The path of the value at fault names the option (`upstream.balance: unknown variant`).
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(
            |e: serde_path_to_error::Error<toml::de::Error>| {
                let path = e.path().to_string();
                let message = e.inner().message().to_owned();
                match path.as_str() {
                    "." | "" => ConfigError::general(format!("invalid configuration: {message}")),
                    _ => ConfigError::option(path, message),
                }
            },
        )?;
        Ok(config)
    }
}

/// Turns a raw override of `option` (as the user named it) into a value of the same type as the
/// option's default.
fn coerce(option: &str, default: &toml::Value, raw: &str) -> Result<toml::Value, ConfigError> {
    let bad = |reason: String| ConfigError::option(option, reason);
    Ok(match default {
        toml::Value::String(_) => toml::Value::String(raw.to_owned()),
        toml::Value::Integer(_) => toml::Value::Integer(
            raw.trim()
                .parse()
                .map_err(|_| bad(format!("{raw:?} is not a whole number")))?,
        ),
        toml::Value::Float(_) => toml::Value::Float(
            raw.trim()
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .ok_or_else(|| bad(format!("{raw:?} is not a number")))?,
        ),
        toml::Value::Boolean(_) => toml::Value::Boolean(
            raw.trim()
                .parse()
                .map_err(|_| bad(format!("{raw:?} is not true or false")))?,
        ),
        other => {
            return Err(bad(format!(
                "cannot be set from text (it is a {})",
                other.type_str()
            )));
        }
    })
}

fn set(table: &mut toml::Table, section: &str, key: &str, value: toml::Value) {
    let entry = table
        .entry(section.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(t) = entry.as_table_mut() {
        t.insert(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreKind;
    use std::collections::HashMap;

    fn load(
        toml_text: Option<&str>,
        env: &[(&str, &str)],
        sets: &[&str],
    ) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.toml");
        if let Some(t) = toml_text {
            std::fs::write(&path, t).unwrap();
        }
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::load(
            toml_text.map(|_| path.as_path()),
            |k| env.get(k).cloned(),
            &sets,
        )
    }

    #[test]
    fn defaults_then_file_then_env_then_flags() {
        assert_eq!(load(None, &[], &[]).unwrap(), Config::default());
        let file = "[upstream]\nurl = \"http://10.0.0.1:81\"\n[store]\ntimeout_ms = 100\n";
        let c = load(Some(file), &[], &[]).unwrap();
        assert_eq!(
            (c.upstream.url.as_str(), c.store.timeout_ms),
            ("http://10.0.0.1:81", 100)
        );
        let c = load(
            Some(file),
            &[
                ("QUOTAGATE_STORE_TIMEOUT_MS", "50"),
                ("QUOTAGATE_STORE_KIND", "redis"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!((c.store.timeout_ms, c.store.kind), (50, StoreKind::Redis));
        let c = load(
            Some(file),
            &[("QUOTAGATE_STORE_TIMEOUT_MS", "50")],
            &["store.timeout_ms=7"],
        )
        .unwrap();
        assert_eq!(c.store.timeout_ms, 7);
        let c = load(None, &[("QUOTAGATE_LIMITS_ENABLED", "false")], &[]).unwrap();
        assert!(!c.limits.enabled);
        // Numbers with a fraction, from whole or decimal text.
        let c = load(None, &[], &["telemetry.sample_ratio=0"]).unwrap();
        assert_eq!(c.telemetry.sample_ratio, 0.0);
        let c = load(None, &[("QUOTAGATE_TELEMETRY_SAMPLE_RATIO", "0.5")], &[]).unwrap();
        assert_eq!(c.telemetry.sample_ratio, 0.5);
        let e = load(None, &[], &["telemetry.sample_ratio=NaN"]).unwrap_err();
        assert!(e.to_string().contains("is not a number"), "{e}");
    }

    #[test]
    fn mistakes_name_the_option() {
        let e = load(Some("[server]\nlisten_addr = \"x\"\n"), &[], &[]).unwrap_err();
        assert!(
            e.to_string().contains("unknown field `listen_addr`")
                && e.to_string().contains("line 2"),
            "{e}"
        );
        let e = load(None, &[("QUOTAGATE_STORE_TIMEOUT_MS", "soon")], &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "QUOTAGATE_STORE_TIMEOUT_MS: \"soon\" is not a whole number"
        );
        let e = load(None, &[], &["store.kind=postgres"]).unwrap_err();
        assert!(e.to_string().contains("postgres"), "{e}");
        let e = load(None, &[], &["store.nope=1"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--set \"store.nope=1\": there is no option store.nope"
        );
        assert_eq!(e.option_name(), Some("--set \"store.nope=1\""));
    }
}

#[cfg(test)]
mod docs_tests {
    use super::*;

    /// docs/configuration.md lists every option with its environment variable.
    #[test]
    fn every_option_is_documented() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/configuration.md"
        ))
        .unwrap();
        let known = toml::Table::try_from(Config::default()).unwrap();
        for (section, keys) in &known {
            for key in keys.as_table().unwrap().keys() {
                let var = format!(
                    "{ENV_PREFIX}{}_{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                );
                assert!(
                    doc.contains(&format!("| `{section}.{key}` | `{var}` |")),
                    "{section}.{key} missing from docs/configuration.md"
                );
            }
        }
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn the_demo_configs_load_natively_and_with_the_compose_overrides() {
        let compose = [
            ("QUOTAGATE_SERVER_LISTEN", "0.0.0.0:8080"),
            ("QUOTAGATE_ADMIN_LISTEN", "0.0.0.0:8081"),
            ("QUOTAGATE_DIVVY_LISTEN", "0.0.0.0:8321"),
            ("QUOTAGATE_UPSTREAM_URL", "http://upstream:9000"),
            ("QUOTAGATE_CATALOG_SERVER_URL", "http://catalog:9100"),
            ("QUOTAGATE_STORE_REDIS_URL", "redis://redis:6379"),
        ];
        for name in ["gateway-a.toml", "gateway-b.toml", "catalog-server.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/demo")
                .join(name);
            Config::load(Some(&path), |_| None, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            let c = Config::load(
                Some(&path),
                |k| {
                    compose
                        .iter()
                        .find(|(v, _)| *v == k)
                        .map(|(_, x)| x.to_string())
                },
                &[],
            )
            .unwrap();
            assert_eq!(c.upstream.url, "http://upstream:9000", "{name}");
        }
    }

    #[test]
    fn the_example_file_is_exactly_the_defaults() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/quotagate.toml"
        ));
        assert_eq!(
            Config::load(Some(path), |_| None, &[]).unwrap(),
            Config::default()
        );
    }
}
