//! Identity and trust: the server's self-signed certificate (made once with rcgen, kept in
//! a 0600 file), its SHA-256 fingerprint, and the client's verifiers (a pinned fingerprint,
//! or a CA bundle). rustls with the ring provider only; TLS 1.3 only; ALPN `ferry/1`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_core::TransportError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The ALPN protocol id.
pub const ALPN: &[u8] = b"ferry/1";

/// The crypto provider: ring, explicitly (never the process default).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn err(what: impl Into<String>) -> TransportError {
    TransportError::Backend(Arc::new(std::io::Error::other(what.into())))
}

/// Lowercase hex SHA-256 of a DER certificate.
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    d.as_ref().iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The default identity file: `$XDG_CONFIG_HOME/ferry/quic-identity.pem`, else
/// `~/.config/ferry/quic-identity.pem`, else in the temp directory (per user id).
pub fn default_identity_path() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("ferry/quic-identity.pem");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".config/ferry/quic-identity.pem");
    }
    std::env::temp_dir().join(format!("ferry-{}/quic-identity.pem", rustix_uid()))
}

fn rustix_uid() -> u32 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0)
    }
    #[cfg(not(unix))]
    {
        0
    }
}

/// A server identity: certificate chain and key.
pub struct Identity {
    /// The certificate (self-signed).
    pub cert: CertificateDer<'static>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Its SHA-256 fingerprint (lowercase hex).
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.cert)
    }

    /// Loads the identity at `path`, or creates one there (mode 0600) on first use.
    ///
    /// Any number of first starts may race on one path (threads of a process, processes):
    /// each writes its new identity to a temporary file of its own and links it into place,
    /// one link wins, and every one of them returns what the file then holds, so they all
    /// agree on one identity (the fingerprint a server prints is the one it serves).
    pub fn load_or_create(path: &Path) -> Result<Identity, TransportError> {
        match Self::load(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::create(path),
            other => other.map_err(|e| err(e.to_string())),
        }
    }

    /// A fresh self-signed identity, not stored.
    pub fn generate() -> Result<Identity, TransportError> {
        let names = vec!["ferry".to_string(), "localhost".to_string()];
        let c = rcgen::generate_simple_self_signed(names).map_err(|e| err(format!("generating a certificate: {e}")))?;
        let key = PrivateKeyDer::try_from(c.signing_key.serialize_der()).map_err(|e| err(e.to_string()))?;
        Ok(Identity { cert: c.cert.der().clone(), key })
    }

    /// Reads the identity file (private, whole); `NotFound` when there is none.
    fn load(path: &Path) -> std::io::Result<Identity> {
        let pem = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => e,
            _ => std::io::Error::other(format!("cannot read identity file {}: {e}", path.display())),
        })?;
        check_private(path).map_err(std::io::Error::other)?;
        Self::from_pem(&pem).map_err(|e| std::io::Error::other(format!("identity file {}: {e}", path.display())))
    }

    fn create(path: &Path) -> Result<Identity, TransportError> {
        let names = vec!["ferry".to_string(), "localhost".to_string()];
        let c = rcgen::generate_simple_self_signed(names).map_err(|e| err(format!("generating a certificate: {e}")))?;
        let pem = format!("{}{}", c.cert.pem(), c.signing_key.serialize_pem());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(format!("creating {}: {e}", dir.display())))?;
        }
        // Write a private temporary file of this call's own, then link it into place: a
        // start racing this one (another thread or process) sees either no file or a whole
        // one, never half of one, and never writes into this one's temporary file.
        let (tmp, mut f) = private_temp_file(path)?;
        let written = f.write_all(pem.as_bytes()).and_then(|()| f.sync_all());
        drop(f);
        let linked = match written {
            Ok(()) => std::fs::hard_link(&tmp, path),
            Err(e) => Err(std::io::Error::other(format!("writing {}: {e}", tmp.display()))),
        };
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => tracing::info!(path = %path.display(), "created a new QUIC identity"),
            // Another start linked its identity first: this one's is dropped unused.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(format!("creating identity file {}: {e}", path.display()))),
        }
        // What the file holds, whoever linked it: every racing first start agrees on it.
        Self::load(path).map_err(|e| err(e.to_string()))
    }

    fn from_pem(pem: &[u8]) -> Result<Identity, String> {
        let cert = CertificateDer::pem_slice_iter(pem)
            .next()
            .ok_or("no certificate in the file")?
            .map_err(|e| format!("certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("private key: {e}"))?;
        Ok(Identity { cert, key })
    }
}

fn check_private(path: &Path) -> Result<(), TransportError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode()).unwrap_or(0);
        if mode & 0o077 != 0 {
            return Err(err(format!(
                "identity file {} is readable by others (mode {:o}); run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            )));
        }
    }
    let _ = path;
    Ok(())
}

/// Creates (`create_new`, mode 0600) a temporary file beside `path` that no other call,
/// in this process or another, uses: named by the process id and a per-process counter.
fn private_temp_file(path: &Path) -> Result<(PathBuf, std::fs::File), TransportError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        match opts.open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            // Left by a dead process that had this id: take the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1 << 20 => continue,
            Err(e) => return Err(err(format!("creating identity file {}: {e}", tmp.display()))),
        }
    }
}

