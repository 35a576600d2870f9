//! Who is asking: signed session cookies (for browsers, with a double-submit CSRF token) and API
//! tokens (for machines, `Authorization: Bearer`). Passwords are argon2id hashes.
//!
//! A session cookie is `<session id>.<user id>.<token_version>.<signature>`, signed with HMAC-
//! SHA256 under the secret every node shares, so any node can check it; the node then reads the
//! session and user rows, so a logout, an expiry (database clock) or a bumped `token_version`
//! refuses the very next request on every node. The CSRF token is derived from the session id
//! with the same secret: a cookie an attacker planted cannot match it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use store::UserRow;

use super::error::ApiError;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "reins_session";
/// The CSRF cookie's name; state-changing requests repeat it in [`CSRF_HEADER`].
pub const CSRF_COOKIE: &str = "csrf_token";
pub const CSRF_HEADER: &str = "x-csrf-token";
/// API tokens start with this, so that a leaked one is recognisable (and greppable).
const TOKEN_PREFIX: &str = "reins_";
/// Shortest password accepted, in characters.
pub const PASSWORD_CHARS_MIN: usize = 12;
/// Longest password accepted (argon2 takes any length; this bounds the work).
pub const PASSWORD_CHARS_MAX: usize = 256;
/// Longest email accepted, in bytes (RFC 5321's path limit), and its parts.
pub const EMAIL_BYTES_MAX: usize = 254;
const EMAIL_LOCAL_BYTES_MAX: usize = 64;

type HmacSha256 = Hmac<Sha256>;

/// The secret shared by every node.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub fn new(secret: &str) -> Self {
        Secret(secret.as_bytes().to_vec())
    }

    fn mac(&self, purpose: &str, message: &str) -> HmacSha256 {
        // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length");
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        mac.update(message.as_bytes());
        mac
    }

    fn sign(&self, purpose: &str, message: &str) -> String {
        URL_SAFE_NO_PAD.encode(self.mac(purpose, message).finalize().into_bytes())
    }

    fn verify(&self, purpose: &str, message: &str, signature: &str) -> bool {
        let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
            return false;
        };
        self.mac(purpose, message).verify_slice(&signature).is_ok()
    }

    /// The session cookie's value for a new session.
    pub fn session_cookie(&self, session_id: &str, user: &UserRow) -> String {
        let message = format!("{session_id}.{}.{}", user.id, user.token_version);
        let signature = self.sign("session", &message);
        format!("{message}.{signature}")
    }

    /// The CSRF token that belongs to a session.
    pub fn csrf_token(&self, session_id: &str) -> String {
        self.sign("csrf", session_id)
    }
}

/// What a session cookie claims, once its signature checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionClaim {
    pub session_id: String,
    pub user_id: String,
    pub token_version: i64,
}

/// Checks a session cookie's signature; `None` for anything not signed with this secret.
pub fn verify_session_cookie(secret: &Secret, value: &str) -> Option<SessionClaim> {
    let (message, signature) = value.rsplit_once('.')?;
    if !secret.verify("session", message, signature) {
        return None;
    }
    let mut parts = message.splitn(3, '.');
    let session_id = parts.next()?.to_owned();
    let user_id = parts.next()?.to_owned();
    let token_version = parts.next()?.parse().ok()?;
    Some(SessionClaim {
        session_id,
        user_id,
        token_version,
    })
}

/// `n` random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], ApiError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| {
        ApiError::new(
            hyper::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the operating system gave no randomness: {e}"),
        )
    })?;
    Ok(bytes)
}

/// A new random identifier (128 bits, hex).
pub fn new_id() -> Result<String, ApiError> {
    Ok(random_bytes::<16>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A secret for `reins keygen`: 256 random bits, base64url.
pub fn new_secret() -> Result<String, ApiError> {
    Ok(URL_SAFE_NO_PAD.encode(random_bytes::<32>()?))
}

/// A new API token: `(token id, the token to hand out once, the hash to store)`.
pub fn new_token() -> Result<(String, String, String), ApiError> {
    let id = new_id()?;
    let secret = URL_SAFE_NO_PAD.encode(random_bytes::<32>()?);
    let hash = token_hash(&secret);
    Ok((id.clone(), format!("{TOKEN_PREFIX}{id}_{secret}"), hash))
}

fn token_hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Splits a bearer token into its id and secret; `None` when it is not shaped like one of ours.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && !secret.is_empty())
        .then_some((id, secret))
}

