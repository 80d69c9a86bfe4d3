//! Tests of the shim configuration.

use super::*;
use std::collections::HashMap;

fn parse(vars: &[(&str, &str)]) -> (ShimConfig, Vec<ConfigWarning>) {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    ShimConfig::from_lookup(|k| env.get(k).cloned())
}

/// `var=value` alone gives exactly one warning.
fn assert_one_warning(var: &str, value: &str) {
    let (_, warnings) = parse(&[(var, value)]);
    assert_eq!(warnings.len(), 1, "{var}={value:?}: {warnings:?}");
}

#[test]
fn defaults() {
    let (config, warnings) = parse(&[]);
    assert!(warnings.is_empty());
    assert_eq!(config, ShimConfig::default());
    assert_eq!(config.endpoint.url, "http://127.0.0.1:4319");
    assert_eq!(config.endpoint.token, None);
    assert_eq!(config.service_name, "hermes-agent");
    assert_eq!(config.capture, CaptureLevel::Metadata);
    assert_eq!(config.queue_events, 65_536);
    assert_eq!(config.exit_flush_ms, 2_000);
    assert!(!config.disabled);
    assert_eq!(config.spool_dir, None);
    assert_eq!(config.spool_max_bytes, 64 << 20);
    assert_eq!(config.hosts_file, None);
    assert_eq!(config.resolve_secs, 30);
}

