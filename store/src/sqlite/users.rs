//! Users, sessions and API tokens on SQLite. Every write runs on the one writer thread, inside
//! its transaction, so the last-admin check and the change it guards cannot interleave with
//! another.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteStore;
use crate::LIVE_STATUSES;
use crate::users::{
    NewToken, NewUser, Role, TokenRow, UserChange, UserChanged, UserDeletion, UserRow, UserStorage,
    leaves_no_admin,
};
use crate::{Error, Result};

/// The columns `user` decodes, as one literal for `concat!` (SQL is never formatted per call).
macro_rules! user_columns {
    () => {
        "u.id, u.email, u.password_hash, u.role, u.disabled, u.token_version, u.created_at,
         u.last_login_at"
    };
}
/// Where the token's columns start in a row of `user_columns!` then `token_columns!`.
const TOKEN_AFTER_USER: usize = 8;
/// The columns `token` decodes (of `api_tokens t`).
macro_rules! token_columns {
    () => {
        "t.id, t.user_id, t.name, t.token_hash, t.created_at, t.revoked_at IS NOT NULL,
         t.expires_at"
    };
}
/// The same columns of a row `RETURNING` gives, which SQLite does not let an alias name.
macro_rules! returned_token_columns {
    () => {
        "id, user_id, name, token_hash, created_at, revoked_at IS NOT NULL, expires_at"
    };
}

fn user(row: &Row<'_>) -> rusqlite::Result<UserRow> {
    Ok(UserRow {
        id: row.get(0)?,
        email: row.get(1)?,
        password_hash: row.get(2)?,
        role: Role::stored(&row.get::<_, String>(3)?),
        disabled: row.get(4)?,
        token_version: row.get(5)?,
        created_at: row.get(6)?,
        last_login_at: row.get(7)?,
    })
}

fn token(row: &Row<'_>, at: usize) -> rusqlite::Result<TokenRow> {
    Ok(TokenRow {
        id: row.get(at)?,
        user_id: row.get(at + 1)?,
        name: row.get(at + 2)?,
        token_hash: row.get(at + 3)?,
        created_at: row.get(at + 4)?,
        revoked: row.get(at + 5)?,
        expires_at: row.get(at + 6)?,
    })
}

fn user_on(connection: &Connection, user_id: &str) -> Result<Option<UserRow>> {
    Ok(connection
        .prepare_cached(concat!(
            "SELECT ",
            user_columns!(),
            " FROM users u WHERE u.id = ?1"
        ))?
        .query_row([user_id], user)
        .optional()?)
}

/// Enabled admins other than `user_id`.
fn other_admins(connection: &Connection, user_id: &str) -> Result<i64> {
    Ok(connection
        .prepare_cached(
            "SELECT count(*) FROM users WHERE role = 'admin' AND NOT disabled AND id <> ?1",
        )?
        .query_row([user_id], |row| row.get(0))?)
}

/// Ends the user's sessions: every one (the `token_version` bump refuses every cookie at once)
/// or every one but `keep`.
fn end_sessions_on(connection: &Connection, user_id: &str, keep: Option<&str>) -> Result<bool> {
    let found = match keep {
        None => connection
            .prepare_cached("UPDATE users SET token_version = token_version + 1 WHERE id = ?1")?
            .execute([user_id])?,
        Some(_) => usize::from(user_on(connection, user_id)?.is_some()),
    };
    connection
        .prepare_cached(
            "UPDATE user_sessions SET revoked = 1
              WHERE user_id = ?1 AND NOT revoked AND (?2 IS NULL OR id <> ?2)",
        )?
        .execute(params![user_id, keep])?;
    Ok(found == 1)
}

impl SqliteStore {
    pub(crate) async fn create_user(&self, new: NewUser, only_if_first: bool) -> Result<bool> {
        self.write(move |connection| {
            let inserted = connection
                .prepare_cached(
                    "INSERT INTO users (id, email, password_hash, role, created_at)
                     SELECT ?1, ?2, ?3, ?4, unixepoch('subsec')
                      WHERE NOT ?5 OR NOT EXISTS (SELECT 1 FROM users)",
                )?
                .execute(params![
                    new.id,
                    new.email,
                    new.password_hash,
                    new.role.as_str(),
                    only_if_first
                ])?;
            Ok(inserted == 1)
        })
        .await
    }

