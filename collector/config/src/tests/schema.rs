use crate::*;
use std::path::Path;

const REGENERATE: &str = "cargo run -p hermes-collector -- schema > config/collector.schema.json";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn validator() -> jsonschema::Validator {
    let schema: serde_json::Value = serde_json::from_str(&json_schema().unwrap()).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

/// The errors of `instance` against the schema, one a line.
fn errors(validator: &jsonschema::Validator, instance: &serde_json::Value) -> String {
    validator
        .iter_errors(instance)
        .map(|e| format!("{}: {e}\n", e.instance_path()))
        .collect()
}

fn yaml(text: &str) -> serde_json::Value {
    serde_yaml::from_str(text).unwrap()
}

/// `deploy/**/collector*.yaml`, and the recipes of `deploy/README.md`
/// (a ```yaml block right after `<!-- validate: collector-config -->`),
/// as `deploy/validate.sh` finds them.
fn deploy_configs() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                walk(&path, out);
            } else if name.starts_with("collector") && name.ends_with(".yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path.display().to_string(), text));
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("deploy"), &mut out);
    let readme = std::fs::read_to_string(repo().join("deploy/README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "<!-- validate: collector-config -->" {
            assert_eq!(lines[i + 1].trim(), "```yaml", "deploy/README.md:{}", i + 2);
            let body: Vec<&str> = lines[i + 2..]
                .iter()
                .take_while(|l| l.trim() != "```")
                .copied()
                .collect();
            out.push((format!("deploy/README.md:{}", i + 3), body.join("\n")));
        }
    }
    assert!(out.len() >= 6, "found too few deploy configs: {out:?}");
    out
}

#[test]
fn checked_in_schema_is_current() {
    let path = repo().join("config/collector.schema.json");
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = format!("{}\n", json_schema().unwrap());
    assert!(
        checked_in == generated,
        "config/collector.schema.json differs from the configuration structs; regenerate it with\n\n    {REGENERATE}\n"
    );
}

#[test]
fn schema_accepts_the_example_and_the_deploy_configs() {
    let validator = validator();
    let example = std::fs::read_to_string(repo().join("config/collector.yaml")).unwrap();
    let mut configs = vec![("config/collector.yaml".to_owned(), example)];
    configs.extend(deploy_configs());
    for (name, text) in configs {
        let instance = yaml(&text);
        let errors = errors(&validator, &instance);
        assert!(errors.is_empty(), "{name}:\n{errors}");
        // And the collector takes them (the schema is not looser there).
        Config::parse_yaml(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn schema_accepts_every_key_and_rejects_what_the_collector_rejects() {
    let validator = validator();
    // Every key, indented as a block (YAML allows an indented root).
    let full = yaml(
        r#"
        receiver:
          listen: unix:/run/hermes/ingest.sock
          auth: {token_env: T}
          tls: {cert_file: c.pem, key_file: k.pem, client_ca_file: ca.pem}
        exporters:
          otlp:
            endpoint: http://x:4318
            protocol: http/protobuf
            headers: {a: b}
            compression: gzip
          otlp_metrics:
            endpoint: http://x:4317
            protocol: grpc
            headers: {a: b}
            interval_ms: 1000
            timeout_ms: 500
            compression: gzip
            temporality: delta
          file: {path: x.jsonl}
          console: {enabled: false}
        processing:
          attribute_sets: [gen_ai, openinference, langfuse]
          max_attribute_bytes: null
        log: {format: json}
        "#,
    );
    assert_eq!(errors(&validator, &full), "");
    for bad in [
        "receivers: {}\n",
        "exporters:\n  otlp:\n    endpont: http://x\n",
        "exporters:\n  otlp:\n    endpoint: http://x\n    protocol: udp\n",
        "exporters:\n  otlp_metrics:\n    interval_ms: 1000\n",
        "exporters:\n  otlp_metrics:\n    endpoint: http://x\n    temporality: sometimes\n",
        "batch:\n  max_spans: 0\n",
        "batch:\n  max_spans: lots\n",
        "shutdown:\n  grace_ms: 60000\n",
        "processing:\n  attribute_sets: [phoenix]\n",
        "processing:\n  redaction:\n    keys: []\n",
        "processing:\n  max_attribute_bytes: 8\n",
        "log:\n  format: xml\n",
    ] {
        assert!(
            !validator.is_valid(&yaml(bad)),
            "the schema accepts {bad:?}"
        );
    }
}

#[test]
fn processing_schema_matches_the_processor() {
    let validator = validator();
    let processor = hermes_processor::ProcessorConfig {
        attribute_sets: vec![
            hermes_processor::AttributeSet::GenAi,
            hermes_processor::AttributeSet::OpenInference,
            hermes_processor::AttributeSet::Langfuse,
        ],
        ..Default::default()
    };
    let serialized = serde_json::to_value(&processor).unwrap();
    let instance = serde_json::json!({ "processing": serialized });
    assert_eq!(
        errors(&validator, &instance),
        "",
        "a processor key is missing from ProcessingSchema"
    );

    let schema: serde_json::Value = serde_json::from_str(&json_schema().unwrap()).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let defs = &schema["$defs"];
    assert_eq!(
        keys(&defs["ProcessorConfig"]["properties"]),
        keys(&serialized)
    );
    assert_eq!(
        keys(&defs["RedactionConfig"]["properties"]),
        keys(&serialized["redaction"])
    );
    // The defaults in the schema are the processor's.
    let defaults = serde_json::to_value(hermes_processor::ProcessorConfig::default()).unwrap();
    for (key, value) in defaults["redaction"].as_object().unwrap() {
        assert_eq!(
            &defs["RedactionConfig"]["properties"][key]["default"], value,
            "{key}"
        );
    }
    assert_eq!(
        defs["ProcessorConfig"]["properties"]["attribute_sets"]["default"],
        defaults["attribute_sets"]
    );
    assert_eq!(
        keys(&defs["RoutingConfig"]["properties"]),
        keys(&serialized["routing"])
    );
    assert_eq!(
        keys(&defs["LangfuseRoutingConfig"]["properties"]),
        keys(&serialized["routing"]["langfuse"])
    );
    assert_eq!(
        defs["RoutingConfig"]["properties"]["project_name"]["default"],
        defaults["routing"]["project_name"]
    );
    for (key, value) in defaults["routing"]["langfuse"].as_object().unwrap() {
        assert_eq!(
            &defs["LangfuseRoutingConfig"]["properties"][key]["default"], value,
            "{key}"
        );
    }
}
