//! Who may read `--metrics`: the Prometheus exporter-toolkit's web configuration file
//! (`--metrics-web-config FILE`: `tls_server_config` with `cert_file` and `key_file`,
//! `basic_auth_users` with bcrypt hashes), and a bearer token (`--metrics-bearer-token-file`).
//!
//! The same field names as the exporter-toolkit's (github.com/prometheus/exporter-toolkit,
//! docs/web-configuration.md), so that one file serves both; a field gpu-trace does not implement
//! (client certificates, cipher suites, HTTP headers...) is refused rather than ignored: ignoring
//! `client_ca_file` would serve to anyone a file that meant to restrict it.

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use base64::Engine as _;
use serde::Deserialize;
use subtle::ConstantTimeEq as _;
use thiserror::Error;
use tokio_rustls::rustls;

/// The largest configuration, token, certificate or key file read (they are a few KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The highest bcrypt cost accepted: each check of a password costs 2^cost rounds on the
/// server's thread (cost 14: about a second), and a hash of cost 31 would stall it for days.
pub const MAX_BCRYPT_COST: u32 = 14;

/// Verified (user, password) pairs remembered, so that a scraper's every scrape does not cost a
/// bcrypt check (the exporter-toolkit caches them too).
const CACHE: usize = 16;

#[derive(Debug, Error)]
pub enum AccessError {
    #[error("--metrics-web-config {path}: {why}")]
    WebConfig { path: PathBuf, why: String },
    #[error(
        "--metrics-bearer-token-file {path}: {why} (the file holds the token on one line; \
         Prometheus sends it with `authorization: {{credentials_file: FILE}}`)"
    )]
    Token { path: PathBuf, why: String },
    #[error(
        "--dump-token-file {path}: {why} (the file holds the token on one line; a client sends \
         it with `Authorization: Bearer TOKEN` on POST /dump)"
    )]
    DumpToken { path: PathBuf, why: String },
}

/// The web configuration file (the exporter-toolkit's fields that gpu-trace implements).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    #[serde(default)]
    pub tls_server_config: Option<TlsServerConfig>,
    /// User name → bcrypt hash of the password (`htpasswd -nBC 10 USER`).
    #[serde(default)]
    pub basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsServerConfig {
    /// PEM certificate chain (relative paths: from the configuration file's directory).
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// What the server enforces.
#[derive(Default)]
pub struct Access {
    users: BTreeMap<String, String>,
    bearer: Option<Vec<u8>>,
    verified: Mutex<Vec<(String, String)>>,
    /// No uncached password check before this instant (after a failed one).
    pause_until: Mutex<Option<std::time::Instant>>,
    /// TLS, when configured.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `--dump-token-file`: the token `POST /dump` must carry (`None`: `POST /dump` is off).
    dump_token: Option<Vec<u8>>,
}

/// What a `POST /dump` may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpAccess {
    /// No `--dump-token-file`: the endpoint takes no dump.
    Off,
    /// No token, or another one.
    Refused,
    Allowed,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("bearer", &self.bearer.is_some())
            .field("tls", &self.tls.is_some())
            .field("dump_token", &self.dump_token.is_some())
            .finish()
    }
}

/// A token file: one line of characters an HTTP header can carry.
fn read_token(path: &Path) -> Result<Vec<u8>, String> {
    let raw = read_bounded(path).map_err(|e| e.to_string())?;
    let token = raw.trim_ascii();
    if token.is_empty() {
        return Err("the file is empty".into());
    }
    if token.iter().any(|b| !b.is_ascii_graphic() && *b != b' ') {
        return Err("the token has characters an HTTP header cannot carry".into());
    }
    Ok(token.to_vec())
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes: not a configuration file"
        )));
    }
    Ok(buf)
}

/// The cost of a bcrypt hash (`$2y$10$...`), if it looks like one.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let mut parts = hash.split('$');
    let (empty, variant, cost, rest) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if !empty.is_empty() || !matches!(variant, "2a" | "2b" | "2x" | "2y") || rest.len() != 53 {
        return None;
    }
    cost.parse().ok()
}

