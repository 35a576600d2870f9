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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use store::UserRow;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

    /// The cluster this node belongs to, as clients may learn it (`GET /health`): the same on
    /// every node that shares the secret, and nothing of the secret (a keyed hash of a fixed
    /// label), so a client signed in through one node recognises the others.
    pub fn cluster_id(&self) -> String {
        let mac = self.mac("cluster", "").finalize().into_bytes();
        URL_SAFE_NO_PAD.encode(&mac[..12])
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

/// Checks a new user's email and password before anything is hashed or stored; answers the
/// email in its normalised form.
pub fn check_credentials(email: &str, password: &str) -> Result<String, ApiError> {
    if !super::rules::email_shaped(email) {
        return Err(ApiError::bad_request(format!(
            "email {email:?} is not an address like name@example.com (ASCII, at most {} \
             characters; an internationalised domain in its xn-- form)",
            super::rules::EMAIL_CHARS_MAX
        )));
    }
    let normalized = normalize_email(email);
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

/// The sign-in budgets, each counted within one window.
#[derive(Debug, Clone, Copy)]
pub struct LoginBudgets {
    /// Failed sign-ins of one client address on one account.
    pub pair_failures_max: u32,
    /// Failed sign-ins of one client address on any account.
    pub address_failures_max: u32,
    /// Failed sign-ins on one account from any address.
    pub account_failures_max: u32,
    pub window: Duration,
}

/// Failed sign-ins within a window, in this node's memory (a cluster behind a balancer
/// multiplies the budgets by its nodes, which still bounds guessing).
///
/// Three budgets, so that guessing is bounded without letting one noisy client lock others
/// out for long: per (address, account) the small one, which is all a mistyped password ever
/// touches, so a neighbour behind the same address locks out only the pair they failed on; per
/// address a larger one across accounts (spraying one password over many accounts); per account
/// one across addresses (guessing one account from many). The last two can be spent by a
/// stranger to refuse a user for one window, never longer.
///
/// An attempt is counted as failed *before* its password is checked ([`LoginThrottle::reserve`],
/// under one lock): many concurrent guesses cannot all pass the check before the first is
/// counted. A success gives its reservation back and clears its pair.
pub struct LoginThrottle {
    budgets: LoginBudgets,
    counts: Mutex<LoginCounts>,
}

#[derive(Default)]
struct LoginCounts {
    pairs: HashMap<(IpAddr, String), Window>,
    addresses: HashMap<IpAddr, Window>,
    accounts: HashMap<String, Window>,
}

/// Failures counted since `since`.
#[derive(Clone, Copy)]
struct Window {
    failures: u32,
    since: Instant,
}

/// Entries per map at most; past it, expired entries are dropped first.
const THROTTLE_ENTRIES_MAX: usize = 100_000;

/// One attempt, counted in all three budgets until it is given back.
#[derive(Debug)]
pub struct Reservation {
    address: IpAddr,
    account: String,
}

/// Which budget refused an attempt, and for how long.
#[derive(Debug, PartialEq, Eq)]
pub struct Throttled {
    pub retry_after_seconds: u64,
    pub budget: &'static str,
}

impl LoginThrottle {
    pub fn new(budgets: LoginBudgets) -> Self {
        LoginThrottle {
            budgets,
            counts: Mutex::new(LoginCounts::default()),
        }
    }

    /// Counts one attempt of `address` on `account` (a normalised email) as failed, or refuses
    /// it while a budget it would spend is used up.
    pub fn reserve(&self, address: IpAddr, account: &str) -> Result<Reservation, Throttled> {
        let window = self.budgets.window;
        let now = Instant::now();
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let counts = &mut *counts;
        let pair_key = (address, account.to_owned());
        let checks = [
            (
                current(&counts.pairs, &pair_key, window, now),
                self.budgets.pair_failures_max,
                "from this address on this account",
            ),
            (
                current(&counts.addresses, &address, window, now),
                self.budgets.address_failures_max,
                "from this address",
            ),
            (
                current(&counts.accounts, account, window, now),
                self.budgets.account_failures_max,
                "on this account",
            ),
        ];
        let refused = checks
            .iter()
            .filter(|(counted, max, _)| counted.failures >= *max)
            .map(|(counted, _, budget)| Throttled {
                retry_after_seconds: window
                    .saturating_sub(now.duration_since(counted.since))
                    .as_secs()
                    .max(1),
                budget,
            })
            .max_by_key(|throttled| throttled.retry_after_seconds);
        if let Some(refused) = refused {
            return Err(refused);
        }
        count(&mut counts.pairs, pair_key, window, now);
        count(&mut counts.addresses, address, window, now);
        count(&mut counts.accounts, account.to_owned(), window, now);
        Ok(Reservation {
            address,
            account: account.to_owned(),
        })
    }

    /// The password was right: the pair starts over, and the attempt no longer counts against
    /// the address or the account.
    pub fn succeeded(&self, reservation: Reservation) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts
            .pairs
            .remove(&(reservation.address, reservation.account.clone()));
        give_back(&mut counts.addresses, &reservation.address);
        give_back(&mut counts.accounts, &reservation.account);
    }

    /// The password was never checked (the node was busy): the attempt counts nowhere.
    pub fn refund(&self, reservation: Reservation) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        give_back(
            &mut counts.pairs,
            &(reservation.address, reservation.account.clone()),
        );
        give_back(&mut counts.addresses, &reservation.address);
        give_back(&mut counts.accounts, &reservation.account);
    }
}

