//! What a client keeps of a known server between runs, so that its next
//! connection starts in one round trip: TLS 1.3 session tickets (QUIC 0-RTT:
//! the request rides in the first flight) and address-validation tokens
//! (NEW_TOKEN: the server may answer at full rate before the handshake
//! ends, not three times what it received).
//!
//! Beside them, what a put needs to start in its first flight
//! ([`Memo`]): the path RTT the last connection to the server measured, and
//! which targets the client put there lately.
//!
//! All sit in one file beside the known-hosts file (`known_hosts.resume`,
//! mode 0600, locked while read and rewritten), a line each:
//! `HOST:PORT FINGERPRINT ticket|token|rtt|put EXPIRES BASE64`. An entry serves only
//! the host it came from while the known-hosts file names the fingerprint it
//! was stored under: a changed entry drops them. A ticket or a token is taken
//! out of the file when a connection uses it, so none is ever used twice.
//!
//! Only a client that keeps a known-hosts file keeps these (`--ssh` does
//! not: its one-shot server has a fresh key every time).

use crate::identity::{KnownHosts, TrustOutcome, TrustPolicy};
use base64::Engine as _;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::{ClientSessionStore, ResolvesClientCert, Tls13ClientSessionValue};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::NamedGroup;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Tickets kept per server (a connection takes one and gets one).
const TICKETS_PER_HOST: usize = 4;
/// Tokens kept per server.
const TOKENS_PER_HOST: usize = 4;
/// How long a token is kept: a server's tokens are valid for as long
/// ([`TOKEN_LIFETIME`]); one from a server restarted since is refused and
/// costs nothing.
pub(crate) const TOKEN_LIFETIME: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// The most lines the file keeps, all servers together.
const MAX_LINES: usize = 4096;
/// Puts remembered per server ([`Memo::put_seen`]).
const PUTS_PER_HOST: usize = 64;
/// How long a put is remembered: a put of the same targets again within
/// this finds them there (unless removed meanwhile).
const PUT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// The file beside `known_hosts` that holds its servers' tickets and tokens.
pub(crate) fn resume_file(known_hosts: &Path) -> PathBuf {
    let mut name = known_hosts.file_name().unwrap_or_default().to_os_string();
    name.push(".resume");
    known_hosts.with_file_name(name)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ticket,
    Token,
    /// The path RTT in microseconds (8 bytes, little-endian).
    Rtt,
    /// A put's targets ([`put_key`]).
    Put,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Ticket => "ticket",
            Kind::Token => "token",
            Kind::Rtt => "rtt",
            Kind::Put => "put",
        }
    }
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: String,
    fingerprint: String,
    kind: Kind,
    expires: u64,
    bytes: Vec<u8>,
}

impl Entry {
    fn parse(line: &str) -> Option<Entry> {
        let mut f = line.split_whitespace();
        let host = f.next()?.to_string();
        let fingerprint = f.next()?.to_string();
        let kind = match f.next()? {
            "ticket" => Kind::Ticket,
            "token" => Kind::Token,
            "rtt" => Kind::Rtt,
            "put" => Kind::Put,
            _ => return None,
        };
        let expires = f.next()?.parse().ok()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(f.next()?)
            .ok()?;
        if f.next().is_some() {
            return None;
        }
        Some(Entry {
            host,
            fingerprint,
            kind,
            expires,
            bytes,
        })
    }