/// Whether `secret` is the one whose hash was stored.
pub fn token_matches(secret: &str, stored_hash: &str) -> bool {
    same(&token_hash(secret), stored_hash)
}

/// Equality in time that depends only on the lengths, not on where the strings differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The one form of an email that is stored and looked up: trimmed, ASCII letters in lower case
/// (the migration that normalised existing rows lowers exactly those, on both backends).
pub fn normalize_email(email: &str) -> String {
    email.trim().to_ascii_lowercase()
}

/// Whether a normalised email is shaped like `local@domain`: one `@`, bounded parts, no
/// whitespace, control characters or characters that quote or delimit markup and headers, and a
/// domain of non-empty labels of letters, digits and inner hyphens.
fn email_shaped(email: &str) -> bool {
    const FORBIDDEN: &[char] = &[
        '<', '>', '"', '\'', '`', '(', ')', '[', ']', '\\', ',', ';', ':', '@', '/',
    ];
    let Some((local, domain)) = email.split_once('@') else {
        return false;
    };
    let local_ok = !local.is_empty()
        && local.len() <= EMAIL_LOCAL_BYTES_MAX
        && !local.starts_with('.')
        && !local.ends_with('.')
        && !local.contains("..")
        && !local
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || FORBIDDEN.contains(&c));
    let domain_ok = domain.split('.').all(|label| {
        !label.is_empty()
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_alphanumeric() || c == '-')
    });
    email.len() <= EMAIL_BYTES_MAX && local_ok && domain_ok
}

/// Checks a new user's email and password before anything is hashed or stored; answers the
/// email in its normalised form.
pub fn check_credentials(email: &str, password: &str) -> Result<String, ApiError> {
    let normalized = normalize_email(email);
    if !email_shaped(&normalized) {
        return Err(ApiError::bad_request(format!(
            "email {email:?} is not an address like name@example.com"
        )));
    }
    let chars = password.chars().count();
    if !(PASSWORD_CHARS_MIN..=PASSWORD_CHARS_MAX).contains(&chars) {
        return Err(ApiError::refused(format!(
            "a password has {PASSWORD_CHARS_MIN} to {PASSWORD_CHARS_MAX} characters, this one {chars}"
        )));
    }
    let lowered = normalize_email(password);
    let local = normalized.split_once('@').map_or("", |(local, _)| local);
    if lowered == normalized || lowered == local {
        return Err(ApiError::refused(
            "the password must not be the email or its part before the @",
        ));
    }
    Ok(normalized)
}

/// An argon2id hash of `password` (off the async threads: it is slow on purpose).
pub async fn hash_password(password: String) -> Result<String, ApiError> {
    let salt = random_bytes::<16>()?;
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|hash| hash.to_string())
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|hashed| hashed)
    .map_err(|e| {
        ApiError::new(
            hyper::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot hash the password: {e}"),
        )
    })
}

/// Whether `password` matches `stored` (an argon2 hash). With no stored hash (unknown user) it
/// still does the work of one check, so that timing does not tell which emails exist.
pub async fn verify_password(stored: Option<String>, password: String) -> bool {
    tokio::task::spawn_blocking(move || {
        let real = stored.is_some();
        let stored = stored.unwrap_or_else(|| decoy_hash().to_owned());
        let matches = PasswordHash::new(&stored).is_ok_and(|hash| {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        });
        // The decoy never authenticates anyone, even someone who typed its password.
        matches && real
    })
    .await
    .unwrap_or(false)
}

/// A valid argon2id hash of a password nobody has, computed once.
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| {
        let salt = SaltString::encode_b64(b"reins-decoy-salt").expect("a 16-byte salt encodes");
        Argon2::default()
            .hash_password(b"\0decoy\0", &salt)
            .map(|hash| hash.to_string())
            .unwrap_or_default()
    })
}