impl WebConfig {
    /// Parses a web configuration (`path` for messages).
    pub fn parse(text: &[u8], path: &Path) -> Result<Self, AccessError> {
        let err = |why: String| AccessError::WebConfig {
            path: path.to_owned(),
            why,
        };
        let text = std::str::from_utf8(text).map_err(|_| err("not UTF-8 text".into()))?;
        let c: WebConfig = if text.trim().is_empty() {
            WebConfig::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| {
                err(format!(
                    "{e} (gpu-trace implements tls_server_config.cert_file, \
                     tls_server_config.key_file and basic_auth_users of the exporter-toolkit's \
                     format)"
                ))
            })?
        };
        for (user, hash) in &c.basic_auth_users {
            match bcrypt_cost(hash) {
                None => {
                    return Err(err(format!(
                        "basic_auth_users: the password of {:?} is not a bcrypt hash \
                         (make one with `htpasswd -nBC 10 USER`)",
                        gpu_trace_core::escape::escape_text(user)
                    )));
                }
                Some(cost) if cost > MAX_BCRYPT_COST => {
                    return Err(err(format!(
                        "basic_auth_users: the hash of {:?} has cost {cost}, above \
                         {MAX_BCRYPT_COST}: each scrape would take minutes of CPU; make it with \
                         `htpasswd -nBC 10 USER`",
                        gpu_trace_core::escape::escape_text(user)
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(c)
    }
}

fn tls_config(
    tls: &TlsServerConfig,
    dir: &Path,
    path: &Path,
) -> Result<rustls::ServerConfig, AccessError> {
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let err = |why: String| AccessError::WebConfig {
        path: path.to_owned(),
        why,
    };
    let (cert_path, key_path) = (dir.join(&tls.cert_file), dir.join(&tls.key_file));
    let unread = |field: &str, file: &Path, e: std::io::Error| {
        err(format!(
            "{field} {}: {e} (a relative path is taken from the configuration file's directory)",
            file.display()
        ))
    };
    let cert_pem = read_bounded(&cert_path).map_err(|e| unread("cert_file", &cert_path, e))?;
    let key_pem = read_bounded(&key_path).map_err(|e| unread("key_file", &key_path, e))?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(format!("cert_file {}: {e}", cert_path.display())))?;
    if certs.is_empty() {
        return Err(err(format!(
            "cert_file {}: no PEM certificate in it",
            cert_path.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        err(format!(
            "key_file {}: {e} (it must hold the unencrypted PEM private key of cert_file: \
             `openssl req -x509 -nodes ...` writes one)",
            key_path.display()
        ))
    })?;
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            err(format!(
                "cert_file {} and key_file {}: {e} (is the key the certificate's?)",
                cert_path.display(),
                key_path.display()
            ))
        })
}

impl Access {
    /// Reads `--metrics-web-config` and `--metrics-bearer-token-file`.
    pub fn load(web_config: Option<&Path>, token_file: Option<&Path>) -> Result<Self, AccessError> {
        let mut access = Access::default();
        if let Some(path) = web_config {
            let text = read_bounded(path).map_err(|e| AccessError::WebConfig {
                path: path.to_owned(),
                why: e.to_string(),
            })?;
            let c = WebConfig::parse(&text, path)?;
            if let Some(tls) = &c.tls_server_config {
                let dir = path.parent().unwrap_or(Path::new("."));
                access.tls = Some(Arc::new(tls_config(tls, dir, path)?));
            }
            access.users = c.basic_auth_users;
        }
        if let Some(path) = token_file {
            let err = |why: String| AccessError::Token {
                path: path.to_owned(),
                why,
            };
            access.bearer = Some(read_token(path).map_err(err)?);
        }
        Ok(access)
    }

    /// `--dump-token-file`: `POST /dump` takes a dump when it carries the token in `path`.
    pub fn with_dump_token(mut self, path: &Path) -> Result<Self, AccessError> {
        let token = read_token(path).map_err(|why| AccessError::DumpToken {
            path: path.to_owned(),
            why,
        })?;
        self.dump_token = Some(token);
        Ok(self)
    }

    /// Whether a `POST /dump` with this `Authorization` header value (`Bearer TOKEN`) may take a
    /// dump; the token compared in constant time. The metrics' own credentials grant nothing
    /// here.
    pub fn dump(&self, authorization: Option<&[u8]>) -> DumpAccess {
        let Some(token) = self.dump_token.as_deref() else {
            return DumpAccess::Off;
        };
        let given = authorization.and_then(|v| {
            let i = v.iter().position(|&b| b == b' ')?;
            v[..i]
                .eq_ignore_ascii_case(b"bearer")
                .then(|| v[i + 1..].trim_ascii())
        });
        match given {
            Some(g) if bool::from(token.ct_eq(g)) => DumpAccess::Allowed,
            _ => DumpAccess::Refused,
        }
    }

    /// Whether requests must authenticate (basic users or a bearer token configured).
    pub fn required(&self) -> bool {
        !self.users.is_empty() || self.bearer.is_some()
    }

    /// The `WWW-Authenticate` challenge of a 401.
    pub fn challenge(&self) -> &'static str {
        if self.users.is_empty() {
            "Bearer"
        } else {
            "Basic realm=\"gpu-trace\""
        }
    }

    /// Whether a request with this `Authorization` header value may read the metrics.
    pub fn allows(&self, authorization: Option<&[u8]>) -> bool {
        if !self.required() {
            return true;
        }
        let Some(value) = authorization else {
            return false;
        };
        let (scheme, credentials) = match value.iter().position(|&b| b == b' ') {
            Some(i) => (&value[..i], value[i + 1..].trim_ascii()),
            None => return false,
        };
        if scheme.eq_ignore_ascii_case(b"bearer") {
            return self
                .bearer
                .as_deref()
                .is_some_and(|t| bool::from(t.ct_eq(credentials)));
        }
        if !scheme.eq_ignore_ascii_case(b"basic") || self.users.is_empty() {
            return false;
        }
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(credentials) else {
            return false;
        };
        let Ok(decoded) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = decoded.split_once(':') else {
            return false;
        };
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if verified.iter().any(|(u, p)| {
            bool::from(
                u.as_bytes().ct_eq(user.as_bytes()) & p.as_bytes().ct_eq(password.as_bytes()),
            )
        }) {
            return true;
        }
        // A bcrypt check costs the server's thread up to a second of CPU: after one that failed,
        // no other for 9 times as long (at most 10% of a CPU spent on wrong passwords).
        let mut pause = self.pause_until.lock().unwrap_or_else(|p| p.into_inner());
        let start = std::time::Instant::now();
        if pause.is_some_and(|until| start < until) {
            return false;
        }
        let right = match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // The same work as for a known user, so that timing does not tell users apart.
                if let Ok(dummy) = DUMMY_HASH.get_or_init(|| bcrypt::hash("no such user", 10)) {
                    let _ = bcrypt::verify(password, dummy);
                }
                false
            }
        };
        if right {
            if verified.len() >= CACHE {
                verified.remove(0);
            }
            verified.push((user.to_owned(), password.to_owned()));
        } else {
            *pause = Some(std::time::Instant::now() + start.elapsed() * FAILED_CHECK_PAUSE);
        }
        right
    }
}

/// After a failed password check, no other (uncached) check for this many times its duration.
const FAILED_CHECK_PAUSE: u32 = 9;

/// A bcrypt hash (cost 10), checked for unknown users.
static DUMMY_HASH: std::sync::OnceLock<bcrypt::BcryptResult<String>> = std::sync::OnceLock::new();

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
        .into_bytes()
    }

    #[test]
    fn the_exporter_toolkit_fields_are_read_and_others_refused() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let yaml = format!("basic_auth_users:\n  prom: {hash}\n");
        let c = WebConfig::parse(yaml.as_bytes(), Path::new("w.yml")).unwrap();
        assert_eq!(c.basic_auth_users["prom"], hash);
        let c = WebConfig::parse(
            b"tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n",
            Path::new("w.yml"),
        )
        .unwrap();
        assert_eq!(c.tls_server_config.unwrap().cert_file, Path::new("a.crt"));
        for bad in [
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca\n",
            "http_server_config:\n  http2: false\n",
            "basic_auth_users:\n  prom: plaintext\n",
            // Cost 31: ~days per check.
            "basic_auth_users:\n  prom: $2y$31$sxGSkbMWKDRt3ohgmN7b1.KSOMVUtCKhK1o8OTzqbu9dkaCNh.Iwi\n",
            "basic_auth_users: [1, 2]\n",
        ] {
            assert!(
                WebConfig::parse(bad.as_bytes(), Path::new("w.yml")).is_err(),
                "accepted: {bad}"
            );
        }
    }

    /// A web configuration with the basic user `prom`/`s3cret` (bcrypt, cost 4) and a token
    /// file holding `tok-123`, written into `dir`: their paths.
    pub(crate) fn credentials(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let web = dir.join("web.yml");
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        std::fs::write(&web, format!("basic_auth_users:\n  prom: '{hash}'\n")).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "tok-123\n").unwrap();
        (web, token)
    }

    #[test]
    fn basic_and_bearer_credentials_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (web, token) = credentials(dir.path());

        let open = Access::load(None, None).unwrap();
        assert!(!open.required() && open.allows(None));

        let a = Access::load(Some(&web), Some(&token)).unwrap();
        assert!(a.required());
        assert!(!a.allows(None));
        assert!(a.allows(Some(&basic("prom", "s3cret"))));
        assert!(!a.allows(Some(&basic("prom", "wrong"))));
        assert!(a.allows(Some(&basic("prom", "s3cret")))); // from the cache: no pause
        assert!(!a.allows(Some(&basic("other", "s3cret"))));
        assert!(!a.allows(Some(b"Basic !!!notbase64")));
        assert!(a.allows(Some(b"Bearer tok-123")));
        assert!(a.allows(Some(b"bearer tok-123")));
        assert!(!a.allows(Some(b"Bearer tok-12")));
        assert!(!a.allows(Some(b"Bearer tok-1234")));
        assert!(!a.allows(Some(b"tok-123")));

        std::fs::write(&token, "\n").unwrap();
        assert!(Access::load(None, Some(&token)).is_err());
    }

    /// Wrong passwords cannot keep the server's thread busy with bcrypt: after a failed check,
    /// even the right password (not yet verified) is refused for 9 times the check's duration,
    /// then accepted.
    #[test]
    fn failed_password_checks_are_paced() {
        let dir = tempfile::tempdir().unwrap();
        let web = dir.path().join("web.yml");
        let hash = bcrypt::hash("s3cret", 8).unwrap();
        std::fs::write(&web, format!("basic_auth_users:\n  prom: '{hash}'\n")).unwrap();
        let a = Access::load(Some(&web), None).unwrap();
        let t = std::time::Instant::now();
        assert!(!a.allows(Some(&basic("prom", "wrong"))));
        let check = t.elapsed();
        assert!(
            !a.allows(Some(&basic("prom", "s3cret"))),
            "checked during the pause"
        );
        std::thread::sleep(check * (FAILED_CHECK_PAUSE + 1));
        assert!(a.allows(Some(&basic("prom", "s3cret"))));
    }
}
