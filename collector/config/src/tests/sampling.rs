//! `sampling:`: the issue's example parses into the sampler's policies,
//! and every bad value is refused naming its key.

use crate::*;
use hermes_sampling::Rule;

const EXAMPLE: &str = r#"
sampling:
  policies:
    - {name: errors, type: status_code}
    - {name: slow, type: latency, threshold_ms: 30000}
    - {name: costly, type: numeric_attribute, key: hermes.turn.usage.input_tokens, min_value: 100000}
    - {name: denied, type: string_attribute, key: hermes.approval.choice, values: [deny, smart_deny]}
    - {name: some, type: probabilistic, percent: 10}
    - {name: budget, type: rate_limiting, turns_per_second: 50}
    - name: slow_errors
      type: and
      policies:
        - {type: status_code}
        - {type: latency, threshold_ms: 1000}
"#;

#[test]
fn the_example_becomes_the_samplers_policies_in_order() {
    let c = Config::from_yaml(EXAMPLE).unwrap();
    let settings = c.sampling_settings();
    let names: Vec<&str> = settings.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "errors",
            "slow",
            "costly",
            "denied",
            "some",
            "budget",
            "slow_errors"
        ]
    );
    assert_eq!(
        settings.policies[1].rule,
        Rule::Latency {
            threshold_nanos: 30_000_000_000
        }
    );
    assert_eq!(
        settings.policies[2].rule,
        Rule::NumericAttribute {
            key: "hermes.turn.usage.input_tokens".into(),
            min: Some(100_000.0),
            max: None
        }
    );
    assert_eq!(
        settings.policies[6].rule,
        Rule::And(vec![
            Rule::StatusCode,
            Rule::Latency {
                threshold_nanos: 1_000_000_000
            }
        ])
    );
    assert_eq!(settings.max_wait_nanos, 3600 * 1_000_000_000);
}

#[test]
fn without_the_section_every_turn_is_kept() {
    let c = Config::from_yaml("").unwrap();
    assert!(c.sampling.is_none());
    assert!(c.sampling_settings().policies.is_empty());
}

#[test]
fn bad_sampling_values_name_their_key() {
    let policy = |p: &str| {
        format!("sampling:\n  policies:\n    - {{name: ok, type: status_code}}\n    - {p}\n")
    };
    let cases = [
        ("sampling: {}\n".to_owned(), "sampling.policies"),
        (
            "sampling:\n  max_held_spans: 0\n  policies: [{name: e, type: status_code}]\n"
                .to_owned(),
            "sampling.max_held_spans",
        ),
        (policy("{type: status_code}"), "sampling.policies[1].name"),
        (
            policy("{name: ok, type: status_code}"),
            "sampling.policies[1].name",
        ),
        (
            policy("{name: p, type: probabilistic, percent: 150}"),
            "sampling.policies[1].percent",
        ),
        (
            policy("{name: p, type: probabilistic, percent: 0}"),
            "sampling.policies[1].percent",
        ),
        (
            policy("{name: l, type: latency, threshold_ms: 0}"),
            "sampling.policies[1].threshold_ms",
        ),
        (
            policy("{name: n, type: numeric_attribute, key: k}"),
            "sampling.policies[1].min_value",
        ),
        (
            policy("{name: n, type: numeric_attribute, key: k, min_value: 5, max_value: 1}"),
            "sampling.policies[1].max_value",
        ),
        (
            policy("{name: n, type: numeric_attribute, key: '', min_value: 5}"),
            "sampling.policies[1].key",
        ),
        (
            policy("{name: s, type: string_attribute, key: k, values: []}"),
            "sampling.policies[1].values",
        ),
        (
            policy("{name: r, type: rate_limiting, turns_per_second: 0}"),
            "sampling.policies[1].turns_per_second",
        ),
        (
            policy(
                "{name: a, type: and, policies: [{type: status_code}, {type: probabilistic, percent: -1}]}",
            ),
            "sampling.policies[1].policies[1].percent",
        ),
        (
            policy("{name: a, type: and, policies: [{type: rate_limiting, turns_per_second: 1}]}"),
            "sampling.policies[1].policies[0].type",
        ),
        (
            policy("{name: a, type: and, policies: []}"),
            "sampling.policies[1].policies",
        ),
    ];
    for (yaml, path) in cases {
        let e = Config::from_yaml(&yaml).unwrap_err();
        assert_eq!(e.path, path, "{yaml} -> {e}");
    }
    // What serde refuses names the policy: an unknown type or key.
    for bad in [
        policy("{name: x, type: sometimes}"),
        policy("{name: x, type: latency, threshold: 5}"),
    ] {
        let e = Config::from_yaml(&bad).unwrap_err();
        assert!(e.path.starts_with("sampling.policies"), "{bad} -> {e}");
    }
}

#[test]
fn the_schema_takes_the_example_and_refuses_bad_policies() {
    let schema: serde_json::Value = serde_json::from_str(&json_schema().unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let yaml = |text: &str| -> serde_json::Value { serde_yaml::from_str(text).unwrap() };
    let errors: Vec<String> = validator
        .iter_errors(&yaml(EXAMPLE))
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    for bad in [
        "sampling:\n  policies: [{name: x, type: sometimes}]\n",
        "sampling:\n  policies: [{name: x, type: latency}]\n",
        "sampling:\n  policies: [{name: x, type: probabilistic, percent: 101}]\n",
        "sampling:\n  policy: []\n",
    ] {
        assert!(
            !validator.is_valid(&yaml(bad)),
            "the schema accepts {bad:?}"
        );
    }
}