/// The window of `key` as it stands at `now` (an expired one counts nothing).
fn current<K, Q>(map: &HashMap<K, Window>, key: &Q, window: Duration, now: Instant) -> Window
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    map.get(key)
        .copied()
        .filter(|counted| now.duration_since(counted.since) < window)
        .unwrap_or(Window {
            failures: 0,
            since: now,
        })
}

fn count<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Window>,
    key: K,
    window: Duration,
    now: Instant,
) {
    if map.len() >= THROTTLE_ENTRIES_MAX {
        map.retain(|_, counted| now.duration_since(counted.since) < window);
    }
    let counted = map.entry(key).or_insert(Window {
        failures: 0,
        since: now,
    });
    if now.duration_since(counted.since) >= window {
        *counted = Window {
            failures: 0,
            since: now,
        };
    }
    counted.failures = counted.failures.saturating_add(1);
}

fn give_back<K, Q>(map: &mut HashMap<K, Window>, key: &Q)
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: std::hash::Hash + Eq + ?Sized,
{
    if let Some(counted) = map.get_mut(key) {
        counted.failures = counted.failures.saturating_sub(1);
    }
}

/// The node-wide bound on password hashing: each argon2id hash holds its memory cost (19 MiB
/// with the default parameters) on a blocking thread, so `password_hashes_max` of them at once
/// bound what sign-ins can make the node allocate. A request that finds every permit taken is
/// refused at once (429), never queued: a queue would hold its request and connection instead.
pub struct PasswordHashing {
    permits: Arc<Semaphore>,
    max: usize,
}

