//! Users, sessions and API tokens on PostgreSQL.

use deadpool_postgres::{GenericClient, Transaction};
use tokio_postgres::Row;

use super::{PgStore, commit_error};
use crate::LIVE_STATUSES;
use crate::users::{
    NewToken, NewUser, Role, TokenRow, UserChange, UserChanged, UserDeletion, UserRow, UserStorage,
    leaves_no_admin,
};
use crate::{Error, Result};

/// The lock that makes "create the first user" atomic across nodes, and every change that could
/// leave no enabled admin see the others ("users" in ASCII).
const USERS_LOCK: i64 = 0x0075_7365_7273;

/// The columns `user` decodes, as one literal for `concat!` (SQL is never formatted per call).
macro_rules! user_columns {
    () => {
        "u.id, u.email, u.password_hash, u.role, u.disabled, u.token_version, u.created_at,
         u.last_login_at"
    };
}
/// Where the token's columns start in a row of `user_columns!` then `token_columns!`.
const TOKEN_AFTER_USER: usize = 8;
/// The columns `token` decodes.
macro_rules! token_columns {
    () => {
        "t.id, t.user_id, t.name, t.token_hash, t.created_at, t.revoked_at IS NOT NULL,
         t.expires_at"
    };
}

/// One user by a condition on `u`.
macro_rules! select_user {
    ($clause:literal) => {
        concat!("SELECT ", user_columns!(), " FROM users u ", $clause)
    };
}

fn user(row: &Row) -> UserRow {
    UserRow {
        id: row.get(0),
        email: row.get(1),
        password_hash: row.get(2),
        role: Role::stored(row.get(3)),
        disabled: row.get(4),
        token_version: row.get(5),
        created_at: row.get(6),
        last_login_at: row.get(7),
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
        expires_at: row.get(at + 6),
    }
}

/// The user, locked, with how many *other* enabled admins there are; `None` when no such user.
async fn locked_user(
    transaction: &Transaction<'_>,
    user_id: &str,
) -> Result<Option<(UserRow, i64)>> {
    lock_users(transaction).await?;
    let statement = transaction
        .prepare_cached(concat!(
            "SELECT ",
            user_columns!(),
            ", (SELECT count(*) FROM users o
                 WHERE o.role = 'admin' AND NOT o.disabled AND o.id <> u.id)
               FROM users u WHERE u.id = $1 FOR UPDATE"
        ))
        .await?;
    let row = transaction.query_opt(&statement, &[&user_id]).await?;
    Ok(row.map(|row| (user(&row), row.get(TOKEN_AFTER_USER))))
}

/// Takes the users lock until the transaction ends.
async fn lock_users(transaction: &Transaction<'_>) -> Result<()> {
    let statement = transaction
        .prepare_cached("SELECT pg_advisory_xact_lock($1)")
        .await?;
    transaction.execute(&statement, &[&USERS_LOCK]).await?;
    Ok(())
}

/// One statement, prepared once per connection, run with `params`; the rows it changed.
async fn execute(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.execute(&statement, params).await?)
}

/// Ends the user's sessions: every one (the `token_version` bump refuses every cookie at once)
/// or every one but `keep`.
async fn end_sessions_in(
    transaction: &Transaction<'_>,
    user_id: &str,
    keep: Option<&str>,
) -> Result<bool> {
    let found = match keep {
        None => {
            execute(
                transaction,
                "UPDATE users SET token_version = token_version + 1 WHERE id = $1",
                &[&user_id],
            )
            .await?
        }
        Some(_) => {
            execute(
                transaction,
                "SELECT 1 FROM users WHERE id = $1",
                &[&user_id],
            )
            .await?
        }
    };
    execute(
        transaction,
        "UPDATE user_sessions SET revoked = TRUE
          WHERE user_id = $1 AND NOT revoked AND ($2::text IS NULL OR id <> $2)",
        &[&user_id, &keep],
    )
    .await?;
    Ok(found == 1)
}

