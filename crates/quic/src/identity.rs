//! TLS identities and trust, ssh style.
//!
//! The server keeps a self-signed certificate and key in its state directory,
//! created on first start; its identity is the certificate's SHA-256 fingerprint
//! (`SHA256:` + unpadded base64, as ssh prints keys). The client pins it: a
//! known-hosts file maps `HOST:PORT` to a fingerprint; an unknown server is refused
//! unless the user passes `--fingerprint` or `--accept-new`; a changed one is always
//! refused.

use anyhow::{bail, Context, Result};
use base64::Engine;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The rustls crypto provider (ring) the client's and the server's TLS
/// configurations, and [`PinVerifier`]'s signature checks, are built on.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `SHA256:<base64>` of a DER certificate.
pub fn fingerprint(cert_der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, cert_der);
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d.as_ref())
    )
}

/// A server's certificate and key.
pub struct Identity {
    /// The self-signed certificate (DER, `cert.der`) the server presents.
    pub cert: CertificateDer<'static>,
    /// Its PKCS#8 private key (DER, `key.der`).
    pub key: PrivateKeyDer<'static>,
    /// [`fingerprint`] of `cert`: what clients pin and `longhaul serve` prints.
    pub fingerprint: String,
}

impl Identity {
    /// Load `cert.der` and `key.der` from `dir`, creating them (key mode 0600) if absent.
    pub fn load_or_create(dir: &Path) -> Result<Identity> {
        let cert_path = dir.join("cert.der");
        let key_path = dir.join("key.der");
        if !cert_path.exists() || !key_path.exists() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating state dir {}", dir.display()))?;
            let ck = rcgen::generate_simple_self_signed(vec!["longhaul".to_string()])
                .context("generating the server key")?;
            write_private(&key_path, &ck.key_pair.serialize_der())?;
            std::fs::write(&cert_path, ck.cert.der())
                .with_context(|| format!("writing {}", cert_path.display()))?;
        }
        let cert = std::fs::read(&cert_path)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let key =
            std::fs::read(&key_path).with_context(|| format!("reading {}", key_path.display()))?;
        Ok(Identity {
            fingerprint: fingerprint(&cert),
            cert: CertificateDer::from(cert),
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
        })
    }
}

/// Replaces `path` with `bytes`, readable by the owner only: written to a
/// temporary file of this process, synced, and renamed, so a crash or a second
/// writer never leaves half a file.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Default state directory of a server: `$XDG_STATE_HOME/longhaul/server`, else
/// `~/.local/state/longhaul/server`.
pub fn default_state_dir() -> PathBuf {
    base_dir("XDG_STATE_HOME", ".local/state").join("longhaul/server")
}

/// A multicast receiver's state (the sealed sessions it took):
/// `$XDG_STATE_HOME/longhaul/multicast`, else `~/.local/state/longhaul/multicast`.
pub fn default_multicast_state_dir() -> PathBuf {
    base_dir("XDG_STATE_HOME", ".local/state").join("longhaul/multicast")
}

/// The client's rate memory (`crate::rates`): `$XDG_STATE_HOME/longhaul/rates`,
/// else `~/.local/state/longhaul/rates`.
pub fn default_rates() -> PathBuf {
    base_dir("XDG_STATE_HOME", ".local/state").join("longhaul/rates")
}

/// Default known-hosts file: `$XDG_CONFIG_HOME/longhaul/known_hosts`, else
/// `~/.config/longhaul/known_hosts`.
pub fn default_known_hosts() -> PathBuf {
    base_dir("XDG_CONFIG_HOME", ".config").join("longhaul/known_hosts")
}

fn base_dir(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(fallback)
        }
    }
}

/// The known-hosts file: lines of `HOST:PORT SHA256:...`; `#` starts a comment.
pub struct KnownHosts {
    path: PathBuf,
}

