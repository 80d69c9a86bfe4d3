//! TLS of the OTLP exporters (`https://` endpoints), for gRPC and HTTP alike.
//!
//! This module owns [`TlsSettings`] (PEM text the binary read from its
//! configuration), turning them into the trusted roots and the client
//! identity both exporters use, and recognising a failed handshake in an
//! error's `source()` chain ([`handshake_failure`]).
//!
//! Invariants:
//! * The server's certificate is always verified: against the CA
//!   certificates of [`TlsSettings::ca_pem`] when given (only those), else
//!   against the system's root store (read from the local disk by
//!   `rustls-native-certs`, never fetched). There is no switch to turn
//!   verification off.
//! * Everything is checked when the exporter is built: certificates parse,
//!   the key parses and belongs to the client certificate, roots exist. A
//!   handshake never fails on something `new` could have seen.
//! * The private key is never printed: [`TlsSettings`]'s `Debug` redacts it
//!   and errors name what is wrong, never the PEM text.
//! * rustls with the `ring` provider, as tonic's `tls-ring` on the ingest:
//!   no OpenSSL.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

use crate::error::ExportError;

/// Longest a TLS handshake with the backend may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS settings of an exporter: PEM text, read by the binary.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// CA certificate(s) the backend's certificate must chain to, replacing
    /// the system's roots. None: the system's root store.
    pub ca_pem: Option<Vec<u8>>,
    /// Certificate chain presented to the backend (mutual TLS), leaf first.
    pub client_cert_pem: Option<Vec<u8>>,
    /// Private key of the client certificate (PKCS#8, PKCS#1 or SEC1).
    pub client_key_pem: Option<Vec<u8>>,
    /// Name the backend's certificate must carry, when it differs from the
    /// endpoint's host (e.g. connecting by IP address). None: the host.
    pub server_name: Option<String>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("custom_ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .field(
                "client_key",
                &self.client_key_pem.as_ref().map(|_| "<redacted>"),
            )
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsSettings {
    /// Checks the settings for a connection to `host` as the exporters will
    /// at construction (certificates and key parse and fit together, roots
    /// exist; the system's store is read when no CA is given), so a
    /// configuration can be refused before anything starts.
    pub fn check(&self, host: &str) -> Result<(), ExportError> {
        ClientTls::new(self, host).map(|_| ())
    }

    /// tonic's client TLS settings for a connection to `host`, for gRPC
    /// clients built elsewhere (the OTLP metrics exporter of the SDK).
    pub fn tonic_config(
        &self,
        host: &str,
    ) -> Result<tonic::transport::ClientTlsConfig, ExportError> {
        ClientTls::new(self, host).map(|tls| tls.tonic_config())
    }
}

/// The checked material of [`TlsSettings`], ready for either exporter.
#[derive(Clone)]
pub(crate) struct ClientTls {
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    /// PEM text of the identity, for tonic (which parses it again).
    identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    server_name: ServerName<'static>,
}

impl ClientTls {
    /// Checks `settings` for a connection to `host` (the endpoint's host) and
    /// builds the roots and the identity. Reads the system's root store when
    /// no CA is given.
    pub(crate) fn new(settings: &TlsSettings, host: &str) -> Result<Self, ExportError> {
        let roots = match &settings.ca_pem {
            Some(pem) => custom_roots(pem)?,
            None => system_roots()?,
        };
        let (identity, identity_pem) = match (&settings.client_cert_pem, &settings.client_key_pem) {
            (None, None) => (None, None),
            (Some(cert), Some(key)) => (
                Some(parse_identity(cert, key)?),
                Some((cert.clone(), key.clone())),
            ),
            (Some(_), None) => return Err(tls_error("a client certificate needs its key")),
            (None, Some(_)) => return Err(tls_error("a client key needs its certificate")),
        };
        let name = settings.server_name.as_deref().unwrap_or(host);
        // `http::Uri` keeps the brackets of an IPv6 host.
        let name = name.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|_| tls_error(format!("{name:?} is not a valid server name")))?;
        let tls = Self {
            roots: Arc::new(roots),
            identity,
            identity_pem,
            server_name,
        };
        // Builds once to find what rustls refuses (a key that does not fit
        // the certificate) now rather than at the first handshake.
        tls.rustls_config()?;
        Ok(tls)
    }

    /// The name the server's certificate is checked against.
    pub(crate) fn server_name(&self) -> &ServerName<'static> {
        &self.server_name
    }

    /// A rustls client configuration (no ALPN protocols: `hyper-rustls` sets
    /// them).
    pub(crate) fn rustls_config(&self) -> Result<ClientConfig, ExportError> {
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| tls_error(e.to_string()))?
                .with_root_certificates(self.roots.clone());
        let config = match &self.identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| tls_error(format!("the client certificate and key: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        Ok(config)
    }

    /// tonic's client TLS settings (HTTP/2 over TLS) with the same roots,
    /// identity and server name.
    pub(crate) fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .trust_anchors(self.roots.roots.iter().cloned())
            .domain_name(self.server_name.to_str().into_owned())
            .assume_http2(true)
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some((cert, key)) = &self.identity_pem {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        config
    }
}

