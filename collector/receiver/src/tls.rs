//! TLS, optionally mutual, on the ingest listener.
//!
//! Owns: building tonic's server TLS settings from PEM text and checking
//! them before anything is bound.
//!
//! Invariants: the private key is never printed (tonic's types redact it,
//! and errors name files, never contents); with a client CA, every client
//! must present a certificate that chains to it (no optional client auth); a
//! handshake that does not finish within [`HANDSHAKE_TIMEOUT`] loses its
//! connection, so idle connections cannot pile up before authentication.

use std::fmt;
use std::time::Duration;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// PEM text of the collector's TLS material.
#[derive(Clone)]
pub struct TlsPem {
    /// Certificate chain the collector presents, leaf first.
    pub cert: Vec<u8>,
    /// Private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: Vec<u8>,
    /// CA certificates that client certificates must chain to; None: no
    /// client certificate is asked for.
    pub client_ca: Option<Vec<u8>>,
}

impl fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsPem")
            .field("cert_bytes", &self.cert.len())
            .field("key", &"<redacted>")
            .field("mutual", &self.client_ca.is_some())
            .finish()
    }
}

/// Why the TLS material cannot be used.
#[derive(Debug)]
pub struct TlsError(String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

impl TlsPem {
    /// tonic's server settings, checked: certificates and key parse and the
    /// key belongs to the certificate.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| TlsError(source_chain(&e)))?;
        Ok(config)
    }
}

fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_material_is_an_error_and_the_key_never_shows() {
        let pem = TlsPem {
            cert: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
            key: b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n".to_vec(),
            client_ca: None,
        };
        let error = pem.server_config().unwrap_err().to_string();
        assert!(!error.contains("c2VjcmV0"), "{error}");
        assert!(!format!("{pem:?}").contains("c2VjcmV0"));
    }
}