impl KnownHosts {
    /// The known-hosts file at `path`; nothing is read until asked, and the
    /// file need not exist.
    pub fn new(path: PathBuf) -> Self {
        KnownHosts { path }
    }

    /// The fingerprint the file's first line for `host` (`HOST:PORT`) names;
    /// None when the file is absent or has no such line, an error when it
    /// cannot be read.
    pub fn lookup(&self, host: &str) -> Result<Option<String>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        };
        Ok(find_host(&text, host))
    }

    /// Records `host`'s fingerprint. Many clients may trust the same server at
    /// once: the file is locked while it is re-read and the line appended (in a
    /// single write), so lines never interleave and a host is written once.
    /// Fails if another client recorded a different fingerprint meanwhile.
    pub fn add(&self, host: &str, fp: &str) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let ctx = || format!("writing {}", self.path.display());
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&self.path)
            .with_context(ctx)?;
        f.lock().with_context(ctx)?;
        let mut text = String::new();
        f.read_to_string(&mut text).with_context(ctx)?;
        match find_host(&text, host) {
            Some(known) if known == fp => return Ok(()),
            Some(known) => bail!(
                "{} already names {host} with {known}, not {fp}; another client recorded it meanwhile",
                self.path.display()
            ),
            None => {}
        }
        let sep = if text.is_empty() || text.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        f.write_all(format!("{sep}{host} {fp}\n").as_bytes())
            .with_context(ctx)?;
        Ok(())
    }
}

/// The fingerprint the first line for `host` names.
fn find_host(text: &str, host: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut parts = line.split_whitespace();
        if let (Some(h), Some(fp)) = (parts.next(), parts.next()) {
            if h == host {
                return Some(fp.to_string());
            }
        }
    }
    None
}

/// How the client decides to trust a server.
#[derive(Debug, Clone)]
pub struct TrustPolicy {
    /// `HOST:PORT` as the user named it; the known-hosts key.
    pub host: String,
    /// The known-hosts file: looked up at the handshake, and a newly trusted
    /// server is added to it. None: neither read nor written, the pinned
    /// fingerprint alone decides (a one-shot server started over ssh, whose
    /// key is new every time).
    pub known_hosts: Option<PathBuf>,
    /// `--fingerprint`: the only one accepted.
    pub pinned: Option<String>,
    /// `--accept-new`: trust (and remember) an unknown server.
    pub accept_new: bool,
}

/// What the verifier saw; read after the handshake to explain a refusal or to
/// record a newly trusted server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustOutcome {
    /// Trusted: the known-hosts file names the fingerprint the server
    /// presented (and a `--fingerprint`, if given, is the same).
    Known,
    /// Accepted by `--accept-new` or a matching `--fingerprint`; to be written down.
    New(String),
    /// Refused: the known-hosts file does not name the host, and neither
    /// `--fingerprint` nor `--accept-new` was given. Holds the server's
    /// fingerprint, for the user to check.
    Unknown(String),
    /// Refused: the known-hosts file names another fingerprint for the host,
    /// whatever `--fingerprint` or `--accept-new` say.
    Changed {
        /// The fingerprint the known-hosts file names.
        expected: String,
        /// The fingerprint the server presented.
        got: String,
    },
    /// Refused: the server's fingerprint is not the `--fingerprint` given.
    PinMismatch {
        /// The `--fingerprint` given.
        expected: String,
        /// The fingerprint the server presented.
        got: String,
    },
    /// Refused: the known-hosts file could not be read; the error.
    KnownHostsError(String),
}

