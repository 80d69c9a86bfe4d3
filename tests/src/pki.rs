//! Test certificates made by `rcgen` at test time: a CA and leaves it signs
//! (PEM text), for the TLS tests of ingest and export.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    /// Its certificate (PEM), what a peer trusts.
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate (PEM, leaf only) and its private key (PKCS#8 PEM).
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("CA params: {e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("CA certificate: {e}"));
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, false)
    }

    /// A client certificate for `name`.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, false)
    }

    /// A client certificate for `name` valid only during 2020.
    pub fn expired_client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, true)
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose, expired: bool) -> Leaf {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("leaf key: {e}"));
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap_or_else(|e| panic!("leaf params: {e}"));
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![usage];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 12, 31);
        }
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("leaf certificate: {e}"));
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