    pub(crate) async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        let email = email.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(concat!(
                    "SELECT ",
                    user_columns!(),
                    " FROM users u WHERE u.email = ?1"
                ))?
                .query_row([&email], user)
                .optional()?)
        })
        .await
    }

    pub(crate) async fn user_by_id(&self, user_id: &str) -> Result<Option<UserRow>> {
        let user_id = user_id.to_owned();
        self.read(move |connection| user_on(connection, &user_id))
            .await
    }

    pub(crate) async fn list_users(&self) -> Result<Vec<UserRow>> {
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(concat!(
                "SELECT ",
                user_columns!(),
                " FROM users u ORDER BY u.created_at, u.id"
            ))?;
            let rows = statement.query_map([], user)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn stored_bytes(&self, user_id: Option<&str>) -> Result<Vec<UserStorage>> {
        let user_id = user_id.map(str::to_owned);
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT u.user_id, u.stored_bytes - coalesce(
                            (SELECT sum(s.returned_bytes) FROM workflow_storage s
                              WHERE s.user_id = u.user_id AND s.returned_bytes > 0), 0)
                   FROM user_storage u WHERE ?1 IS NULL OR u.user_id = ?1 ORDER BY u.user_id",
            )?;
            let rows = statement.query_map([&user_id], |row| {
                Ok(UserStorage {
                    user_id: row.get(0)?,
                    stored_bytes: row.get(1)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn change_user(
        &self,
        user_id: &str,
        change: UserChange,
    ) -> Result<UserChanged> {
        let user_id = user_id.to_owned();
        self.write(move |connection| {
            let Some(current) = user_on(connection, &user_id)? else {
                return Ok(UserChanged::NotFound);
            };
            if leaves_no_admin(&current, change, other_admins(connection, &user_id)?) {
                return Ok(UserChanged::LastAdmin);
            }
            connection
                .prepare_cached(
                    "UPDATE users SET role = coalesce(?2, role), disabled = coalesce(?3, disabled)
                      WHERE id = ?1",
                )?
                .execute(params![
                    user_id,
                    change.role.map(Role::as_str),
                    change.disabled
                ])?;
            if change.disabled == Some(true) {
                end_sessions_on(connection, &user_id, None)?;
            }
            let changed = user_on(connection, &user_id)?;
            Ok(changed.map_or(UserChanged::NotFound, UserChanged::Changed))
        })
        .await
    }

    pub(crate) async fn set_password(
        &self,
        user_id: &str,
        password_hash: &str,
        keep_session: Option<&str>,
    ) -> Result<bool> {
        let (user_id, password_hash) = (user_id.to_owned(), password_hash.to_owned());
        let keep_session = keep_session.map(str::to_owned);
        self.write(move |connection| {
            let changed = connection
                .prepare_cached("UPDATE users SET password_hash = ?2 WHERE id = ?1")?
                .execute([&user_id, &password_hash])?;
            if changed == 1 {
                end_sessions_on(connection, &user_id, keep_session.as_deref())?;
            }
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn end_sessions(
        &self,
        user_id: &str,
        keep_session: Option<&str>,
    ) -> Result<bool> {
        let user_id = user_id.to_owned();
        let keep_session = keep_session.map(str::to_owned);
        self.write(move |connection| end_sessions_on(connection, &user_id, keep_session.as_deref()))
            .await
    }

    pub(crate) async fn delete_user(&self, user_id: &str) -> Result<UserDeletion> {
        let user_id = user_id.to_owned();
        self.write(move |connection| {
            let Some(current) = user_on(connection, &user_id)? else {
                return Ok(UserDeletion::NotFound);
            };
            let live: i64 = connection
                .prepare_cached(
                    "SELECT count(*) FROM workflows
                      WHERE user_id = ?1 AND status IN (?2, ?3, ?4, ?5, ?6)",
                )?
                .query_row(
                    params![
                        user_id,
                        LIVE_STATUSES[0],
                        LIVE_STATUSES[1],
                        LIVE_STATUSES[2],
                        LIVE_STATUSES[3],
                        LIVE_STATUSES[4]
                    ],
                    |row| row.get(0),
                )?;
            if live > 0 {
                return Ok(UserDeletion::OwnsLiveWorkflows(live));
            }
            let gone = UserChange {
                disabled: Some(true),
                ..UserChange::default()
            };
            if leaves_no_admin(&current, gone, other_admins(connection, &user_id)?) {
                return Ok(UserDeletion::LastAdmin);
            }
            // Sessions and API tokens go with the row (ON DELETE CASCADE).
            connection
                .prepare_cached("DELETE FROM users WHERE id = ?1")?
                .execute([&user_id])?;
            Ok(UserDeletion::Deleted)
        })
        .await
    }

    pub(crate) async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
        sessions_max: u32,
    ) -> Result<()> {
        let (session_id, user_id) = (session_id.to_owned(), user_id.to_owned());
        let keep_others = i64::from(sessions_max.max(1)) - 1;
        self.write(move |connection| {
            connection
                .prepare_cached(
                    "DELETE FROM user_sessions
                      WHERE user_id = ?1
                        AND (revoked OR expires_at <= unixepoch('subsec')
                             OR id IN (SELECT id FROM user_sessions
                                        WHERE user_id = ?1 AND NOT revoked
                                          AND expires_at > unixepoch('subsec')
                                        ORDER BY expires_at DESC, id DESC
                                        LIMIT -1 OFFSET ?2))",
                )?
                .execute(params![user_id, keep_others])?;
            connection
                .prepare_cached(
                    "INSERT INTO user_sessions (id, user_id, expires_at)
                     VALUES (?1, ?2, unixepoch('subsec') + ?3)",
                )?
                .execute(params![session_id, user_id, session_seconds as f64])?;
            connection
                .prepare_cached(
                    "UPDATE users SET last_login_at = unixepoch('subsec') WHERE id = ?1",
                )?
                .execute([&user_id])?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn session_user(&self, session_id: &str) -> Result<Option<UserRow>> {
        let session_id = session_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(concat!(
                    "SELECT ",
                    user_columns!(),
                    " FROM user_sessions s JOIN users u ON u.id = s.user_id
                      WHERE s.id = ?1 AND NOT s.revoked AND s.expires_at > unixepoch('subsec')
                        AND NOT u.disabled"
                ))?
                .query_row([&session_id], user)
                .optional()?)
        })
        .await
    }

    pub(crate) async fn revoke_session(&self, session_id: &str) -> Result<bool> {
        let session_id = session_id.to_owned();
        self.write(move |connection| {
            let changed = connection
                .prepare_cached("UPDATE user_sessions SET revoked = 1 WHERE id = ?1")?
                .execute([&session_id])?;
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn create_token(&self, new: NewToken) -> Result<TokenRow> {
        self.write(move |connection| {
            connection
                .prepare_cached(
                    "DELETE FROM api_tokens
                      WHERE user_id = ?1
                        AND (revoked_at IS NOT NULL OR expires_at <= unixepoch('subsec'))",
                )?
                .execute([&new.user_id])?;
            let live: i64 = connection
                .prepare_cached("SELECT count(*) FROM api_tokens WHERE user_id = ?1")?
                .query_row([&new.user_id], |row| row.get(0))?;
            if live >= i64::from(new.live_max) {
                return Err(Error::LimitReached(crate::Limit::TokensPerUser {
                    max: new.live_max,
                }));
            }
            Ok(connection
                .prepare_cached(concat!(
                    "INSERT INTO api_tokens (id, user_id, name, token_hash, expires_at)
                     VALUES (?1, ?2, ?3, ?4, unixepoch('subsec') + ?5) RETURNING ",
                    returned_token_columns!()
                ))?
                .query_row(
                    params![
                        new.id,
                        new.user_id,
                        new.name,
                        new.token_hash,
                        new.lifetime_seconds
                    ],
                    |row| token(row, 0),
                )?)
        })
        .await
    }

    pub(crate) async fn token_user(&self, token_id: &str) -> Result<Option<(TokenRow, UserRow)>> {
        let token_id = token_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(concat!(
                    "SELECT ",
                    user_columns!(),
                    ", ",
                    token_columns!(),
                    " FROM api_tokens t JOIN users u ON u.id = t.user_id
                      WHERE t.id = ?1 AND t.revoked_at IS NULL
                        AND (t.expires_at IS NULL OR t.expires_at > unixepoch('subsec'))
                        AND NOT u.disabled"
                ))?
                .query_row([&token_id], |row| {
                    Ok((token(row, TOKEN_AFTER_USER)?, user(row)?))
                })
                .optional()?)
        })
        .await
    }

    pub(crate) async fn expired_token(&self, token_id: &str) -> Result<Option<TokenRow>> {
        let token_id = token_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(concat!(
                    "SELECT ",
                    token_columns!(),
                    " FROM api_tokens t JOIN users u ON u.id = t.user_id
                      WHERE t.id = ?1 AND t.revoked_at IS NULL
                        AND t.expires_at <= unixepoch('subsec')
                        AND NOT u.disabled"
                ))?
                .query_row([&token_id], |row| token(row, 0))
                .optional()?)
        })
        .await
    }

    pub(crate) async fn list_tokens(&self, user_id: &str) -> Result<Vec<TokenRow>> {
        let user_id = user_id.to_owned();
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(concat!(
                "SELECT ",
                token_columns!(),
                " FROM api_tokens t WHERE t.user_id = ?1 ORDER BY t.created_at, t.id"
            ))?;
            let rows = statement.query_map([&user_id], |row| token(row, 0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn revoke_token(&self, user_id: &str, token_id: &str) -> Result<bool> {
        let (user_id, token_id) = (user_id.to_owned(), token_id.to_owned());
        self.write(move |connection| {
            let changed = connection
                .prepare_cached(
                    "UPDATE api_tokens SET revoked_at = unixepoch('subsec')
                      WHERE id = ?1 AND user_id = ?2 AND revoked_at IS NULL",
                )?
                .execute([&token_id, &user_id])?;
            Ok(changed == 1)
        })
        .await
    }
}
