use crate::*;

#[test]
fn an_error_names_the_variable_not_its_secret_value() {
    let env = |name: &str| (name == "TOKEN").then(|| "s3cret-token".to_owned());
    let text = "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    protocol: \"http/p${TOKEN}\"\n";
    let e = Config::from_text(text, &env).unwrap_err();
    let shown = e.to_string();
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("${TOKEN}"), "{shown}");
    assert_eq!(e.path, "exporters.otlp.protocol");
}

#[test]
fn empty_file_is_the_embedded_default() {
    let c = Config::from_yaml("").unwrap();
    assert!(c.is_embedded_default());
    assert_eq!(c.receiver.listen, "127.0.0.1:4319");
}

#[test]
fn example_config_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/collector.yaml");
    let c = Config::from_file(&path).unwrap();
    assert_eq!(c, Config::default(), "the example documents the defaults");
}

#[test]
fn unknown_key_names_its_path() {
    let e = Config::from_yaml("exporters:\n  otlp:\n    endpoint: http://x:4317\n    endpont: y\n")
        .unwrap_err();
    assert_eq!(e.path, "exporters.otlp.endpont");
    assert!(e.reason.contains("endpont"), "{e}");
}

#[test]
fn bad_values_name_their_path() {
    let cases = [
        ("receiver:\n  listen: nowhere\n", "receiver.listen"),
        ("admin:\n  listen: 13133\n", "admin.listen"),
        ("batch:\n  max_spans: 0\n", "batch.max_spans"),
        ("batch:\n  max_spans: lots\n", "batch.max_spans"),
        (
            "exporters:\n  otlp:\n    endpoint: ftp://x\n",
            "exporters.otlp.endpoint",
        ),
        (
            "exporters:\n  otlp:\n    endpoint: http://x:4317\n    protocol: udp\n",
            "exporters.otlp.protocol",
        ),
        ("shutdown:\n  grace_ms: 60000\n", "shutdown.grace_ms"),
        (
            "receiver:\n  max_events_per_batch: 65537\n",
            "receiver.max_events_per_batch",
        ),
        (
            "exporters:\n  atif:\n    dir: /nonexistent/trajectories\n",
            "exporters.atif.dir",
        ),
        (
            "exporters:\n  atif:\n    dir: /tmp\n    idle_ms: 0\n",
            "exporters.atif.idle_ms",
        ),
        (
            "exporters:\n  atif:\n    dir: /tmp\n    idle: 5\n",
            "exporters.atif.idle",
        ),
        (
            "exporters:\n  atif:\n    dir: /tmp\n    otlp_logs:\n      endpoint: ftp://x\n",
            "exporters.atif.otlp_logs.endpoint",
        ),
        (
            "exporters:\n  atif:\n    dir: /tmp\n    otlp_logs:\n      endpoint: http://x:4317\n      timeout_ms: 0\n",
            "exporters.atif.otlp_logs.timeout_ms",
        ),
        (
            "exporters:\n  atif:\n    dir: /tmp\n    otlp_logs:\n      endpoint: http://x:4317\n      headers:\n        bad name: v\n",
            "exporters.atif.otlp_logs.headers.bad name",
        ),
        (
            "exporters:\n  atif:\n    dir: /tmp\n    otlp_logs:\n      endpoint: http://x:4318\n      tls:\n        server_name: x\n",
            "exporters.atif.otlp_logs.tls",
        ),
        (
            "runtime:\n  worker_threads: 100000\n",
            "runtime.worker_threads",
        ),
        ("runtime:\n  worker_threads: -1\n", "runtime.worker_threads"),
        ("runtime:\n  threads: 2\n", "runtime.threads"),
        ("runtime:\n  pipeline: one_thread\n", "runtime.pipeline"),
        (
            "processing:\n  redaction:\n    value_patterns: ['ok', '(unclosed']\n",
            "processing.redaction.value_patterns[1]",
        ),
        (
            "processing:\n  attribute_sets: [phoenix]\n",
            "processing.attribute_sets[0]",
        ),
        (
            "processing:\n  routing:\n    langfuse:\n      tags: [ok, '{service.name']\n",
            "processing.routing.langfuse.tags[1]",
        ),
    ];
    for (yaml, path) in cases {
        let e = Config::from_yaml(yaml).unwrap_err();
        assert_eq!(e.path, path, "{yaml} -> {e}");
    }
}

