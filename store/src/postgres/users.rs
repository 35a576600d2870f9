//! Users, sessions and API tokens on PostgreSQL.

use tokio_postgres::Row;

use super::{PgStore, commit_error};
use crate::Result;
use crate::users::{NewToken, NewUser, TokenRow, UserRow};

/// The lock that makes "create the first user" atomic across nodes ("users" in ASCII).
const FIRST_USER_LOCK: i64 = 0x0075_7365_7273;

const USER_COLUMNS: &str = "u.id, u.email, u.password_hash, u.is_admin, u.token_version";
const TOKEN_COLUMNS: &str = "id, user_id, name, token_hash, created_at, revoked_at IS NOT NULL";
const JOINED_TOKEN_COLUMNS: &str =
    "t.id, t.user_id, t.name, t.token_hash, t.created_at, t.revoked_at IS NOT NULL";

fn user(row: &Row) -> UserRow {
    UserRow {
        id: row.get(0),
        email: row.get(1),
        password_hash: row.get(2),
        is_admin: row.get(3),
        token_version: row.get(4),
    }
}

fn token(row: &Row, at: usize) -> TokenRow {
    TokenRow {
        id: row.get(at),
        user_id: row.get(at + 1),
        name: row.get(at + 2),
        token_hash: row.get(at + 3),
        created_at: row.get(at + 4),
        revoked: row.get(at + 5),
    }
}

impl PgStore {
    pub(crate) async fn create_user(&self, new: NewUser, only_if_first: bool) -> Result<bool> {
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        // Two nodes initialising at once: the lock makes the emptiness check and the insert one
        // step, so exactly one first user exists.
        transaction
            .execute("SELECT pg_advisory_xact_lock($1)", &[&FIRST_USER_LOCK])
            .await?;
        let inserted = transaction
            .execute(
                "INSERT INTO users (id, email, password_hash, is_admin, created_at)
                 SELECT $1, $2, $3, $4, reins_now()
                  WHERE NOT $5 OR NOT EXISTS (SELECT 1 FROM users)",
                &[
                    &new.id,
                    &new.email,
                    &new.password_hash,
                    &new.is_admin,
                    &only_if_first,
                ],
            )
            .await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(inserted == 1)
    }

    pub(crate) async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                &format!("SELECT {USER_COLUMNS} FROM users u WHERE u.email = $1"),
                &[&email],
            )
            .await?;
        Ok(row.as_ref().map(user))
    }

    pub(crate) async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
    ) -> Result<()> {
        let client = self.pool.get().await?;
        client
            .execute(
                "INSERT INTO user_sessions (id, user_id, expires_at)
                 VALUES ($1, $2, reins_now() + $3)",
                &[&session_id, &user_id, &(session_seconds as f64)],
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn session_user(&self, session_id: &str) -> Result<Option<UserRow>> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {USER_COLUMNS} FROM user_sessions s JOIN users u ON u.id = s.user_id
                  WHERE s.id = $1 AND NOT s.revoked AND s.expires_at > reins_now()"
            ))
            .await?;
        let row = client.query_opt(&statement, &[&session_id]).await?;
        Ok(row.as_ref().map(user))
    }

    pub(crate) async fn revoke_session(&self, session_id: &str) -> Result<bool> {
        let client = self.pool.get().await?;
        let changed = client
            .execute(
                "UPDATE user_sessions SET revoked = TRUE WHERE id = $1",
                &[&session_id],
            )
            .await?;
        Ok(changed == 1)
    }

    pub(crate) async fn create_token(&self, new: NewToken) -> Result<TokenRow> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                &format!(
                    "INSERT INTO api_tokens (id, user_id, name, token_hash)
                     VALUES ($1, $2, $3, $4) RETURNING {TOKEN_COLUMNS}"
                ),
                &[&new.id, &new.user_id, &new.name, &new.token_hash],
            )
            .await?;
        Ok(token(&row, 0))
    }

    pub(crate) async fn token_user(&self, token_id: &str) -> Result<Option<(TokenRow, UserRow)>> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {USER_COLUMNS}, {JOINED_TOKEN_COLUMNS}
                   FROM api_tokens t JOIN users u ON u.id = t.user_id
                  WHERE t.id = $1 AND t.revoked_at IS NULL"
            ))
            .await?;
        let row = client.query_opt(&statement, &[&token_id]).await?;
        Ok(row.map(|row| (token(&row, 5), user(&row))))
    }

    pub(crate) async fn list_tokens(&self, user_id: &str) -> Result<Vec<TokenRow>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {JOINED_TOKEN_COLUMNS} FROM api_tokens t WHERE t.user_id = $1
                      ORDER BY t.created_at, t.id"
                ),
                &[&user_id],
            )
            .await?;
        Ok(rows.iter().map(|row| token(row, 0)).collect())
    }

    pub(crate) async fn revoke_token(&self, user_id: &str, token_id: &str) -> Result<bool> {
        let client = self.pool.get().await?;
        let changed = client
            .execute(
                "UPDATE api_tokens SET revoked_at = reins_now()
                  WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL",
                &[&token_id, &user_id],
            )
            .await?;
        Ok(changed == 1)
    }
}