fn tls_error(reason: impl Into<String>) -> ExportError {
    ExportError::TlsConfig(reason.into())
}

/// The CA certificates of `pem`, and only those.
fn custom_roots(pem: &[u8]) -> Result<RootCertStore, ExportError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(format!("the CA file: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error("the CA file holds no certificate"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| tls_error(format!("the CA file: {e}")))?;
    }
    Ok(roots)
}

/// The system's root certificates (`SSL_CERT_FILE`/`SSL_CERT_DIR`, else the
/// platform's store, e.g. `/etc/ssl/certs`).
fn system_roots() -> Result<RootCertStore, ExportError> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::debug!(%error, "skipped part of the system's root certificate store");
    }
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(tls_error(
            "no usable root certificate in the system's store (install the ca-certificates package, set SSL_CERT_FILE, or set the exporter's tls.ca_file)",
        ));
    }
    Ok(roots)
}

fn parse_identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>), ExportError> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(format!("the client certificate: {e}")))?;
    if chain.is_empty() {
        return Err(tls_error(
            "the client certificate file holds no certificate",
        ));
    }
    // The error of a key that does not parse says nothing of its content.
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| tls_error("the client key file holds no usable private key"))?;
    Ok((chain, Arc::new(key)))
}

/// How a TLS handshake failed, read from an error's `source()` chain; None
/// when the chain holds no TLS error.
///
/// rustls errors travel inside `std::io::Error`s (tokio-rustls), whose
/// `source()` skips them, so each I/O error's inner error is checked too.
pub(crate) fn handshake_failure(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(cause) = current {
        if let Some(tls) = as_rustls(cause) {
            return Some(describe(tls));
        }
        let Some(io) = cause.downcast_ref::<std::io::Error>() else {
            current = cause.source();
            continue;
        };
        if let Some(inner) = io.get_ref() {
            // The wrapped error (an I/O error's `source()` is the wrapped
            // error's source, one step too far).
            current = Some(inner);
            continue;
        }
        current = None;
    }
    // h2 keeps the I/O errors of a connection as text (to clone them), so an
    // alert that arrives once HTTP/2 runs (TLS 1.3: a refused client
    // certificate) is only known by rustls' words.
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(cause) = current {
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
        {
            let text = io.to_string();
            if text.starts_with(ALERT_PREFIX) {
                return Some(alert_hint(&text));
            }
        }
        current = cause.source();
    }
    None
}

/// How rustls' `Display` of `Error::AlertReceived` starts.
const ALERT_PREFIX: &str = "received fatal alert: ";

fn alert_hint(alert: &str) -> String {
    format!(
        "the backend refused the connection ({alert}); it may require a client certificate (exporters.otlp.tls.cert_file and key_file) from a CA it trusts"
    )
}

fn as_rustls<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    error.downcast_ref::<rustls::Error>()
}

/// A rustls error with what it most likely means for the operator.
fn describe(error: &rustls::Error) -> String {
    use rustls::Error as E;
    match error {
        E::InvalidCertificate(_) => format!(
            "the backend's certificate was rejected ({error}); check exporters.otlp.tls.ca_file and that the certificate names the endpoint's host (or tls.server_name)"
        ),
        E::AlertReceived(_) => alert_hint(&error.to_string()),
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. } => {
            format!(
                "the backend does not speak TLS as expected ({error}); is it an https:// endpoint?"
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_problems_are_errors_without_the_key() {
        let bad_ca = TlsSettings {
            ca_pem: Some(b"not pem".to_vec()),
            ..Default::default()
        };
        assert!(matches!(
            ClientTls::new(&bad_ca, "localhost"),
            Err(ExportError::TlsConfig(_))
        ));
        let half = TlsSettings {
            ca_pem: None,
            client_key_pem: Some(
                b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n".to_vec(),
            ),
            ..Default::default()
        };
        let e = ClientTls::new(&half, "localhost")
            .err()
            .map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("needs its certificate")),
            "{e:?}"
        );
        assert!(!format!("{half:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn handshake_failures_are_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("connect failed")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        // The failure found under `error`, wrapped once, names `what`.
        let finds = |error: std::io::Error, what: &str| {
            let found = handshake_failure(&Outer(error));
            assert!(
                found.as_deref().is_some_and(|m| m.contains(what)),
                "{what}: {found:?}"
            );
        };
        finds(io, "UnknownIssuer");
        assert_eq!(handshake_failure(&std::io::Error::other("reset")), None);
        // As h2 hands it back: the alert as text only.
        let text = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        finds(text, "client certificate");
    }
}