impl PgStore {
    pub(crate) async fn create_user(&self, new: NewUser, only_if_first: bool) -> Result<bool> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        // Two nodes initialising at once: the lock makes the emptiness check and the insert one
        // step, so exactly one first user exists.
        lock_users(&transaction).await?;
        let inserted = execute(
            &transaction,
            "INSERT INTO users (id, email, password_hash, role, created_at)
             SELECT $1, $2, $3, $4, reins_now()
              WHERE NOT $5 OR NOT EXISTS (SELECT 1 FROM users)",
            &[
                &new.id,
                &new.email,
                &new.password_hash,
                &new.role.as_str(),
                &only_if_first,
            ],
        )
        .await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(inserted == 1)
    }

    pub(crate) async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(select_user!("WHERE u.email = $1"))
            .await?;
        let row = client.query_opt(&statement, &[&email]).await?;
        Ok(row.as_ref().map(user))
    }

    pub(crate) async fn user_by_id(&self, user_id: &str) -> Result<Option<UserRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(select_user!("WHERE u.id = $1"))
            .await?;
        let row = client.query_opt(&statement, &[&user_id]).await?;
        Ok(row.as_ref().map(user))
    }

    pub(crate) async fn list_users(&self) -> Result<Vec<UserRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(select_user!("ORDER BY u.created_at, u.id"))
            .await?;
        let rows = client.query(&statement, &[]).await?;
        Ok(rows.iter().map(user).collect())
    }

    pub(crate) async fn stored_bytes(&self, user_id: Option<&str>) -> Result<Vec<UserStorage>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "SELECT u.user_id, u.stored_bytes - coalesce(
                            (SELECT sum(s.returned_bytes) FROM workflow_storage s
                              WHERE s.user_id = u.user_id AND s.returned_bytes > 0), 0)::bigint
                   FROM user_storage u WHERE $1::text IS NULL OR u.user_id = $1
                  ORDER BY u.user_id",
            )
            .await?;
        let rows = client.query(&statement, &[&user_id]).await?;
        Ok(rows
            .iter()
            .map(|row| UserStorage {
                user_id: row.get(0),
                stored_bytes: row.get(1),
            })
            .collect())
    }

    pub(crate) async fn change_user(
        &self,
        user_id: &str,
        change: UserChange,
    ) -> Result<UserChanged> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let Some((current, other_admins)) = locked_user(&transaction, user_id).await? else {
            return Ok(UserChanged::NotFound);
        };
        if leaves_no_admin(&current, change, other_admins) {
            return Ok(UserChanged::LastAdmin);
        }
        execute(
            &transaction,
            "UPDATE users SET role = COALESCE($2, role), disabled = COALESCE($3, disabled)
              WHERE id = $1",
            &[&user_id, &change.role.map(Role::as_str), &change.disabled],
        )
        .await?;
        if change.disabled == Some(true) {
            end_sessions_in(&transaction, user_id, None).await?;
        }
        let statement = transaction
            .prepare_cached(select_user!("WHERE u.id = $1"))
            .await?;
        let row = transaction.query_one(&statement, &[&user_id]).await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(UserChanged::Changed(user(&row)))
    }

    pub(crate) async fn set_password(
        &self,
        user_id: &str,
        password_hash: &str,
        keep_session: Option<&str>,
    ) -> Result<bool> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let changed = execute(
            &transaction,
            "UPDATE users SET password_hash = $2 WHERE id = $1",
            &[&user_id, &password_hash],
        )
        .await?;
        if changed == 1 {
            end_sessions_in(&transaction, user_id, keep_session).await?;
        }
        transaction.commit().await.map_err(commit_error)?;
        Ok(changed == 1)
    }

    pub(crate) async fn end_sessions(
        &self,
        user_id: &str,
        keep_session: Option<&str>,
    ) -> Result<bool> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let found = end_sessions_in(&transaction, user_id, keep_session).await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(found)
    }

    pub(crate) async fn delete_user(&self, user_id: &str) -> Result<UserDeletion> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let Some((current, other_admins)) = locked_user(&transaction, user_id).await? else {
            return Ok(UserDeletion::NotFound);
        };
        let statement = transaction
            .prepare_cached(
                "SELECT count(*) FROM workflows WHERE user_id = $1 AND status = ANY($2)",
            )
            .await?;
        let live: i64 = transaction
            .query_one(&statement, &[&user_id, &LIVE_STATUSES.as_slice()])
            .await?
            .get(0);
        if live > 0 {
            return Ok(UserDeletion::OwnsLiveWorkflows(live));
        }
        let gone = UserChange {
            disabled: Some(true),
            ..UserChange::default()
        };
        if leaves_no_admin(&current, gone, other_admins) {
            return Ok(UserDeletion::LastAdmin);
        }
        // Sessions and API tokens go with the row (ON DELETE CASCADE).
        execute(&transaction, "DELETE FROM users WHERE id = $1", &[&user_id]).await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(UserDeletion::Deleted)
    }

    pub(crate) async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
        sessions_max: u32,
    ) -> Result<()> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let keep_others = i64::from(sessions_max.max(1)) - 1;
        // Locked first: two sign-ins of one user at once count each other's sessions.
        execute(
            &transaction,
            "UPDATE users SET last_login_at = reins_now() WHERE id = $1",
            &[&user_id],
        )
        .await?;
        execute(
            &transaction,
            "DELETE FROM user_sessions
              WHERE user_id = $1
                AND (revoked OR expires_at <= reins_now()
                     OR id IN (SELECT id FROM user_sessions
                                WHERE user_id = $1 AND NOT revoked AND expires_at > reins_now()
                                ORDER BY expires_at DESC, id DESC OFFSET $2))",
            &[&user_id, &keep_others],
        )
        .await?;
        execute(
            &transaction,
            "INSERT INTO user_sessions (id, user_id, expires_at)
             VALUES ($1, $2, reins_now() + $3)",
            &[&session_id, &user_id, &(session_seconds as f64)],
        )
        .await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(())
    }

    pub(crate) async fn session_user(&self, session_id: &str) -> Result<Option<UserRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(concat!(
                "SELECT ",
                user_columns!(),
                " FROM user_sessions s JOIN users u ON u.id = s.user_id
                  WHERE s.id = $1 AND NOT s.revoked AND s.expires_at > reins_now()
                    AND NOT u.disabled"
            ))
            .await?;
        let row = client.query_opt(&statement, &[&session_id]).await?;
        Ok(row.as_ref().map(user))
    }

    pub(crate) async fn revoke_session(&self, session_id: &str) -> Result<bool> {
        let client = self.connection().await?;
        let changed = execute(
            &*client,
            "UPDATE user_sessions SET revoked = TRUE WHERE id = $1",
            &[&session_id],
        )
        .await?;
        Ok(changed == 1)
    }

    pub(crate) async fn create_token(&self, new: NewToken) -> Result<TokenRow> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        // Locked first: two creations for one user at once count each other's tokens.
        let locked = execute(
            &transaction,
            "SELECT 1 FROM users WHERE id = $1 FOR UPDATE",
            &[&new.user_id],
        )
        .await?;
        if locked == 0 {
            return Err(Error::NotFound(format!("user {:?}", new.user_id)));
        }
        execute(
            &transaction,
            "DELETE FROM api_tokens
              WHERE user_id = $1 AND (revoked_at IS NOT NULL OR expires_at <= reins_now())",
            &[&new.user_id],
        )
        .await?;
        let statement = transaction
            .prepare_cached("SELECT count(*) FROM api_tokens WHERE user_id = $1")
            .await?;
        let live: i64 = transaction
            .query_one(&statement, &[&new.user_id])
            .await?
            .get(0);
        if live >= i64::from(new.live_max) {
            return Err(Error::LimitReached(crate::Limit::TokensPerUser {
                max: new.live_max,
            }));
        }
        let statement = transaction
            .prepare_cached(concat!(
                "INSERT INTO api_tokens AS t (id, user_id, name, token_hash, expires_at)
                 VALUES ($1, $2, $3, $4, reins_now() + $5) RETURNING ",
                token_columns!()
            ))
            .await?;
        let row = transaction
            .query_one(
                &statement,
                &[
                    &new.id,
                    &new.user_id,
                    &new.name,
                    &new.token_hash,
                    &new.lifetime_seconds,
                ],
            )
            .await?;
        transaction.commit().await.map_err(commit_error)?;
        Ok(token(&row, 0))
    }

    pub(crate) async fn token_user(&self, token_id: &str) -> Result<Option<(TokenRow, UserRow)>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(concat!(
                "SELECT ",
                user_columns!(),
                ", ",
                token_columns!(),
                " FROM api_tokens t JOIN users u ON u.id = t.user_id
                  WHERE t.id = $1 AND t.revoked_at IS NULL
                    AND (t.expires_at IS NULL OR t.expires_at > reins_now())
                    AND NOT u.disabled"
            ))
            .await?;
        let row = client.query_opt(&statement, &[&token_id]).await?;
        Ok(row.map(|row| (token(&row, TOKEN_AFTER_USER), user(&row))))
    }

    pub(crate) async fn expired_token(&self, token_id: &str) -> Result<Option<TokenRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(concat!(
                "SELECT ",
                token_columns!(),
                " FROM api_tokens t JOIN users u ON u.id = t.user_id
                  WHERE t.id = $1 AND t.revoked_at IS NULL
                    AND t.expires_at <= reins_now()
                    AND NOT u.disabled"
            ))
            .await?;
        let row = client.query_opt(&statement, &[&token_id]).await?;
        Ok(row.map(|row| token(&row, 0)))
    }

    pub(crate) async fn list_tokens(&self, user_id: &str) -> Result<Vec<TokenRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(concat!(
                "SELECT ",
                token_columns!(),
                " FROM api_tokens t WHERE t.user_id = $1 ORDER BY t.created_at, t.id"
            ))
            .await?;
        let rows = client.query(&statement, &[&user_id]).await?;
        Ok(rows.iter().map(|row| token(row, 0)).collect())
    }

    pub(crate) async fn revoke_token(&self, user_id: &str, token_id: &str) -> Result<bool> {
        let client = self.connection().await?;
        let changed = execute(
            &*client,
            "UPDATE api_tokens SET revoked_at = reins_now()
              WHERE id = $1 AND user_id = $2 AND revoked_at IS NULL",
            &[&token_id, &user_id],
        )
        .await?;
        Ok(changed == 1)
    }
}
