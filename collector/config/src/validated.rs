//! The configuration once validated: what the stages are built from.
//!
//! Owns: [`Validated`], the configuration together with everything its
//! validation read: the bearer tokens, the header values of `header_files`,
//! the PEM material and the ingest's TLS settings, the parsed listen
//! addresses. The binary builds its stages from it without reading a file
//! or the environment a second time, so a secret that changes between
//! validation and start cannot make them disagree, and a file removed after
//! validation is not missed.
//!
//! Invariants: built only by [`Config::validate_with`](crate::Config::validate_with),
//! after every check passed; its `Debug` output shows no secret (tokens,
//! header values and private keys are redacted, PEM material is shown as
//! present or not).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use hermes_exporter::{Compression, GrpcExporterConfig, HttpExporterConfig, TlsSettings};
use hermes_receiver::{BearerToken, ListenAddr};

use crate::{CompressionConfig, Config, OtlpConfig, OtlpMetricsConfig, OtlpProtocol};

/// A validated configuration with its secrets and TLS material read. Its
/// `Debug` is each field's, and every field that holds a secret redacts it
/// in its own `Debug`.
#[derive(Debug)]
#[non_exhaustive]
pub struct Validated {
    /// The configuration as validated (`${VAR}` replaced, CLI overrides
    /// applied); its sections convert into the stages' settings
    /// ([`crate::settings`]).
    pub config: Config,
    /// `receiver.listen`, parsed.
    pub listen: ListenAddr,
    /// `admin.listen`, parsed.
    pub admin_listen: SocketAddr,
    /// The token shims must present (`receiver.auth`), if any.
    pub ingest_token: Option<BearerToken>,
    /// The token a scrape of `/metrics` must present (`admin.metrics_auth`).
    pub metrics_token: Option<BearerToken>,
    /// TLS of the ingest listener (`receiver.tls`), if any.
    pub receiver_tls: Option<ReceiverTls>,
    /// The OTLP span exporter (`exporters.otlp`), if any.
    pub otlp: Option<OtlpExport>,
    /// The OTLP export of the derived metrics (`exporters.otlp_metrics`).
    pub otlp_metrics: Option<OtlpMetricsExport>,
    /// The OTLP log export of the trajectories
    /// (`exporters.atif.otlp_logs`).
    pub atif_logs: Option<OtlpExport>,
}

/// The ingest listener's TLS, its files read and checked.
#[derive(Clone)]
pub struct ReceiverTls {
    /// The server's settings (certificate, key, client CA).
    pub server: tonic::transport::ServerTlsConfig,
    /// Whether clients must present a certificate (`client_ca_file`).
    pub mutual: bool,
}

impl fmt::Debug for ReceiverTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiverTls")
            .field("server", &"<certificate and key>")
            .field("mutual", &self.mutual)
            .finish()
    }
}

/// The OTLP span exporter with its header values and TLS material read.
#[derive(Clone, PartialEq)]
pub struct OtlpExport {
    /// `exporters.otlp.protocol`.
    pub protocol: OtlpProtocol,
    /// `exporters.otlp.endpoint`.
    pub endpoint: String,
    /// `exporters.otlp.timeout_ms`.
    pub timeout: Duration,
    /// `exporters.otlp.compression`.
    pub compression: Compression,
    /// `exporters.otlp.compression_level`, or the exporter's default.
    pub gzip_level: u32,
    /// `headers` and the values of `header_files`, checked.
    pub headers: Vec<(String, String)>,
    /// TLS of an `https://` endpoint, None for `http://`.
    pub tls: Option<TlsSettings>,
}

/// Longest TCP connect of the gRPC exporter (bounded by its timeout).
const GRPC_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl OtlpExport {
    pub(crate) fn new(
        config: &OtlpConfig,
        headers: Vec<(String, String)>,
        tls: Option<TlsSettings>,
    ) -> Self {
        OtlpExport {
            protocol: config.protocol,
            endpoint: config.endpoint.clone(),
            timeout: Duration::from_millis(config.timeout_ms),
            compression: match config.compression {
                CompressionConfig::None => Compression::None,
                CompressionConfig::Gzip => Compression::Gzip,
            },
            gzip_level: config
                .compression_level
                .unwrap_or(hermes_exporter::DEFAULT_GZIP_LEVEL),
            headers,
            tls,
        }
    }

    /// The gRPC exporter's settings (`GrpcExporter::new_with_tls(_, self.tls)`).
    pub fn grpc(&self) -> GrpcExporterConfig {
        GrpcExporterConfig {
            endpoint: self.endpoint.clone(),
            timeout: self.timeout,
            connect_timeout: self.timeout.min(GRPC_CONNECT_TIMEOUT),
            compression: self.compression,
            gzip_level: self.gzip_level,
            headers: self.headers.clone(),
        }
    }

    /// The HTTP/protobuf exporter's settings
    /// (`HttpExporter::new_with_tls(_, self.tls)`).
    pub fn http(&self) -> HttpExporterConfig {
        HttpExporterConfig {
            endpoint: self.endpoint.clone(),
            timeout: self.timeout,
            headers: self.headers.clone(),
        }
    }
}

impl fmt::Debug for OtlpExport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtlpExport")
            .field("protocol", &self.protocol)
            .field("endpoint", &hermes_exporter::shown_endpoint(&self.endpoint))
            .field("timeout", &self.timeout)
            .field("compression", &self.compression)
            .field("gzip_level", &self.gzip_level)
            .field(
                "headers",
                &redacted(self.headers.iter().map(|(name, _)| name)),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

/// The OTLP export of the derived metrics with its TLS material read.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpMetricsExport {
    /// `exporters.otlp_metrics` as written.
    pub config: OtlpMetricsConfig,
    /// TLS of an `https://` endpoint, None for `http://`.
    pub tls: Option<TlsSettings>,
}

/// Headers as `Debug` output shows them: their names, each value
/// replaced (header values are credentials more often than not).
pub(crate) fn redacted<'a>(
    names: impl IntoIterator<Item = &'a String>,
) -> BTreeMap<&'a str, &'static str> {
    names
        .into_iter()
        .map(|name| (name.as_str(), "<redacted>"))
        .collect()
}