    fn line(&self) -> String {
        format!(
            "{} {} {} {} {}\n",
            self.host,
            self.fingerprint,
            self.kind.name(),
            self.expires,
            base64::engine::general_purpose::STANDARD.encode(&self.bytes)
        )
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The file, locked for one read-and-rewrite.
struct Locked {
    file: std::fs::File,
    entries: Vec<Entry>,
}

impl Locked {
    fn open(path: &Path) -> std::io::Result<Locked> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        file.lock()?;
        // (A file made wider by hand holds secrets: narrow it again.)
        let meta = file.metadata()?;
        if meta.permissions().mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let now = now_secs();
        let entries = text
            .lines()
            .filter_map(Entry::parse)
            .filter(|e| e.expires > now)
            .collect();
        Ok(Locked { file, entries })
    }

    /// Drops `host`'s entries stored under another fingerprint than `fp`
    /// (its known-hosts entry changed).
    fn drop_other_keys(&mut self, host: &str, fp: &str) {
        self.entries
            .retain(|e| e.host != host || e.fingerprint == fp);
    }

    /// Adds an entry of `kind` for `host` under `fp`, keeping the newest
    /// `keep` of its kind for that host.
    fn push(
        &mut self,
        host: &str,
        fp: String,
        kind: Kind,
        bytes: Vec<u8>,
        expires: u64,
        keep: usize,
    ) {
        self.drop_other_keys(host, &fp);
        self.entries.push(Entry {
            host: host.to_string(),
            fingerprint: fp,
            kind,
            expires,
            bytes,
        });
        let mine = |e: &Entry| e.host == host && e.kind == kind;
        let mut extra = self.entries.iter().filter(|e| mine(e)).count();
        self.entries.retain(|e| {
            let drop = extra > keep && mine(e);
            extra -= usize::from(drop);
            !drop
        });
    }

    /// Writes the entries over the file in place: cut (or grown) to their
    /// length first, then written. Not cut to zero: ext4 flushes a file
    /// truncated to zero and written again when it closes (0.3-1.2 ms, three
    /// or four times per get). Cut first: a process killed between the two
    /// calls leaves a prefix of the old lines, which for a ticket or token
    /// taken from the end (the newest, as `take` takes) is exactly the lines
    /// kept, where written first it left the taken one as the old tail.
    fn write(mut self) -> std::io::Result<()> {
        let skip = self.entries.len().saturating_sub(MAX_LINES);
        let text: String = self.entries[skip..].iter().map(Entry::line).collect();
        self.file.set_len(text.len() as u64)?;
        self.file.rewind()?;
        self.file.write_all(text.as_bytes())
    }
}

/// A connection's view of the file: the server it dials (`HOST:PORT` and the
/// fingerprint it is trusted under), and the TLS configuration a stored
/// ticket is bound to. Serves rustls as its session store and quinn as its
/// token store.
pub(crate) struct Resume {
    path: PathBuf,
    policy: TrustPolicy,
    /// The verifier's verdict, once a full handshake ran.
    outcome: Arc<Mutex<Option<TrustOutcome>>>,
    /// The fingerprint the ticket or token taken was stored under: what a
    /// resumed connection (no certificate shown) is trusted as.
    used: Mutex<Option<String>>,
    provider: Arc<CryptoProvider>,
    verifier: Arc<dyn ServerCertVerifier>,
    creds: Arc<dyn ResolvesClientCert>,
    kx_hint: Mutex<Option<NamedGroup>>,
}

impl std::fmt::Debug for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resume")
            .field("path", &self.path)
            .field("host", &self.policy.host)
            .finish_non_exhaustive()
    }
}

impl Resume {
    /// The store for a connection trusted by `policy` (None when it keeps no
    /// known-hosts file), whose TLS configuration is `tls`, built with
    /// `verifier` (whose verdict is `outcome`).
    pub(crate) fn new(
        policy: &TrustPolicy,
        tls: &rustls::ClientConfig,
        verifier: Arc<dyn ServerCertVerifier>,
        outcome: Arc<Mutex<Option<TrustOutcome>>>,
    ) -> Option<Arc<Resume>> {
        let kh = policy.known_hosts.as_ref()?;
        Some(Arc::new(Resume {
            path: resume_file(kh),
            policy: policy.clone(),
            outcome,
            used: Mutex::new(None),
            provider: tls.crypto_provider().clone(),
            verifier,
            creds: tls.client_auth_cert_resolver.clone(),
            kx_hint: Mutex::new(None),
        }))
    }

    fn expected(&self) -> Option<String> {
        expected(&self.policy)
    }