#[test]
fn the_atif_exporter_takes_a_directory_and_keeps_the_span_default() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!("exporters:\n  atif:\n    dir: {}\n", dir.path().display());
    let c = Config::from_yaml(&yaml).unwrap();
    let atif = c.exporters.atif.as_ref().unwrap();
    assert_eq!(atif.dir, dir.path());
    assert_eq!(atif.idle_ms, 300_000);
    assert!(
        c.is_embedded_default(),
        "trajectories do not replace the span sinks"
    );
    assert!(c.validate_with(&no_env).unwrap().atif_logs.is_none());
}

#[test]
fn the_atif_log_export_takes_the_otlp_exporter_keys() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "exporters:\n  atif:\n    dir: {}\n    otlp_logs:\n      endpoint: http://127.0.0.1:4318\n      protocol: http/protobuf\n      headers:\n        x-api-key: k\n      max_elapsed_secs: 7\n",
        dir.path().display()
    );
    let c = Config::from_yaml(&yaml).unwrap();
    let logs = c.validate_with(&no_env).unwrap().atif_logs.unwrap();
    assert_eq!(logs.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(logs.endpoint, "http://127.0.0.1:4318");
    assert_eq!(logs.headers, [("x-api-key".to_owned(), "k".to_owned())]);
    let atif = c.exporters.atif.as_ref().unwrap();
    assert_eq!(atif.otlp_logs.as_ref().unwrap().max_elapsed_secs, 7);
}

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn token_file_is_read_trimmed_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret-token\n").unwrap();
    let yaml = format!("receiver:\n  auth:\n    token_file: {}\n", file.display());
    let c = Config::parse_yaml(&yaml).unwrap();
    c.validate_with(&no_env).unwrap();
    assert!(c.receiver.auth.token(&no_env).unwrap().is_some());

    // Empty, unreadable, or with characters a header cannot carry.
    for content in ["", " \n", "two words"] {
        std::fs::write(&file, content).unwrap();
        let e = c.validate_with(&no_env).unwrap_err();
        assert_eq!(e.path, "receiver.auth.token_file", "{content:?}: {e}");
    }
    std::fs::write(&file, "two s3cret-words").unwrap();
    let e = c.validate_with(&no_env).unwrap_err();
    assert!(
        !e.to_string().contains("s3cret"),
        "never shows the token: {e}"
    );
    let missing = dir.path().join("missing");
    let yaml = format!(
        "receiver:\n  auth:\n    token_file: {}\n",
        missing.display()
    );
    let e = Config::parse_yaml(&yaml)
        .unwrap()
        .validate_with(&no_env)
        .unwrap_err();
    assert_eq!(e.path, "receiver.auth.token_file", "{e}");
    assert!(e.reason.contains("cannot read"), "{e}");
}

#[test]
fn token_env_is_looked_up() {
    let c = Config::parse_yaml("receiver:\n  auth:\n    token_env: INGEST_TOKEN\n").unwrap();
    let e = c.validate_with(&no_env).unwrap_err();
    assert_eq!(e.path, "receiver.auth.token_env");
    assert!(e.reason.contains("INGEST_TOKEN"), "{e}");
    let set = |name: &str| (name == "INGEST_TOKEN").then(|| "abc123".to_owned());
    c.validate_with(&set).unwrap();
    let empty = |_: &str| Some(String::new());
    assert_eq!(
        c.validate_with(&empty).unwrap_err().path,
        "receiver.auth.token_env"
    );
    assert!(!format!("{c:?}").contains("abc123"));
}

#[test]
fn token_file_and_env_exclude_each_other() {
    let c =
        Config::parse_yaml("receiver:\n  auth:\n    token_file: /etc/hostname\n    token_env: X\n")
            .unwrap();
    let e = c.validate_with(&|_| Some("x".into())).unwrap_err();
    assert_eq!(e.path, "receiver.auth");
    let e = Config::from_yaml("receiver:\n  auth:\n    token: x\n").unwrap_err();
    assert_eq!(e.path, "receiver.auth.token");
}

/// PEM files that fail to load, each in its own way, in a directory that
/// lives as long as the struct.
struct BadPems {
    /// Not PEM at all.
    not_pem: PathBuf,
    /// PEM whose certificate does not parse.
    bad_pem: PathBuf,
    /// A path with no file.
    missing: PathBuf,
    _dir: tempfile::TempDir,
}