impl PasswordHashing {
    pub fn new(max: usize) -> Self {
        PasswordHashing {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A permit, held by the blocking task itself so that a request dropped mid-hash does not
    /// free it early.
    fn permit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            ApiError::too_many_attempts(
                1,
                "password_checks_busy",
                format!(
                    "the node is checking {} passwords already (`auth.password_hashes_max`); \
                     try again in 1 s",
                    self.max
                ),
            )
        })
    }

    /// An argon2id hash of `password` (off the async threads: it is slow on purpose).
    pub async fn hash(&self, password: String) -> Result<String, ApiError> {
        let salt = random_bytes::<16>()?;
        let permit = self.permit()?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
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

    /// Whether `password` matches `stored` (an argon2 hash). With no stored hash (unknown user)
    /// it still does the work of one check, so that timing does not tell which emails exist.
    pub async fn verify(&self, stored: Option<String>, password: String) -> Result<bool, ApiError> {
        let permit = self.permit()?;
        Ok(tokio::task::spawn_blocking(move || {
            let _permit = permit;
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
        .unwrap_or(false))
    }
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
            role: store::Role::User,
            disabled: false,
            token_version,
            created_at: 0.0,
            last_login_at: None,
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

    fn throttle(pair: u32, address: u32, account: u32) -> LoginThrottle {
        LoginThrottle::new(LoginBudgets {
            pair_failures_max: pair,
            address_failures_max: address,
            account_failures_max: account,
            window: Duration::from_secs(60),
        })
    }

    #[test]
    fn an_attempt_counts_before_its_check_and_a_success_gives_it_back() {
        let throttle = throttle(2, 100, 100);
        let address: IpAddr = [127, 0, 0, 1].into();
        let first = throttle.reserve(address, "a@x").expect("first");
        let _second = throttle.reserve(address, "a@x").expect("second");
        // Two checks in flight: a third is refused before either has an answer.
        let refused = throttle.reserve(address, "a@x").expect_err("third");
        assert_eq!(refused.budget, "from this address on this account");
        assert!(refused.retry_after_seconds >= 1);
        throttle.succeeded(first);
        throttle
            .reserve(address, "a@x")
            .expect("the pair starts over");
    }

    #[test]
    fn a_neighbour_failing_on_their_account_leaves_another_account_alone() {
        let throttle = throttle(3, 100, 100);
        let shared: IpAddr = [10, 0, 0, 1].into();
        for _ in 0..3 {
            throttle.reserve(shared, "noisy@x").expect("counted");
        }
        assert!(throttle.reserve(shared, "noisy@x").is_err());
        throttle
            .reserve(shared, "bob@x")
            .expect("bob behind the same address");
    }

    #[test]
    fn the_address_and_account_budgets_bound_spraying_and_distributed_guessing() {
        let spray = throttle(3, 4, 100);
        let address: IpAddr = [10, 0, 0, 2].into();
        for n in 0..4 {
            spray.reserve(address, &format!("u{n}@x")).expect("counted");
        }
        let refused = spray.reserve(address, "u9@x").expect_err("address spent");
        assert_eq!(refused.budget, "from this address");

        let guess = throttle(3, 100, 4);
        for n in 0..4u8 {
            guess
                .reserve([10, 0, 1, n].into(), "victim@x")
                .expect("counted");
        }
        let refused = guess
            .reserve([10, 0, 2, 1].into(), "victim@x")
            .expect_err("account spent");
        assert_eq!(refused.budget, "on this account");
    }

    #[test]
    fn a_refunded_attempt_counts_nowhere() {
        let throttle = throttle(1, 1, 1);
        let address: IpAddr = [127, 0, 0, 1].into();
        let reservation = throttle.reserve(address, "a@x").expect("first");
        throttle.refund(reservation);
        throttle.reserve(address, "a@x").expect("as if never tried");
    }

    #[test]
    fn emails_are_normalised_and_checked_for_shape() {
        let password = "a long enough password";
        assert_eq!(
            check_credentials("Bob@Example.COM", password).expect("valid"),
            "bob@example.com"
        );
        // What a new user's email must be is what the description's pattern says: nothing
        // around it is trimmed away (sign-in does trim what is typed).
        check_credentials(" bob@example.com", password).expect_err("padded");
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
        let hashing = PasswordHashing::new(1);
        let hash = hashing.hash("correct horse".into()).await.expect("hash");
        assert!(hash.starts_with("$argon2id$"));
        let verify =
            |stored: Option<String>, password: &str| hashing.verify(stored, password.to_owned());
        assert!(
            verify(Some(hash.clone()), "correct horse")
                .await
                .expect("permit")
        );
        assert!(!verify(Some(hash), "wrong horse").await.expect("permit"));
        assert!(!verify(None, "\0decoy\0").await.expect("permit"));
    }

    #[tokio::test]
    async fn hashing_past_the_permits_is_refused_at_once() {
        let hashing = PasswordHashing::new(1);
        let held = hashing.permit().expect("the only permit");
        let busy = hashing.hash("x".into()).await.expect_err("no permit left");
        assert_eq!(busy.status, hyper::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(busy.retry_after_seconds, Some(1));
        drop(held);
        hashing.hash("x".into()).await.expect("the permit is back");
    }
}