    /// The fingerprint what this connection received is stored under.
    fn trusted_as(&self) -> Option<String> {
        match self.outcome.lock().unwrap().clone() {
            Some(TrustOutcome::New(fp)) => Some(fp),
            Some(TrustOutcome::Known) => self.expected(),
            Some(_) => None,
            // (Resumed: no certificate was shown.)
            None => self.used.lock().unwrap().clone(),
        }
    }

    /// Takes the newest entry of `kind` for this server, and drops the
    /// host's entries stored under another fingerprint.
    fn take(&self, kind: Kind) -> Option<Vec<u8>> {
        let fp = self.expected()?;
        let mut f = match Locked::open(&self.path) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!("{}: {e}", self.path.display());
                return None;
            }
        };
        let host = &self.policy.host;
        f.drop_other_keys(host, &fp);
        let at = f
            .entries
            .iter()
            .rposition(|e| e.host == *host && e.kind == kind);
        let taken = at.map(|at| f.entries.remove(at));
        if let Err(e) = f.write() {
            // Not rewritten: not taken either (never used twice).
            tracing::debug!("{}: {e}", self.path.display());
            return None;
        }
        let taken = taken?;
        *self.used.lock().unwrap() = Some(fp);
        Some(taken.bytes)
    }

    /// Stores `bytes` as an entry of `kind`, valid until `expires`, keeping
    /// the newest `keep` of its kind for this server.
    fn insert(&self, kind: Kind, bytes: Vec<u8>, expires: u64, keep: usize) {
        let Some(fp) = self.trusted_as() else {
            return;
        };
        let stored = Locked::open(&self.path).and_then(|mut f| {
            f.push(&self.policy.host, fp, kind, bytes, expires, keep);
            f.write()
        });
        if let Err(e) = stored {
            tracing::debug!("{}: {e}", self.path.display());
        }
    }
}

/// The fingerprint a stored entry must carry to be used now: the
/// known-hosts file's for the host `policy` trusts (and its
/// `--fingerprint`, if given, the same).
fn expected(policy: &TrustPolicy) -> Option<String> {
    let kh = KnownHosts::new(policy.known_hosts.clone()?);
    let known = kh.lookup(&policy.host).ok()??;
    match &policy.pinned {
        Some(p) if *p != known => None,
        _ => Some(known),
    }
}

/// The key a put's targets are remembered by: its destination and the
/// names of its roots, hashed (the file holds no paths).
pub(crate) fn put_key(dest: &[u8], roots: &[Vec<u8>]) -> Vec<u8> {
    let mut h = blake3::Hasher::new();
    h.update(&(dest.len() as u64).to_le_bytes());
    h.update(dest);
    for r in roots {
        h.update(&(r.len() as u64).to_le_bytes());
        h.update(r);
    }
    h.finalize().as_bytes()[..16].to_vec()
}

/// What a client remembers of its own sessions with a known server (the
/// host its known-hosts file names, under the fingerprint it names there),
/// for a put that starts in its first flight: the path RTT the last
/// connection measured (its first data is timed by it, as no RTT is
/// measured before the server's first answer) and the targets it put there
/// lately (put again, they would be there, and the server would have it
/// wait for its `Want`s: it does not start before the answer then).
#[derive(Debug)]
pub(crate) struct Memo {
    path: PathBuf,
    host: String,
    fingerprint: String,
}

impl Memo {
    /// The memo for the server `policy` trusts: None without a known-hosts
    /// file or an entry in it for the host.
    pub(crate) fn new(policy: &TrustPolicy) -> Option<Memo> {
        Some(Memo {
            path: resume_file(policy.known_hosts.as_ref()?),
            host: policy.host.clone(),
            fingerprint: expected(policy)?,
        })
    }

    /// The file's entries for this server, the file rewritten with `edit`
    /// applied (other fingerprints' entries of the host dropped).
    fn with<T>(&self, edit: impl FnOnce(&mut Locked) -> T) -> Option<T> {
        let done = Locked::open(&self.path).and_then(|mut f| {
            f.drop_other_keys(&self.host, &self.fingerprint);
            let out = edit(&mut f);
            f.write().map(|()| out)
        });
        done.map_err(|e| tracing::debug!("{}: {e}", self.path.display()))
            .ok()
    }

