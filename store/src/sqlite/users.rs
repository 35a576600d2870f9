//! Users, sessions and API tokens on SQLite.

use rusqlite::{OptionalExtension, Row, params};

use super::SqliteStore;
use crate::Result;
use crate::users::{NewToken, NewUser, TokenRow, UserRow};

const USER_COLUMNS: &str = "u.id, u.email, u.password_hash, u.is_admin, u.token_version";
const TOKEN_COLUMNS: &str = "id, user_id, name, token_hash, created_at, revoked_at IS NOT NULL";
const JOINED_TOKEN_COLUMNS: &str =
    "t.id, t.user_id, t.name, t.token_hash, t.created_at, t.revoked_at IS NOT NULL";

fn user(row: &Row<'_>) -> rusqlite::Result<UserRow> {
    Ok(UserRow {
        id: row.get(0)?,
        email: row.get(1)?,
        password_hash: row.get(2)?,
        is_admin: row.get(3)?,
        token_version: row.get(4)?,
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
    })
}

impl SqliteStore {
    pub(crate) async fn create_user(&self, new: NewUser, only_if_first: bool) -> Result<bool> {
        self.write(move |connection| {
            let inserted = connection
                .prepare_cached(
                    "INSERT INTO users (id, email, password_hash, is_admin, created_at)
                     SELECT ?1, ?2, ?3, ?4, unixepoch('subsec')
                      WHERE NOT ?5 OR NOT EXISTS (SELECT 1 FROM users)",
                )?
                .execute(params![
                    new.id,
                    new.email,
                    new.password_hash,
                    new.is_admin,
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
                .prepare_cached(&format!(
                    "SELECT {USER_COLUMNS} FROM users u WHERE u.email = ?1"
                ))?
                .query_row([&email], user)
                .optional()?)
        })
        .await
    }

    pub(crate) async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
    ) -> Result<()> {
        let (session_id, user_id) = (session_id.to_owned(), user_id.to_owned());
        self.write(move |connection| {
            connection
                .prepare_cached(
                    "INSERT INTO user_sessions (id, user_id, expires_at)
                     VALUES (?1, ?2, unixepoch('subsec') + ?3)",
                )?
                .execute(params![session_id, user_id, session_seconds as f64])?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn session_user(&self, session_id: &str) -> Result<Option<UserRow>> {
        let session_id = session_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(&format!(
                    "SELECT {USER_COLUMNS} FROM user_sessions s JOIN users u ON u.id = s.user_id
                      WHERE s.id = ?1 AND NOT s.revoked AND s.expires_at > unixepoch('subsec')"
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
            Ok(connection
                .prepare_cached(&format!(
                    "INSERT INTO api_tokens (id, user_id, name, token_hash)
                     VALUES (?1, ?2, ?3, ?4) RETURNING {TOKEN_COLUMNS}"
                ))?
                .query_row(
                    params![new.id, new.user_id, new.name, new.token_hash],
                    |row| token(row, 0),
                )?)
        })
        .await
    }

    pub(crate) async fn token_user(&self, token_id: &str) -> Result<Option<(TokenRow, UserRow)>> {
        let token_id = token_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(&format!(
                    "SELECT {USER_COLUMNS}, {JOINED_TOKEN_COLUMNS}
                       FROM api_tokens t JOIN users u ON u.id = t.user_id
                      WHERE t.id = ?1 AND t.revoked_at IS NULL"
                ))?
                .query_row([&token_id], |row| Ok((token(row, 5)?, user(row)?)))
                .optional()?)
        })
        .await
    }

    pub(crate) async fn list_tokens(&self, user_id: &str) -> Result<Vec<TokenRow>> {
        let user_id = user_id.to_owned();
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {JOINED_TOKEN_COLUMNS} FROM api_tokens t WHERE t.user_id = ?1
                  ORDER BY t.created_at, t.id"
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