#[test]
fn fleet_settings() {
    let (config, warnings) = parse(&[
        (ENV_ENDPOINT, " dns:///collector.obs.svc:4319 "),
        (ENV_HOSTS_FILE, "/etc/hermes/hosts"),
        (ENV_RESOLVE_SECS, "5"),
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.endpoint.url, "dns:///collector.obs.svc:4319");
    assert_eq!(
        config.hosts_file.as_deref(),
        Some(std::path::Path::new("/etc/hermes/hosts"))
    );
    assert_eq!(config.resolve_secs, 5);
    assert_one_warning(ENV_ENDPOINT, "dns:///collector");
    assert_one_warning(ENV_RESOLVE_SECS, "0");
}

#[test]
fn spool_settings() {
    let (config, warnings) = parse(&[
        (ENV_SPOOL_DIR, " /var/spool/hermes "),
        (ENV_SPOOL_MAX_BYTES, "1048576"),
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        config.spool_dir.as_deref(),
        Some(std::path::Path::new("/var/spool/hermes"))
    );
    assert_eq!(config.spool_max_bytes, 1 << 20);
    let (config, warnings) = parse(&[(ENV_SPOOL_DIR, "relative/dir"), (ENV_SPOOL_MAX_BYTES, "0")]);
    assert_eq!(config.spool_dir, None);
    assert_eq!(config.spool_max_bytes, DEFAULT_SPOOL_MAX_BYTES);
    let vars: Vec<_> = warnings.iter().map(|w| w.var).collect();
    assert_eq!(vars, [ENV_SPOOL_DIR, ENV_SPOOL_MAX_BYTES]);
}

#[test]
fn valid_values() {
    let (config, warnings) = parse(&[
        (ENV_ENDPOINT, "http://10.1.2.3:5000"),
        (ENV_SERVICE_NAME, "svc"),
        (ENV_CAPTURE, "Content"),
        (ENV_QUEUE_EVENTS, "16"),
        (ENV_EXIT_FLUSH_MS, "0"),
        (ENV_DISABLED, "yes"),
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.endpoint.url, "http://10.1.2.3:5000");
    assert_eq!(config.service_name, "svc");
    assert_eq!(config.capture, CaptureLevel::Content);
    assert_eq!(config.queue_events, 16);
    assert_eq!(config.exit_flush_ms, 0);
    assert!(config.disabled);
}

#[test]
fn bad_values_warn_and_use_defaults() {
    let (config, warnings) = parse(&[
        (ENV_ENDPOINT, "grpc://nowhere"),
        (ENV_CAPTURE, "everything"),
        (ENV_QUEUE_EVENTS, "0"),
        (ENV_EXIT_FLUSH_MS, "-5"),
        (ENV_DISABLED, "maybe"),
    ]);
    assert_eq!(config, ShimConfig::default());
    let vars: Vec<_> = warnings.iter().map(|w| w.var).collect();
    assert_eq!(
        vars,
        [
            ENV_DISABLED,
            ENV_ENDPOINT,
            ENV_CAPTURE,
            ENV_QUEUE_EVENTS,
            ENV_EXIT_FLUSH_MS
        ]
    );
    let text = warnings[2].to_string();
    assert!(
        text.contains("HERMES_COLLECTOR_CAPTURE=\"everything\""),
        "{text}"
    );
    assert!(text.contains("metadata"), "{text}");
    assert_one_warning(ENV_ENDPOINT, "not a uri");
    assert_one_warning(ENV_QUEUE_EVENTS, "99999999999");
}

#[test]
fn unix_socket_endpoints() {
    let (config, warnings) = parse(&[(ENV_ENDPOINT, " unix:/run/hermes/ingest.sock ")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.endpoint.url, "unix:/run/hermes/ingest.sock");
    assert_one_warning(ENV_ENDPOINT, "unix:");
}

#[test]
fn token_from_the_environment_or_a_file() {
    let (config, warnings) = parse(&[(ENV_TOKEN, " s3cret\n")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        config.endpoint.token.as_ref().map(Token::expose),
        Some("s3cret")
    );
    assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-file\n").unwrap();
    let path = file.to_string_lossy().into_owned();
    let (config, warnings) = parse(&[(ENV_TOKEN_FILE, &path), (ENV_TOKEN, "s3cret")]);
    assert_eq!(
        config.endpoint.token.as_ref().map(Token::expose),
        Some("from-file"),
        "the file wins"
    );
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].var, ENV_TOKEN);
    assert!(
        !warnings[0].to_string().contains("s3cret"),
        "{}",
        warnings[0]
    );
}

#[test]
fn bad_tokens_warn_without_showing_them() {
    let (config, warnings) = parse(&[(ENV_TOKEN, "two s3cret words")]);
    assert_eq!(config.endpoint.token, None);
    assert_eq!(warnings.len(), 1);
    assert!(
        !warnings[0].to_string().contains("s3cret"),
        "{}",
        warnings[0]
    );

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    for path in [empty, dir.path().join("missing")] {
        let (config, warnings) = parse(&[(ENV_TOKEN_FILE, &path.to_string_lossy())]);
        assert_eq!(config.endpoint.token, None);
        assert_eq!(warnings.len(), 1, "{path:?}");
        assert_eq!(warnings[0].var, ENV_TOKEN_FILE);
    }
}

#[test]
fn tls_files_for_https_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let pem = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!("-----BEGIN {name}-----\nAA==\n-----END {name}-----\n"),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    };
    let (ca, cert, key) = (pem("CA"), pem("CERT"), pem("KEY"));
    let (config, warnings) = parse(&[
        (ENV_ENDPOINT, "https://collector:4319"),
        (ENV_TLS_CA_FILE, &ca),
        (ENV_TLS_CERT_FILE, &cert),
        (ENV_TLS_KEY_FILE, &key),
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let tls = config.endpoint.tls.as_ref().unwrap();
    assert!(tls.ca_pem.starts_with(b"-----BEGIN CA"));
    assert!(tls.identity.is_some());
    assert!(!format!("{config:?}").contains("BEGIN KEY"), "{config:?}");

    // https without a CA: warned, and nothing will be sent in plaintext.
    let (config, warnings) = parse(&[(ENV_ENDPOINT, "https://collector:4319")]);
    assert_eq!(config.endpoint.url, "https://collector:4319");
    assert_eq!(config.endpoint.tls, None);
    assert_eq!(warnings.len(), 1);
    // TLS files with a plaintext endpoint, a certificate without its key,
    // a file that is not PEM: warned.
    let (config, warnings) = parse(&[(ENV_TLS_CA_FILE, &ca)]);
    assert_eq!(config.endpoint.tls, None);
    assert_eq!(warnings.len(), 1);
    let (config, warnings) = parse(&[
        (ENV_ENDPOINT, "https://collector:4319"),
        (ENV_TLS_CA_FILE, &ca),
        (ENV_TLS_CERT_FILE, &cert),
    ]);
    assert_eq!(config.endpoint.tls.as_ref().unwrap().identity, None);
    assert_eq!(warnings.len(), 1);
    let not_pem = dir.path().join("not-pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let (_, warnings) = parse(&[
        (ENV_ENDPOINT, "https://collector:4319"),
        (ENV_TLS_CA_FILE, &not_pem.to_string_lossy()),
    ]);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
}

#[test]
fn empty_means_unset() {
    let (config, warnings) = parse(&[(ENV_CAPTURE, " "), (ENV_ENDPOINT, "")]);
    assert!(warnings.is_empty());
    assert_eq!(config, ShimConfig::default());
}

#[test]
fn hooks_per_level() {
    assert_eq!(CaptureLevel::Metadata.hooks().len(), 15);
    assert_eq!(
        CaptureLevel::Content.hooks(),
        CaptureLevel::Metadata.hooks()
    );
    let lean = CaptureLevel::Lean.hooks();
    assert_eq!(lean.len(), 14);
    assert!(!lean.contains(&hooks::PRE_API_REQUEST));
    for level in [
        CaptureLevel::Lean,
        CaptureLevel::Metadata,
        CaptureLevel::Content,
    ] {
        assert!(level.hooks().iter().all(|h| !h.starts_with("transform_")));
    }
    for hook in METADATA_HOOKS {
        assert!(hook == hooks::PRE_API_REQUEST || lean.contains(&hook));
    }
}