impl TrustOutcome {
    /// A user-facing explanation of a refusal (None when trusted).
    pub fn refusal(&self, host: &str, known_hosts: Option<&Path>) -> Option<String> {
        Some(match self {
            TrustOutcome::Known | TrustOutcome::New(_) => return None,
            TrustOutcome::Unknown(fp) => format!(
                "the server {host} is not known; its fingerprint is {fp}.\n\
                 Check it against what `longhaul serve` printed, then rerun with\n\
                 --fingerprint {fp}   (or --accept-new to trust it on first use)"
            ),
            TrustOutcome::Changed { expected, got } => format!(
                "@@@ WARNING: THE SERVER IDENTITY OF {host} HAS CHANGED! @@@\n\
                 known_hosts ({}) says {expected}\n\
                 the server presented   {got}\n\
                 Someone may be intercepting this connection, or the server's key was \
                 replaced. Refusing to connect. If the change is expected, remove the \
                 line for {host} from the known-hosts file.",
                known_hosts.map_or("none".into(), |k| k.display().to_string())
            ),
            TrustOutcome::PinMismatch { expected, got } => format!(
                "the server {host} presented {got}, not the --fingerprint {expected}; refusing to connect"
            ),
            TrustOutcome::KnownHostsError(e) => format!("cannot read the known-hosts file: {e}"),
        })
    }
}

/// A client's TLS configuration: TLS 1.3, longhaul's ALPN, the server's
/// certificate checked by `verifier`, no client certificate.
pub fn client_tls(verifier: Arc<PinVerifier>) -> Result<rustls::ClientConfig, rustls::Error> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![crate::proto::ALPN.to_vec()];
    Ok(tls)
}

/// rustls verifier that pins the certificate fingerprint instead of a CA chain.
#[derive(Debug)]
pub struct PinVerifier {
    policy: TrustPolicy,
    provider: Arc<CryptoProvider>,
    /// The decision on the server's certificate, set during the handshake
    /// (None until then); shared, so the caller keeps a clone and reads it
    /// after the handshake.
    pub outcome: Arc<Mutex<Option<TrustOutcome>>>,
}

impl PinVerifier {
    /// A verifier that applies `policy`; the known-hosts file is read when
    /// the server's certificate arrives.
    pub fn new(policy: TrustPolicy) -> Self {
        PinVerifier {
            policy,
            provider: provider(),
            outcome: Arc::new(Mutex::new(None)),
        }
    }