    /// Adds an entry of `kind`, unless `once` and the same one is there.
    fn add(&self, kind: Kind, bytes: Vec<u8>, life: std::time::Duration, keep: usize, once: bool) {
        let expires = now_secs() + life.as_secs();
        let fp = self.fingerprint.clone();
        self.with(|f| {
            if !(once && self.find(f, kind, Some(&bytes)).is_some()) {
                f.push(&self.host, fp, kind, bytes, expires, keep);
            }
        });
    }

    /// The newest entry of `kind` for this server (with these `bytes`).
    fn find<'f>(&self, f: &'f Locked, kind: Kind, bytes: Option<&[u8]>) -> Option<&'f Entry> {
        f.entries.iter().rev().find(|e| {
            e.host == self.host
                && e.fingerprint == self.fingerprint
                && e.kind == kind
                && bytes.is_none_or(|b| e.bytes == b)
        })
    }

    /// [`Memo::find`], read without rewriting the file.
    fn has(&self, kind: Kind, bytes: Option<&[u8]>) -> Option<Vec<u8>> {
        let read = Locked::open(&self.path)
            .map_err(|e| tracing::debug!("{}: {e}", self.path.display()))
            .ok()?;
        self.find(&read, kind, bytes).map(|e| e.bytes.clone())
    }

    /// The path RTT the last connection to the server measured.
    pub(crate) fn rtt(&self) -> Option<std::time::Duration> {
        let b: [u8; 8] = self.has(Kind::Rtt, None)?.try_into().ok()?;
        let us = u64::from_le_bytes(b);
        (us > 0).then(|| std::time::Duration::from_micros(us))
    }

    /// Remembers `rtt` as the path RTT (for [`TOKEN_LIFETIME`]).
    pub(crate) fn set_rtt(&self, rtt: std::time::Duration) {
        let us = rtt.as_micros().min(u64::MAX as u128) as u64;
        if us > 0 {
            self.add(
                Kind::Rtt,
                us.to_le_bytes().to_vec(),
                TOKEN_LIFETIME,
                1,
                false,
            );
        }
    }

    /// Whether a put of `key` ([`put_key`]) went to the server lately.
    pub(crate) fn put_seen(&self, key: &[u8]) -> bool {
        self.has(Kind::Put, Some(key)).is_some()
    }

    /// Remembers a put of `key` (once).
    pub(crate) fn add_put(&self, key: Vec<u8>) {
        self.add(Kind::Put, key, PUT_LIFETIME, PUTS_PER_HOST, true);
    }
}

impl ClientSessionStore for Resume {
    fn set_kx_hint(&self, _: ServerName<'static>, group: NamedGroup) {
        *self.kx_hint.lock().unwrap() = Some(group);
    }

    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        *self.kx_hint.lock().unwrap()
    }

    fn set_tls12_session(
        &self,
        _: ServerName<'static>,
        _: rustls::client::Tls12ClientSessionValue,
    ) {
    }

    fn tls12_session(&self, _: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        None
    }

    fn remove_tls12_session(&self, _: &ServerName<'static>) {}

    fn insert_tls13_ticket(&self, _: ServerName<'static>, value: Tls13ClientSessionValue) {
        // (rustls keeps a ticket for 24 h at most from its server: the
        // expiry is checked again when it is taken.)
        let expires = now_secs() + 24 * 3600;
        self.insert(Kind::Ticket, value.to_stored(), expires, TICKETS_PER_HOST);
    }

    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        let bytes = self.take(Kind::Ticket)?;
        Tls13ClientSessionValue::from_stored(&bytes, &self.provider, &self.verifier, &self.creds)
    }
}

impl quinn::TokenStore for Resume {
    fn insert(&self, _: &str, token: bytes::Bytes) {
        let expires = now_secs() + TOKEN_LIFETIME.as_secs();
        Resume::insert(self, Kind::Token, token.to_vec(), expires, TOKENS_PER_HOST);
    }

