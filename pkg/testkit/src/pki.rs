//! Throwaway TLS material: the control plane's CA and serving certificate, the service-account
//! signing key, and certificates for webhook servers under test.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::TestkitError;

fn pki(what: &'static str) -> impl FnOnce(rcgen::Error) -> TestkitError {
    move |source| TestkitError::Pki { what, source }
}

/// A certificate authority that can sign leaf certificates.
pub(crate) struct Ca {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn generate(common_name: &str) -> Result<Self, TestkitError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(pki("CA params"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().map_err(pki("CA key"))?;
        let cert = params.self_signed(&key).map_err(pki("CA certificate"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Signs a leaf for the given DNS names and IP addresses; returns (cert PEM, key PEM).
    pub(crate) fn leaf(
        &self,
        common_name: &str,
        dns_names: &[&str],
        ips: &[std::net::IpAddr],
        server: bool,
        client: bool,
    ) -> Result<(String, String), TestkitError> {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(pki("leaf params"))?;
        for name in dns_names {
            let name = (*name)
                .to_owned()
                .try_into()
                .map_err(pki("leaf DNS name"))?;
            params.subject_alt_names.push(SanType::DnsName(name));
        }
        for ip in ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        let key = KeyPair::generate().map_err(pki("leaf key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(pki("leaf certificate"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// A fresh ECDSA P-256 key pair as (PKCS#8 private key PEM, SPKI public key PEM), used as the
/// service-account token signing key.
pub(crate) fn ecdsa_key_pair_pem() -> Result<(String, String), TestkitError> {
    let key = KeyPair::generate().map_err(pki("service-account key"))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// TLS material for a webhook server under test listening on `127.0.0.1`.
///
/// The leaf certificate is valid for the IP address `127.0.0.1` and the name `localhost`, and is
/// signed by a throwaway CA. Serve with `cert_pem` + `key_pem`, and give `ca_pem` to
/// [`register_validating_webhook`](crate::register_validating_webhook) /
/// [`register_mutating_webhook`](crate::register_mutating_webhook) as the `caBundle`.
#[derive(Clone)]
pub struct WebhookPki {
    /// The CA certificate (PEM) the API server uses to verify the webhook server.
    pub ca_pem: String,
    /// The serving certificate (PEM) for `127.0.0.1` and `localhost`.
    pub cert_pem: String,
    /// The serving certificate's private key (PKCS#8 PEM, ECDSA P-256).
    pub key_pem: String,
}

impl std::fmt::Debug for WebhookPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookPki")
            .field("ca_pem", &self.ca_pem)
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl WebhookPki {
    /// Generates a new CA and a serving certificate for `127.0.0.1` / `localhost`.
    pub fn generate() -> Result<WebhookPki, TestkitError> {
        let ca = Ca::generate("warmcache-testkit webhook CA")?;
        let (cert_pem, key_pem) = ca.leaf(
            "warmcache-testkit webhook",
            &["localhost"],
            &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            true,
            false,
        )?;
        Ok(WebhookPki {
            ca_pem: ca.cert_pem,
            cert_pem,
            key_pem,
        })
    }
}

/// Standard base64 (with padding), used for inline kubeconfig data.
pub(crate) fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                let idx = ((n >> (18 - 6 * i)) & 0x3f) as usize;
                out.push(char::from(ALPHABET[idx]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, want) in cases {
            assert_eq!(base64(input.as_bytes()), want, "input {input:?}");
        }
    }

    #[test]
    fn webhook_pki_is_pem() {
        let pki = WebhookPki::generate().unwrap();
        assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(!format!("{pki:?}").contains(&pki.key_pem));
    }
}