/// Failed sign-ins per client address within a window (this node's memory: a cluster behind a
/// balancer multiplies the budget by its nodes, which still bounds guessing).
pub struct LoginThrottle {
    failures_max: u32,
    window: Duration,
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// Addresses remembered at most; past it, expired entries are dropped first.
const THROTTLE_ADDRESSES_MAX: usize = 100_000;

impl LoginThrottle {
    pub fn new(failures_max: u32, window: Duration) -> Self {
        LoginThrottle {
            failures_max,
            window,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(seconds to wait)` while `address` has used up its failures.
    pub fn check(&self, address: IpAddr) -> Result<(), u64> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        match failures.get(&address) {
            Some((count, since))
                if *count >= self.failures_max && since.elapsed() < self.window =>
            {
                Err((self.window - since.elapsed()).as_secs().max(1))
            }
            _ => Ok(()),
        }
    }

    pub fn failed(&self, address: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= THROTTLE_ADDRESSES_MAX {
            let window = self.window;
            failures.retain(|_, (_, since)| since.elapsed() < window);
        }
        let entry = failures.entry(address).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= self.window {
            *entry = (0, Instant::now());
        }
        entry.0 = entry.0.saturating_add(1);
    }

    pub fn succeeded(&self, address: IpAddr) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.remove(&address);
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(token_version: i64) -> UserRow {
        UserRow {
            id: "u1".into(),
            email: "a@b.c".into(),
            password_hash: String::new(),
            is_admin: false,
            token_version,
        }
    }

    #[test]
    fn a_session_cookie_verifies_only_under_its_own_secret_and_unaltered() {
        let secret = Secret::new("s".repeat(40).as_str());
        let cookie = secret.session_cookie("sid", &user(3));
        let claim = verify_session_cookie(&secret, &cookie).expect("verifies");
        assert_eq!(
            claim,
            SessionClaim {
                session_id: "sid".into(),
                user_id: "u1".into(),
                token_version: 3
            }
        );
        let other = Secret::new("t".repeat(40).as_str());
        assert_eq!(verify_session_cookie(&other, &cookie), None);
        let bumped = cookie.replacen(".3.", ".4.", 1);
        assert_eq!(verify_session_cookie(&secret, &bumped), None);
        assert_eq!(verify_session_cookie(&secret, "garbage"), None);
    }

    #[test]
    fn tokens_parse_and_match_only_their_own_hash() {
        let (id, token, hash) = new_token().expect("random");
        let (parsed_id, secret) = parse_token(&token).expect("parses");
        assert_eq!(parsed_id, id);
        assert!(token_matches(secret, &hash));
        assert!(!token_matches("other", &hash));
        assert_eq!(parse_token("reins_short_x"), None);
        assert_eq!(parse_token("Bearer"), None);
    }

    #[test]
    fn the_throttle_refuses_after_the_failures_and_forgets_on_success() {
        let throttle = LoginThrottle::new(2, Duration::from_secs(60));
        let address: IpAddr = [127, 0, 0, 1].into();
        throttle.failed(address);
        assert!(throttle.check(address).is_ok());
        throttle.failed(address);
        assert!(throttle.check(address).is_err());
        throttle.succeeded(address);
        assert!(throttle.check(address).is_ok());
    }

    #[test]
    fn emails_are_normalised_and_checked_for_shape() {
        let password = "a long enough password";
        assert_eq!(
            check_credentials("  Bob@Example.COM ", password).expect("valid"),
            "bob@example.com"
        );
        check_credentials("admin@localhost", password).expect("a domain without dots");
        check_credentials("first.last+tag@sub.example-x.io", password).expect("valid");
        for bad in [
            "<script>@x",
            "a@b@c",
            "noat",
            "@x.io",
            "a@",
            "a b@x.io",
            "a@x..io",
            "a@-x.io",
            "a\"b@x.io",
            "a'b@x.io",
            ".a@x.io",
            "a..b@x.io",
            "a@x.io/",
            "a@x\u{7}.io",
            &format!("{}@x.io", "a".repeat(65)),
            &format!("a@{}.io", "b".repeat(251)),
        ] {
            let error = check_credentials(bad, password).expect_err(bad);
            assert_eq!(error.status, hyper::StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn a_password_has_twelve_characters_and_is_not_the_email() {
        let email = "bob@example.com";
        assert!(check_credentials(email, "aaaaaaaa").is_err());
        assert!(check_credentials(email, &"a".repeat(11)).is_err());
        assert!(check_credentials(email, &"a".repeat(12)).is_ok());
        assert!(check_credentials(email, &"a".repeat(PASSWORD_CHARS_MAX + 1)).is_err());
        assert!(check_credentials(email, "BOB@example.com").is_err());
        assert!(check_credentials("bobbybobbybob@x.io", "BobbyBobbyBob").is_err());
    }

    #[tokio::test]
    async fn passwords_verify_against_their_hash_only() {
        let hash = hash_password("correct horse".into()).await.expect("hash");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(Some(hash.clone()), "correct horse".into()).await);
        assert!(!verify_password(Some(hash), "wrong horse".into()).await);
        assert!(!verify_password(None, "\0decoy\0".into()).await);
    }
}