    fn take(&self, _: &str) -> Option<bytes::Bytes> {
        Resume::take(self, Kind::Token).map(bytes::Bytes::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, fp: &str, kind: Kind, bytes: &[u8]) -> Entry {
        Entry {
            host: host.into(),
            fingerprint: fp.into(),
            kind,
            expires: now_secs() + 100,
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn a_line_reads_back_as_written_and_a_bad_one_is_skipped() {
        let e = entry("h:1", "SHA256:abc", Kind::Token, b"\x00\xffxyz");
        assert_eq!(Entry::parse(&e.line()), Some(e));
        assert_eq!(Entry::parse("h:1 SHA256:abc cookie 9 AAAA"), None);
        assert_eq!(Entry::parse("h:1 SHA256:abc token x AAAA"), None);
        assert_eq!(Entry::parse("h:1 SHA256:abc token 9 AAAA extra"), None);
        assert_eq!(Entry::parse("h:1 SHA256:abc token 9 !!"), None);
    }

    fn store(dir: &Path, host: &str, fp: &str) -> Resume {
        let kh = dir.join("known_hosts");
        std::fs::write(&kh, format!("{host} {fp}\n")).unwrap();
        let policy = TrustPolicy {
            host: host.into(),
            known_hosts: Some(kh),
            pinned: None,
            accept_new: false,
        };
        let verifier = Arc::new(crate::identity::PinVerifier::new(policy.clone()));
        let outcome = verifier.outcome.clone();
        let tls = crate::identity::client_tls(verifier.clone()).unwrap();
        Arc::into_inner(Resume::new(&policy, &tls, verifier, outcome).unwrap()).unwrap()
    }

    #[test]
    fn a_token_is_taken_once_newest_first_and_only_by_its_host() {
        let dir = tempfile::tempdir().unwrap();
        let a = store(dir.path(), "a:1", "SHA256:A");
        *a.outcome.lock().unwrap() = Some(TrustOutcome::Known);
        for t in [b"t1", b"t2"] {
            quinn::TokenStore::insert(&a, "longhaul", bytes::Bytes::from_static(t));
        }
        let mode = std::fs::metadata(resume_file(&dir.path().join("known_hosts")))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        // Another host in the same known-hosts file sees none of them.
        let b = store(dir.path(), "b:1", "SHA256:B");
        std::fs::write(
            dir.path().join("known_hosts"),
            "a:1 SHA256:A\nb:1 SHA256:B\n",
        )
        .unwrap();
        assert_eq!(quinn::TokenStore::take(&b, "longhaul"), None);
        assert_eq!(
            quinn::TokenStore::take(&a, "longhaul").as_deref(),
            Some(&b"t2"[..])
        );
        assert_eq!(
            quinn::TokenStore::take(&a, "longhaul").as_deref(),
            Some(&b"t1"[..])
        );
        assert_eq!(quinn::TokenStore::take(&a, "longhaul"), None);
    }

    #[test]
    fn a_rewrite_that_shrinks_the_file_leaves_exactly_the_lines_kept() {
        // (The file is rewritten in place at its new length: nothing of
        // the longer old text may stay behind.)
        let dir = tempfile::tempdir().unwrap();
        let a = store(dir.path(), "a:1", "SHA256:A");
        *a.outcome.lock().unwrap() = Some(TrustOutcome::Known);
        let long = vec![7u8; 300];
        quinn::TokenStore::insert(&a, "longhaul", bytes::Bytes::from(long.clone()));
        quinn::TokenStore::insert(&a, "longhaul", bytes::Bytes::from_static(b"short"));
        let path = resume_file(&dir.path().join("known_hosts"));
        let before = std::fs::read_to_string(&path).unwrap();
        assert_eq!(before.lines().count(), 2);
        // The newest (short) one goes; the long one's line is all that is left.
        assert_eq!(
            quinn::TokenStore::take(&a, "longhaul").as_deref(),
            Some(&b"short"[..])
        );
        let after = std::fs::read_to_string(&path).unwrap();
        assert_eq!(after, before.lines().next().unwrap().to_string() + "\n");
        assert_eq!(
            quinn::TokenStore::take(&a, "longhaul").as_deref(),
            Some(&long[..])
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"");
    }

    #[test]
    fn a_changed_known_hosts_entry_drops_what_was_kept_under_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let a = store(dir.path(), "a:1", "SHA256:A");
        *a.outcome.lock().unwrap() = Some(TrustOutcome::Known);
        quinn::TokenStore::insert(&a, "longhaul", bytes::Bytes::from_static(b"old"));
        std::fs::write(dir.path().join("known_hosts"), "a:1 SHA256:NEW\n").unwrap();
        assert_eq!(quinn::TokenStore::take(&a, "longhaul"), None);
        let text = std::fs::read_to_string(resume_file(&dir.path().join("known_hosts"))).unwrap();
        assert_eq!(text, "", "the old server's token is gone");
    }

    #[test]
    fn no_more_than_the_cap_is_kept_per_host() {
        let dir = tempfile::tempdir().unwrap();
        let a = store(dir.path(), "a:1", "SHA256:A");
        *a.outcome.lock().unwrap() = Some(TrustOutcome::Known);
        for i in 0..10u8 {
            quinn::TokenStore::insert(&a, "longhaul", bytes::Bytes::from(vec![i]));
        }
        let mut got = Vec::new();
        while let Some(t) = quinn::TokenStore::take(&a, "longhaul") {
            got.push(t[0]);
        }
        assert_eq!(got, [9, 8, 7, 6]);
    }

    #[test]
    fn a_memo_keeps_the_last_rtt_and_the_puts_made_for_its_server_only() {
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let kh = dir.path().join("known_hosts");
        std::fs::write(&kh, "a:1 SHA256:A\nb:1 SHA256:B\n").unwrap();
        let policy = |host: &str| TrustPolicy {
            host: host.into(),
            known_hosts: Some(kh.clone()),
            pinned: None,
            accept_new: false,
        };
        let (a, b) = (
            Memo::new(&policy("a:1")).unwrap(),
            Memo::new(&policy("b:1")).unwrap(),
        );
        assert!(Memo::new(&policy("c:1")).is_none(), "no known-hosts entry");
        assert_eq!(a.rtt(), None);
        a.set_rtt(Duration::from_micros(700_123));
        a.set_rtt(Duration::from_micros(701_000));
        assert_eq!(a.rtt(), Some(Duration::from_micros(701_000)));
        assert_eq!(
            a.rtt(),
            Some(Duration::from_micros(701_000)),
            "read, not taken"
        );
        assert_eq!(b.rtt(), None);
        let key = |dest: &[u8], root: &[u8]| put_key(dest, &[root.to_vec()]);
        let k = key(b"incoming/", b"run-1");
        assert_ne!(k, key(b"incoming/", b"run-2"));
        assert_ne!(key(b"ab", b"c"), key(b"a", b"bc"));
        assert!(!a.put_seen(&k));
        a.add_put(k.clone());
        a.add_put(k.clone());
        assert!(a.put_seen(&k) && !b.put_seen(&k));
        let text = std::fs::read_to_string(resume_file(&kh)).unwrap();
        let count = |kind: &str| text.lines().filter(|l| l.contains(kind)).count();
        assert_eq!((count(" rtt "), count(" put ")), (1, 1), "{text}");
        // The server's key changed: all of it forgotten.
        std::fs::write(&kh, "a:1 SHA256:NEW\n").unwrap();
        let a = Memo::new(&policy("a:1")).unwrap();
        assert_eq!(a.rtt(), None);
        assert!(!a.put_seen(&k));
    }

    #[test]
    fn a_refused_server_gets_nothing_stored() {
        let dir = tempfile::tempdir().unwrap();
        let a = store(dir.path(), "a:1", "SHA256:A");
        *a.outcome.lock().unwrap() = Some(TrustOutcome::Unknown("SHA256:X".into()));
        quinn::TokenStore::insert(&a, "longhaul", bytes::Bytes::from_static(b"t"));
        *a.outcome.lock().unwrap() = Some(TrustOutcome::Known);
        assert_eq!(quinn::TokenStore::take(&a, "longhaul"), None);
    }
}