/// Accepts exactly the server certificate whose SHA-256 fingerprint is pinned.
#[derive(Debug)]
pub struct PinVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl PinVerifier {
    /// Pins `hex` (64 hex digits, any case).
    pub fn new(hex: &str) -> Result<Self, String> {
        let pin = hex.to_ascii_lowercase();
        if pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("sha256 pin must be 64 hex digits, got {hex:?}"));
        }
        Ok(PinVerifier { pin, provider: provider() })
    }
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = fingerprint(end_entity);
        // The fingerprint is public; a plain compare is fine here.
        if got == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "server certificate fingerprint sha256={got} does not match the pinned sha256={}",
                self.pin
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A client TLS config: pinned fingerprint, or else the CA bundle at `ca`.
pub fn client_config(pin: Option<&str>, ca: Option<&Path>) -> Result<rustls::ClientConfig, TransportError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| err(e.to_string()))?;
    let mut cfg = if let Some(pin) = pin {
        let v = PinVerifier::new(pin).map_err(|e| TransportError::BadAddress { addr: pin.into(), reason: e.into() })?;
        builder.dangerous().with_custom_certificate_verifier(Arc::new(v)).with_no_client_auth()
    } else if let Some(ca) = ca {
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| err(format!("CA bundle {}: {e}", ca.display())))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(format!("CA bundle {}: {e}", ca.display())))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(err(format!("CA bundle {} holds no usable certificate", ca.display())));
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        return Err(TransportError::BadAddress {
            addr: String::new(),
            reason: "no way to verify the server: append #sha256=<fingerprint> (the server prints it) to the \
                     address, or configure QuicOptions::ca_bundle"
                .into(),
        });
    };
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

/// A server TLS config for `id`.
pub fn server_config(id: &Identity) -> Result<rustls::ServerConfig, TransportError> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| err(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![id.cert.clone()], id.key.clone_key())
        .map_err(|e| err(format!("server certificate: {e}")))?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_file_is_private_and_stable() {
        let dir = std::env::temp_dir().join(format!("ferry-quic-id-{}", std::process::id()));
        let path = dir.join("id.pem");
        let a = Identity::load_or_create(&path).unwrap();
        let b = Identity::load_or_create(&path).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint(), "the identity must survive a restart");
        assert_eq!(a.fingerprint().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = Identity::load_or_create(&path).err().unwrap().to_string();
            assert!(e.contains("chmod 600"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pins_are_checked() {
        assert!(PinVerifier::new("abc").is_err());
        assert!(PinVerifier::new(&"g".repeat(64)).is_err());
        assert!(PinVerifier::new(&"AB".repeat(32)).is_ok());
        assert!(client_config(None, None).is_err());
    }
}
