//! People and machines that use the control plane: users (argon2id password hashes computed by
//! the caller), sessions (one row per signed-in browser, expiry on the database clock) and API
//! tokens (kept as the SHA-256 of their secret). The store stores and compares; it never sees a
//! password or a token secret.

use serde::Serialize;

/// A user as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRow {
    pub id: String,
    pub email: String,
    pub password_hash: String,
    pub is_admin: bool,
    /// Bumped to revoke every session of the user at once.
    pub token_version: i64,
}

/// A user to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUser {
    pub id: String,
    pub email: String,
    pub password_hash: String,
    pub is_admin: bool,
}

/// An API token as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenRow {
    pub id: String,
    pub user_id: String,
    pub name: String,
    /// Hex SHA-256 of the token's secret.
    #[serde(skip)]
    pub token_hash: String,
    pub created_at: f64,
    pub revoked: bool,
}

/// A token to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub token_hash: String,
}
