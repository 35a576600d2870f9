//! People and machines that use the control plane: users (argon2id password hashes computed by
//! the caller, a role, disabled or not), sessions (one row per signed-in browser, expiry on the
//! database clock) and API tokens (kept as the SHA-256 of their secret, optionally expiring). The
//! store stores and compares; it never sees a password or a token secret.
//!
//! A disabled user, an ended session and an expired token are refused by the query that reads
//! them on every request ([`crate::Store::session_user`], [`crate::Store::token_user`]), so a
//! change counts on every node at once.

use serde::Serialize;

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Their own workflows only.
    User,
    /// A user who may also see every workflow and resume, decide and answer on any of them (but
    /// not cancel, recover, reconcile or delete another's, nor manage users).
    Approver,
    /// Everything, every workflow and every user.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::User, Role::Approver, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }

    /// The role a stored or typed name means.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == name)
    }

    /// The stored name (the column's CHECK allows only these), `user` for anything else.
    pub(crate) fn stored(name: &str) -> Role {
        Role::parse(name).unwrap_or(Role::User)
    }
}

/// A user as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct UserRow {
    pub id: String,
    pub email: String,
    pub password_hash: String,
    pub role: Role,
    /// A disabled user can neither sign in nor use a session or an API token.
    pub disabled: bool,
    /// Bumped to revoke every session of the user at once.
    pub token_version: i64,
    pub created_at: f64,
    /// The last sign-in that opened a session (database clock); `None` before the first.
    pub last_login_at: Option<f64>,
}

impl UserRow {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether the user sees every workflow, not only their own.
    pub fn sees_every_workflow(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Approver)
    }
}

/// A user to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUser {
    pub id: String,
    pub email: String,
    pub password_hash: String,
    pub role: Role,
}

/// What an admin changes about a user (`None`: leave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UserChange {
    pub role: Option<Role>,
    pub disabled: Option<bool>,
}

/// What [`crate::Store::change_user`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum UserChanged {
    /// Changed (disabling also ended every session of the user); the row as it is now.
    Changed(UserRow),
    NotFound,
    /// Refused: the user is the last enabled admin, and the change would leave none.
    LastAdmin,
}

/// What [`crate::Store::delete_user`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserDeletion {
    /// The user is gone, with their sessions and API tokens.
    Deleted,
    NotFound,
    /// Refused: the user owns this many live workflows.
    OwnsLiveWorkflows(i64),
    /// Refused: the user is the last enabled admin.
    LastAdmin,
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
    /// When it stops working (database clock); `None`: never.
    pub expires_at: Option<f64>,
}

/// A token to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewToken {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub token_hash: String,
    /// It expires this long after it is recorded (database clock); `None`: never.
    pub lifetime_seconds: Option<f64>,
    /// The user's live tokens at most (`auth.tokens_per_user_max`), this one included: one more
    /// is refused (`LimitReached`). Revoked and expired tokens are deleted when one is created.
    pub live_max: u32,
}

/// The bytes one user's workflows store, as `limits.user_stored_bytes_max` counts them: their
/// artifacts (captured files and agent outputs), and the room their running workflows hold for
/// artifacts still to come.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserStorage {
    pub user_id: String,
    pub stored_bytes: i64,
}

/// Whether `change` would take away the last enabled admin: `user` is one now, is not after it,
/// and no other enabled admin exists.
pub(crate) fn leaves_no_admin(user: &UserRow, change: UserChange, other_admins: i64) -> bool {
    let admin_now = user.is_admin() && !user.disabled;
    let admin_after = change.role.unwrap_or(user.role) == Role::Admin
        && !change.disabled.unwrap_or(user.disabled);
    admin_now && !admin_after && other_admins == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(role: Role, disabled: bool) -> UserRow {
        UserRow {
            id: "u".into(),
            email: "u@x".into(),
            password_hash: String::new(),
            role,
            disabled,
            token_version: 0,
            created_at: 0.0,
            last_login_at: None,
        }
    }

    #[test]
    fn only_taking_away_the_last_enabled_admin_is_refused() {
        let disable = UserChange {
            disabled: Some(true),
            ..UserChange::default()
        };
        let demote = UserChange {
            role: Some(Role::Approver),
            ..UserChange::default()
        };
        let admin = user(Role::Admin, false);
        assert!(leaves_no_admin(&admin, disable, 0));
        assert!(leaves_no_admin(&admin, demote, 0));
        assert!(!leaves_no_admin(&admin, disable, 1));
        assert!(!leaves_no_admin(&admin, UserChange::default(), 0));
        // Not an enabled admin now: nothing to take away.
        assert!(!leaves_no_admin(&user(Role::Admin, true), demote, 0));
        assert!(!leaves_no_admin(&user(Role::User, false), disable, 0));
    }
}