fn bad_pems() -> BadPems {
    let dir = tempfile::tempdir().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let bad_pem = dir.path().join("bad.pem");
    std::fs::write(
        &bad_pem,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    BadPems {
        missing: dir.path().join("missing.pem"),
        not_pem,
        bad_pem,
        _dir: dir,
    }
}

#[test]
fn tls_files_are_checked_naming_the_key() {
    let pems = bad_pems();
    let (not_pem, bad_pem, missing) = (&pems.not_pem, &pems.bad_pem, &pems.missing);
    let tls = |cert: &Path, key: &Path, ca: Option<&Path>| {
        let mut yaml = format!(
            "receiver:\n  tls:\n    cert_file: {}\n    key_file: {}\n",
            cert.display(),
            key.display()
        );
        if let Some(ca) = ca {
            yaml.push_str(&format!("    client_ca_file: {}\n", ca.display()));
        }
        Config::from_yaml(&yaml).unwrap_err()
    };
    assert_eq!(tls(missing, bad_pem, None).path, "receiver.tls.cert_file");
    assert_eq!(tls(bad_pem, not_pem, None).path, "receiver.tls.key_file");
    assert_eq!(
        tls(bad_pem, bad_pem, Some(missing)).path,
        "receiver.tls.client_ca_file"
    );
    let e = tls(bad_pem, bad_pem, None);
    assert_eq!(e.path, "receiver.tls", "{e}");
    let e = Config::from_yaml("receiver:\n  tls:\n    cert_file: x\n").unwrap_err();
    assert!(e.reason.contains("key_file"), "{e}");
}

#[test]
fn unix_listen_needs_an_existing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let ok = format!(
        "receiver:\n  listen: unix:{}/ingest.sock\n",
        dir.path().display()
    );
    let c = Config::from_yaml(&ok).unwrap();
    assert_eq!(
        c.receiver.listen_addr().unwrap(),
        ListenAddr::Unix(dir.path().join("ingest.sock"))
    );
    let bad = format!(
        "receiver:\n  listen: unix:{}/nowhere/ingest.sock\n",
        dir.path().display()
    );
    let e = Config::from_yaml(&bad).unwrap_err();
    assert_eq!(e.path, "receiver.listen");
    assert!(e.reason.contains("does not exist"), "{e}");
    let e = Config::from_yaml("receiver:\n  listen: 'unix:'\n").unwrap_err();
    assert_eq!(e.path, "receiver.listen");
}

#[test]
fn the_metrics_token_follows_the_ingest_token_rules_under_its_own_key() {
    let c = Config::parse_yaml("admin:\n  metrics_auth:\n    token_env: SCRAPE_TOKEN\n").unwrap();
    let e = c.validate_with(&no_env).unwrap_err();
    assert_eq!(e.path, "admin.metrics_auth.token_env");
    let set = |name: &str| (name == "SCRAPE_TOKEN").then(|| "scr4pe".to_owned());
    c.validate_with(&set).unwrap();
    let spaced = |_: &str| Some("two words".to_owned());
    let e = c.validate_with(&spaced).unwrap_err();
    assert_eq!(e.path, "admin.metrics_auth.token_env");
    assert!(!e.to_string().contains("two words"), "{e}");
    let c = Config::parse_yaml(
        "admin:\n  metrics_auth:\n    token_file: /nonexistent/token\n    token_env: X\n",
    )
    .unwrap();
    let e = c.validate_with(&|_| Some("x".into())).unwrap_err();
    assert_eq!(e.path, "admin.metrics_auth");
    let c = Config::parse_yaml("admin:\n  metrics_auth:\n    token_file: /nonexistent/token\n")
        .unwrap();
    let e = c.validate_with(&no_env).unwrap_err();
    assert_eq!(e.path, "admin.metrics_auth.token_file");
}

#[test]
fn metric_label_bounds_are_checked() {
    let c = Config::parse_yaml("").unwrap();
    assert_eq!(c.metrics.bounds(), Bounds::default());
    for (yaml, path) in [
        (
            "metrics:\n  max_label_value_bytes: 0\n",
            "metrics.max_label_value_bytes",
        ),
        (
            "metrics:\n  max_label_values: 0\n",
            "metrics.max_label_values",
        ),
        ("metrics:\n  max_series: 0\n", "metrics.max_series"),
        ("metrics:\n  max_series: 10001\n", "metrics.max_series"),
        (
            "metrics:\n  max_label_value_bytes: 1025\n",
            "metrics.max_label_value_bytes",
        ),
    ] {
        let e = Config::parse_yaml(yaml)
            .unwrap()
            .validate_with(&no_env)
            .unwrap_err();
        assert_eq!(e.path, path, "{yaml}");
    }
    let c = Config::parse_yaml(
        "metrics:\n  max_label_value_bytes: 64\n  max_label_values: 20\n  max_series: 50\n",
    )
    .unwrap();
    c.validate_with(&no_env).unwrap();
    assert_eq!(
        c.metrics.bounds(),
        Bounds {
            max_value_bytes: 64,
            max_values: 20,
            max_series: 50
        }
    );
}

mod export_security;
mod sampling;
mod schema;
mod validated;
