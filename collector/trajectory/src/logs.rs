//! Each trajectory file also sent as one OTLP log record
//! (`exporters.atif.otlp_logs`).
//!
//! Owns: the record a written file becomes ([`Finished`] → [`request`]),
//! and the sender task that delivers them one by one with the span
//! exporters' transports and backoff ([`hermes_exporter::LogsExporter`]).
//!
//! The record: body, the trajectory JSON as a string (the file's content
//! when it was written; a later `continued_trajectory_ref` added to the
//! file is not sent again, the continuation's own record follows); event
//! name `hermes.trajectory`; attributes `session.id`,
//! `hermes.trajectory.schema_version`, `hermes.trajectory.complete` and
//! `hermes.trajectory.file`; the resource of the agent's spans; time, the
//! session's last span end; observed time, when it was queued.
//!
//! Never in the way of the files: [`crate::sessions::Sessions`] hands each
//! written file to a bounded channel without waiting ([`OUTBOX`]); a full
//! channel, a request given up after `max_elapsed_secs`, log records the
//! backend refused and those still queued at shutdown are counted as
//! failed (`trajectory_log_records_failed`) and logged.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hermes_exporter::{Delivery, LogsExporter, RetrySettings};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::sessions::TrajectoryStats;

/// How many written files may wait for the sender.
pub const OUTBOX: usize = 1024;

/// The event name of a trajectory's log record.
pub const EVENT_NAME: &str = "hermes.trajectory";

/// A trajectory file just written, as its log record needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub session_id: String,
    /// The file's name in the trajectory directory.
    pub file: String,
    /// Ended by its host (false: written after the idle time).
    pub complete: bool,
    /// The trajectory JSON.
    pub body: String,
    /// End of the session's last span, Unix nanoseconds.
    pub last_step_ns: u64,
    /// When it was written, Unix nanoseconds.
    pub written_ns: u64,
    /// The agent's resource attributes.
    pub resource: BTreeMap<String, Value>,
}

/// The settings of the log export.
#[derive(Debug)]
pub struct AtifLogs {
    /// The transport, built from `exporters.atif.otlp_logs`.
    pub exporter: LogsExporter,
    /// Backoff and `max_elapsed` of one record.
    pub retry: RetrySettings,
}

/// The OTLP request carrying `finished` as one log record.
pub fn request(finished: &Finished) -> ExportLogsServiceRequest {
    let record = LogRecord {
        time_unix_nano: finished.last_step_ns,
        observed_time_unix_nano: finished.written_ns,
        severity_number: SeverityNumber::Info as i32,
        severity_text: "INFO".to_owned(),
        body: Some(string(&finished.body)),
        attributes: vec![
            kv("session.id", string(&finished.session_id)),
            kv(
                "hermes.trajectory.schema_version",
                string(crate::SCHEMA_VERSION),
            ),
            kv(
                "hermes.trajectory.complete",
                AnyValue {
                    value: Some(Any::BoolValue(finished.complete)),
                },
            ),
            kv("hermes.trajectory.file", string(&finished.file)),
        ],
        event_name: EVENT_NAME.to_owned(),
        ..Default::default()
    };
    let resource = Resource {
        attributes: finished
            .resource
            .iter()
            .filter_map(|(k, v)| Some(kv(k, any(v)?)))
            .collect(),
        ..Default::default()
    };
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(resource),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "hermes-collector".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                log_records: vec![record],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// Until `stop`: sends each record of `outbox`, counting what was sent and
/// what failed. At the stop, the records still queued are counted as
/// failed.
pub(crate) async fn sender(
    mut logs: AtifLogs,
    mut outbox: mpsc::Receiver<Finished>,
    stats: Arc<TrajectoryStats>,
    stop: CancellationToken,
) {
    tracing::info!(destination = %logs.exporter.destination(), "sending trajectories as OTLP log records");
    loop {
        let finished = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            next = outbox.recv() => match next {
                Some(finished) => finished,
                None => return,
            },
        };
        let delivery = logs
            .exporter
            .export_with_retry(&request(&finished), &logs.retry, &stop)
            .await;
        match delivery {
            Delivery::Sent { rejected: 0, .. } => {
                stats.log_records_sent.fetch_add(1, Ordering::Relaxed);
            }
            Delivery::Sent { .. } => {
                stats.log_records_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(file = %finished.file, "the log backend refused the trajectory's log record");
            }
            Delivery::Failed(error) => {
                stats.log_records_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(file = %finished.file, %error, "trajectory not sent as a log record; the file is written");
            }
            Delivery::Stopped => {
                stats.log_records_failed.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
    let mut left = 0u64;
    while outbox.try_recv().is_ok() {
        left += 1;
    }
    if left > 0 {
        stats.log_records_failed.fetch_add(left, Ordering::Relaxed);
        tracing::warn!(
            records = left,
            "trajectories not sent as log records at shutdown; their files are written"
        );
    }
}

fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(value),
        ..Default::default()
    }
}

fn string(text: &str) -> AnyValue {
    AnyValue {
        value: Some(Any::StringValue(text.to_owned())),
    }
}

/// A resource attribute as OTLP carries it (scalars only, as kept).
fn any(value: &Value) -> Option<AnyValue> {
    let value = match value {
        Value::String(s) => Any::StringValue(s.clone()),
        Value::Bool(b) => Any::BoolValue(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Any::IntValue(i),
            None => Any::DoubleValue(n.as_f64()?),
        },
        _ => return None,
    };
    Some(AnyValue { value: Some(value) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_trajectory_becomes_one_record_with_its_attributes_and_resource() {
        let finished = Finished {
            session_id: "s1".into(),
            file: "s1.json".into(),
            complete: false,
            body: "{\"schema_version\":\"ATIF-v1.8\"}".into(),
            last_step_ns: 5,
            written_ns: 9,
            resource: [
                ("service.name".to_owned(), Value::from("hermes-agent")),
                ("pid".to_owned(), Value::from(42)),
            ]
            .into(),
        };
        let request = request(&finished);
        let rl = &request.resource_logs[0];
        let resource = &rl.resource.as_ref().unwrap().attributes;
        assert_eq!(resource.len(), 2);
        assert!(resource.contains(&kv(
            "pid",
            AnyValue {
                value: Some(Any::IntValue(42))
            }
        )));
        let records = &rl.scope_logs[0].log_records;
        assert_eq!(records.len(), 1);
        let record = &records[0];
        assert_eq!(record.body, Some(string(&finished.body)));
        assert_eq!(
            (record.time_unix_nano, record.observed_time_unix_nano),
            (5, 9)
        );
        assert_eq!(record.event_name, EVENT_NAME);
        let attr = |key: &str| {
            record
                .attributes
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.clone())
        };
        assert_eq!(attr("session.id"), Some(string("s1")));
        assert_eq!(attr("hermes.trajectory.file"), Some(string("s1.json")));
        assert_eq!(
            attr("hermes.trajectory.complete"),
            Some(AnyValue {
                value: Some(Any::BoolValue(false))
            })
        );
        assert_eq!(
            attr("hermes.trajectory.schema_version"),
            Some(string("ATIF-v1.8"))
        );
    }
}
