//! The collector's configuration parser, outside the collector binary, for
//! the `config` fuzz target: `collector/src/config.rs` and the modules it
//! uses (`interpolate.rs`, `files.rs`, `config_checks.rs`, `yaml_depth.rs`,
//! `label_bounds.rs`, `routing_schema.rs`)
//! compiled as they are (as a dependency, so their `#[cfg(test)]` modules
//! are left out).

#![allow(dead_code, unreachable_pub)]

#[path = "../../../collector/src/config.rs"]
pub mod config;
#[path = "../../../collector/src/config_checks.rs"]
pub mod config_checks;
#[path = "../../../collector/src/files.rs"]
pub mod files;
#[path = "../../../collector/src/interpolate.rs"]
pub mod interpolate;
#[path = "../../../collector/src/label_bounds.rs"]
pub mod label_bounds;
#[path = "../../../collector/src/routing_schema.rs"]
pub mod routing_schema;
#[path = "../../../collector/src/yaml_depth.rs"]
pub mod yaml_depth;

/// What the collector does with a configuration file's text: `${VAR}`
/// interpolation (through `env`), parsing, validation. The error, if any, as
/// the collector prints it.
pub fn load(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    config::Config::from_text(text, env)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
