use super::bad_pems;
use crate::*;

fn otlp(extra: &str) -> Result<Config, ConfigError> {
    Config::from_yaml(&format!(
        "exporters:\n  otlp:\n    endpoint: https://otlp.example.com:4317\n{extra}"
    ))
}

#[test]
fn header_files_are_read_trimmed_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authorization");
    std::fs::write(&file, "Basic czNjcmV0\n").unwrap();
    let c = Config::parse_yaml(&format!(
        "exporters:\n  otlp:\n    endpoint: http://127.0.0.1:4317\n    headers:\n      x-tenant: t1\n    header_files:\n      authorization: {}\n",
        file.display()
    ))
    .unwrap();
    c.validate_with(&|_| None).unwrap();
    let otlp = c.exporters.otlp.as_ref().unwrap();
    let headers = otlp.all_headers().unwrap();
    assert!(headers.contains(&("authorization".into(), "Basic czNjcmV0".into())));
    assert!(headers.contains(&("x-tenant".into(), "t1".into())));
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("czNjcmV0") && !debug.contains("t1\""),
        "{debug}"
    );

    // Missing, empty, not a header value, or set twice: errors naming
    // the key, never the value.
    let key = "exporters.otlp.header_files.authorization";
    for (content, reason) in [
        (None, "cannot read"),
        (Some(" \n"), "is empty"),
        (Some("czNjcmV0\nline two"), "not a valid header value"),
    ] {
        match content {
            Some(text) => std::fs::write(&file, text).unwrap(),
            None => std::fs::remove_file(&file).unwrap(),
        }
        let e = c.validate_with(&|_| None).unwrap_err();
        assert_eq!(e.path, key, "{e}");
        assert!(e.reason.contains(reason), "{e}");
        assert!(!e.to_string().contains("czNjcmV0"), "{e}");
    }
    let twice = Config::from_yaml(&format!(
        "exporters:\n  otlp:\n    endpoint: http://x:4317\n    headers:\n      Authorization: a\n    header_files:\n      authorization: {}\n",
        file.display()
    ))
    .unwrap_err();
    assert_eq!(twice.path, key, "{twice}");
}

#[test]
fn tls_files_are_checked_naming_the_key() {
    let pems = bad_pems();
    let (not_pem, bad_pem, missing) = (&pems.not_pem, &pems.bad_pem, &pems.missing);
    let tls = |body: String| otlp(&format!("    tls:\n{body}")).unwrap_err();
    let e = tls(format!("      ca_file: {}\n", missing.display()));
    assert_eq!(e.path, "exporters.otlp.tls.ca_file", "{e}");
    let e = tls(format!("      ca_file: {}\n", not_pem.display()));
    assert_eq!(e.path, "exporters.otlp.tls.ca_file", "{e}");
    let e = tls(format!("      ca_file: {}\n", bad_pem.display()));
    assert_eq!(e.path, "exporters.otlp.tls", "{e}");
    assert!(e.reason.contains("CA file"), "{e}");
    let e = tls(format!(
        "      ca_file: {}\n      key_file: {}\n",
        bad_pem.display(),
        missing.display()
    ));
    assert_eq!(e.path, "exporters.otlp.tls.key_file", "{e}");
    let e = tls("      ca_file: x\n      insecure: true\n".into());
    assert_eq!(e.path, "exporters.otlp.tls.insecure", "{e}");

    // TLS settings with a plaintext endpoint are refused.
    let e = Config::from_yaml(&format!(
        "exporters:\n  otlp:\n    endpoint: http://x:4317\n    tls:\n      ca_file: {}\n",
        bad_pem.display()
    ))
    .unwrap_err();
    assert_eq!(e.path, "exporters.otlp.tls", "{e}");
    assert!(e.reason.contains("https://"), "{e}");
}

#[test]
fn receiver_limits_must_be_positive() {
    for key in [
        "max_event_bytes",
        "stream_events_per_sec",
        "stream_burst_events",
    ] {
        let e = Config::from_yaml(&format!("receiver:\n  {key}: 0\n")).unwrap_err();
        assert_eq!(e.path, format!("receiver.{key}"), "{e}");
    }
    let c = Config::from_yaml("receiver:\n  stream_events_per_sec: 50\n").unwrap();
    assert_eq!(c.receiver.stream_events_per_sec, 50);
    assert_eq!(c.receiver.max_event_bytes, 1024 * 1024);
}