    fn decide(&self, got: String) -> TrustOutcome {
        let known = match &self.policy.known_hosts {
            None => None,
            Some(f) => match KnownHosts::new(f.clone()).lookup(&self.policy.host) {
                Ok(k) => k,
                Err(e) => return TrustOutcome::KnownHostsError(format!("{e:#}")),
            },
        };
        match (known, &self.policy.pinned) {
            (Some(k), _) if k != got => TrustOutcome::Changed { expected: k, got },
            (Some(_), Some(p)) if *p != got => TrustOutcome::PinMismatch {
                expected: p.clone(),
                got,
            },
            (Some(_), _) => TrustOutcome::Known,
            (None, Some(p)) if *p == got => TrustOutcome::New(got),
            (None, Some(p)) => TrustOutcome::PinMismatch {
                expected: p.clone(),
                got,
            },
            (None, None) if self.policy.accept_new => TrustOutcome::New(got),
            (None, None) => TrustOutcome::Unknown(got),
        }
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
        let outcome = self.decide(fingerprint(end_entity));
        let ok = matches!(outcome, TrustOutcome::Known | TrustOutcome::New(_));
        *self.outcome.lock().unwrap() = Some(outcome);
        if ok {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "server fingerprint not trusted".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not used by QUIC".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Check a user-given fingerprint's form early, for a clear usage error.
pub fn check_fingerprint_syntax(fp: &str) -> Result<()> {
    let Some(b64) = fp.strip_prefix("SHA256:") else {
        bail!("fingerprint {fp:?} must start with SHA256: (as `longhaul serve` prints it)");
    };
    match base64::engine::general_purpose::STANDARD_NO_PAD.decode(b64) {
        Ok(b) if b.len() == 32 => Ok(()),
        _ => bail!("fingerprint {fp:?} is not SHA256: followed by 43 base64 characters"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(dir: &Path, pinned: Option<&str>, accept_new: bool) -> TrustPolicy {
        TrustPolicy {
            host: "srv:7878".into(),
            known_hosts: Some(dir.join("kh")),
            pinned: pinned.map(Into::into),
            accept_new,
        }
    }

    #[test]
    fn trust_decisions() {
        let t = tempfile::tempdir().unwrap();
        let id = Identity::load_or_create(&t.path().join("state")).unwrap();
        let again = Identity::load_or_create(&t.path().join("state")).unwrap();
        assert_eq!(id.fingerprint, again.fingerprint, "identity is stable");
        check_fingerprint_syntax(&id.fingerprint).unwrap();
        assert!(check_fingerprint_syntax("MD5:abc").is_err());
        let fp = id.fingerprint.clone();

        let v = PinVerifier::new(policy(t.path(), None, false));
        assert_eq!(v.decide(fp.clone()), TrustOutcome::Unknown(fp.clone()));
        let v = PinVerifier::new(policy(t.path(), None, true));
        assert_eq!(v.decide(fp.clone()), TrustOutcome::New(fp.clone()));
        let v = PinVerifier::new(policy(t.path(), Some(&fp), false));
        assert_eq!(v.decide(fp.clone()), TrustOutcome::New(fp.clone()));
        let v = PinVerifier::new(policy(t.path(), Some("SHA256:other"), true));
        assert!(matches!(
            v.decide(fp.clone()),
            TrustOutcome::PinMismatch { .. }
        ));

        KnownHosts::new(t.path().join("kh"))
            .add("srv:7878", &fp)
            .unwrap();
        let v = PinVerifier::new(policy(t.path(), None, false));
        assert_eq!(v.decide(fp.clone()), TrustOutcome::Known);
        // A changed key is refused even with --accept-new or a matching --fingerprint.
        let v = PinVerifier::new(policy(t.path(), Some("SHA256:new"), true));
        let o = v.decide("SHA256:new".into());
        assert_eq!(
            o,
            TrustOutcome::Changed {
                expected: fp.clone(),
                got: "SHA256:new".into()
            }
        );
        assert!(o
            .refusal("srv:7878", Some(t.path()))
            .unwrap()
            .contains("HAS CHANGED"));
    }

    /// Clients trusting servers at the same moment (the settle-race test runs 8
    /// gets at once) must leave one well-formed line per host: an unlocked,
    /// piecewise append once interleaved two lines into `HOST HOST` + `FP`.
    #[test]
    fn concurrent_adds_leave_one_well_formed_line_per_host() {
        let t = tempfile::tempdir().unwrap();
        let kh = t.path().join("kh");
        std::thread::scope(|s| {
            for i in 0..32 {
                let kh = kh.clone();
                s.spawn(move || {
                    let host = format!("srv{}:7878", i % 4);
                    KnownHosts::new(kh)
                        .add(&host, &format!("SHA256:key{}", i % 4))
                        .unwrap();
                });
            }
        });
        let text = std::fs::read_to_string(&kh).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                "srv0:7878 SHA256:key0",
                "srv1:7878 SHA256:key1",
                "srv2:7878 SHA256:key2",
                "srv3:7878 SHA256:key3"
            ],
            "{text}"
        );
        // A different key recorded meanwhile is an error, not a second line.
        let e = KnownHosts::new(kh.clone())
            .add("srv1:7878", "SHA256:other")
            .unwrap_err();
        assert!(format!("{e}").contains("already names srv1:7878 with SHA256:key1"));
        // A file without a final newline still gets a line of its own.
        std::fs::write(&kh, "a:1 SHA256:a").unwrap();
        KnownHosts::new(kh.clone()).add("b:2", "SHA256:b").unwrap();
        assert_eq!(
            std::fs::read_to_string(&kh).unwrap(),
            "a:1 SHA256:a\nb:2 SHA256:b\n"
        );
    }
}
