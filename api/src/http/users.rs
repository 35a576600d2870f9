//! Sign-in and identities: the first admin, local sign-in with a form, sign-out, `me`, API
//! tokens, and user management (admins list, create, change the role of, disable, reset the
//! password of, sign out and delete users; everyone changes their own password and may sign out
//! everywhere).
//!
//! Every change to a user is read by the very next request on every node: sessions and tokens
//! are checked against the `users` row on each request (no cache).

use hyper::StatusCode;
use hyper::header::{CONTENT_TYPE, HeaderValue, SET_COOKIE};
use store::{NewToken, NewUser, Role, UserChange, UserChanged, UserDeletion, UserRow};

use super::auth::{self, CSRF_COOKIE, SESSION_COOKIE};
use super::error::ApiError;
use super::wire::{
    DeletedUserReply, InitializeBody, LoginForm, NewTokenBody, NewTokenReply, NewUserBody,
    PasswordChangeBody, PasswordResetBody, RoleName, StorageReply, TokenReply, TokensReply,
    UserChangeBody, UserReply, UsersReply,
};
use super::{Ctx, Reply, json_reply};

/// The only body sign-in accepts.
const FORM_CONTENT_TYPE: &str = "application/x-www-form-urlencoded";
const SECONDS_PER_DAY: f64 = 86_400.0;

fn user_reply(user: &UserRow) -> UserReply {
    UserReply {
        id: user.id.clone(),
        email: user.email.clone(),
        role: user.role.into(),
        is_admin: user.is_admin(),
        disabled: user.disabled,
        created_at: user.created_at,
        last_login_at: user.last_login_at,
        storage: None,
    }
}

/// `user` as `me` and the admins' listing show them: with what they store, `stored_bytes` (0
/// when they never stored anything).
fn user_with_storage(ctx: &Ctx<'_>, user: &UserRow, stored_bytes: i64) -> UserReply {
    let max = ctx.state.stored_bytes_max;
    UserReply {
        storage: Some(StorageReply {
            stored_bytes,
            stored_bytes_max: (max > 0).then_some(max),
        }),
        ..user_reply(user)
    }
}

/// Creates the first admin (201), or 409 once any user exists; signs them in.
pub async fn initialize(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    super::same_origin(&ctx.headers)?;
    let body: InitializeBody = ctx.json()?;
    let user = create(ctx, body.email, body.password, Role::Admin, true).await?;
    let Some(user) = user else {
        return Err(ApiError::conflict(
            "already initialized: the first admin exists; sign in instead",
        ));
    };
    signed_in(ctx, &user, StatusCode::CREATED).await
}

/// Creates a user (admins); a taken email is 409.
pub async fn create_user(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: NewUserBody = ctx.json()?;
    let role = match (body.role, body.is_admin) {
        (Some(role), Some(is_admin)) if (role == RoleName::Admin) != is_admin => {
            return Err(ApiError::bad_request(format!(
                "body fields `role` ({}) and `is_admin` ({is_admin}) disagree; give `role` only",
                Role::from(role).as_str()
            )));
        }
        (Some(role), _) => role.into(),
        (None, Some(true)) => Role::Admin,
        (None, _) => Role::User,
    };
    let user = create(ctx, body.email, body.password, role, false)
        .await?
        .ok_or_else(|| ApiError::conflict("the user was not created"))?;
    Ok(json_reply(StatusCode::CREATED, user_reply(&user)))
}

async fn create(
    ctx: &Ctx<'_>,
    email: String,
    password: String,
    role: Role,
    only_if_first: bool,
) -> Result<Option<UserRow>, ApiError> {
    let email = auth::check_credentials(&email, &password)?;
    let password_hash = ctx.state.hashing.hash(password).await?;
    let user = NewUser {
        id: auth::new_id()?,
        email: email.clone(),
        password_hash,
        role,
    };
    let store = ctx.state.node.store();
    let created = match store.create_user(user, only_if_first).await {
        Err(store::Error::Conflict(_)) => {
            return Err(ApiError::conflict(format!(
                "a user with email {email:?} exists"
            )));
        }
        other => other?,
    };
    if !created {
        return Ok(None);
    }
    Ok(store.user_by_email(&email).await?)
}

/// Local sign-in with the form fields `username` (the email) and `password`, from this site
/// only (a cross-site `Origin` is 403; any body but a form is 415, so that no cross-site
/// `text/plain` post can sign a browser in). The attempt is counted as failed before the
/// password is checked, and a success gives it back ([`auth::LoginThrottle`]).
pub async fn login(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    super::same_origin(&ctx.headers)?;
    let content_type = ctx
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media_type = content_type.split(';').next().unwrap_or_default().trim();
    if !media_type.eq_ignore_ascii_case(FORM_CONTENT_TYPE) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("sign-in takes a {FORM_CONTENT_TYPE} form, not {content_type:?}"),
        ));
    }
    let form: LoginForm = ctx.form()?;
    let account = auth::normalize_email(&form.username);
    // The budget key is bounded like an email, whatever was typed.
    let account = match account.char_indices().nth(super::rules::EMAIL_CHARS_MAX) {
        Some((end, _)) => &account[..end],
        None => account.as_str(),
    };
    let throttle = &ctx.state.throttle;
    let reservation = throttle.reserve(ctx.client, account).map_err(|refused| {
        ApiError::too_many_attempts(
            refused.retry_after_seconds,
            "too_many_attempts",
            format!(
                "too many failed sign-ins {}; try again in {} s",
                refused.budget, refused.retry_after_seconds
            ),
        )
    })?;
    let user = match user_by_email(ctx, &form.username).await {
        Ok(user) => user,
        Err(error) => {
            throttle.refund(reservation);
            return Err(error);
        }
    };
    let stored = user.as_ref().map(|u| u.password_hash.clone());
    let matches = match ctx.state.hashing.verify(stored, form.password).await {
        Ok(matches) => matches,
        Err(busy) => {
            throttle.refund(reservation);
            return Err(busy);
        }
    };
    let (Some(user), true) = (user, matches) else {
        return Err(ApiError::unauthorized("wrong email or password"));
    };
    throttle.succeeded(reservation);
    if user.disabled {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "account_disabled",
            format!(
                "the account {:?} is disabled; an admin may enable it",
                user.email
            ),
        ));
    }
    signed_in(ctx, &user, StatusCode::OK).await
}

/// The user an email names. Emails are stored normalised, except a user from before that whose
/// address differs from another's only in case (the migration kept it as it was): that one is
/// found exactly as typed, everyone else by the normalised form.
async fn user_by_email(ctx: &Ctx<'_>, typed: &str) -> Result<Option<UserRow>, ApiError> {
    let store = ctx.state.node.store();
    let trimmed = typed.trim();
    if trimmed.len() > super::rules::EMAIL_CHARS_MAX {
        return Ok(None);
    }
    if let Some(user) = store.user_by_email(trimmed).await? {
        return Ok(Some(user));
    }
    let normalized = auth::normalize_email(trimmed);
    if normalized == trimmed {
        return Ok(None);
    }
    Ok(store.user_by_email(&normalized).await?)
}

/// Opens a session and answers with its cookies.
async fn signed_in(ctx: &Ctx<'_>, user: &UserRow, status: StatusCode) -> Result<Reply, ApiError> {
    let session_id = auth::new_id()?;
    let seconds = ctx.state.auth.session_seconds;
    ctx.state
        .node
        .store()
        .open_session(
            &session_id,
            &user.id,
            seconds,
            ctx.state.auth.sessions_per_user_max,
        )
        .await?;
    let secret = &ctx.state.secret;
    let mut reply = json_reply(status, user_reply(user));
    set_cookies(
        ctx,
        &mut reply,
        &secret.session_cookie(&session_id, user),
        &secret.csrf_token(&session_id),
        seconds,
    )?;
    Ok(reply)
}

fn set_cookies(
    ctx: &Ctx<'_>,
    reply: &mut Reply,
    session: &str,
    csrf: &str,
    max_age_seconds: u64,
) -> Result<(), ApiError> {
    let secure = if ctx.state.auth.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    for cookie in [
        format!(
            "{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_seconds}{secure}"
        ),
        // Readable by the page's scripts: they repeat it in X-CSRF-Token.
        format!("{CSRF_COOKIE}={csrf}; Path=/; SameSite=Lax; Max-Age={max_age_seconds}{secure}"),
    ] {
        let value = HeaderValue::try_from(cookie)
            .map_err(|e| ApiError::bad_request(format!("cannot set a cookie: {e}")))?;
        reply.headers_mut().append(SET_COOKIE, value);
    }
    Ok(())
}

/// Ends this session (a token-authenticated caller has none to end).
pub async fn logout(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let principal = ctx.principal()?;
    if let Some(session_id) = principal.credential.session_id() {
        ctx.state.node.store().revoke_session(session_id).await?;
    }
    let mut reply = json_reply(StatusCode::OK, user_reply(&principal.user));
    set_cookies(ctx, &mut reply, "", "", 0)?;
    Ok(reply)
}

pub async fn me(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let user = &ctx.principal()?.user;
    let stored = ctx.state.node.store().stored_bytes(Some(&user.id)).await?;
    let stored_bytes = stored.first().map_or(0, |row| row.stored_bytes);
    Ok(json_reply(
        StatusCode::OK,
        user_with_storage(ctx, user, stored_bytes),
    ))
}

/// A new API token; its secret appears in this reply only.
pub async fn create_token(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: NewTokenBody = ctx.json()?;
    let name = body.name.as_str();
    // A name is shown in lists and terminals: one line, no control character may move a cursor.
    super::rules::check_line(name, super::wire::TOKEN_NAME_CHARS_MAX)
        .map_err(|why| ApiError::bad_request(format!("body field `name`: {why}")))?;
    let days_max = ctx.state.auth.token_days_max;
    let lifetime_seconds = match body.expires_in_days {
        None => None,
        Some(days) if (1..=days_max).contains(&days) => Some(f64::from(days) * SECONDS_PER_DAY),
        Some(days) => {
            return Err(ApiError::bad_request(format!(
                "body field `expires_in_days`: {days} is not from 1 to {days_max} \
                 (`auth.token_days_max`)"
            )));
        }
    };
    let (id, token, token_hash) = auth::new_token()?;
    let row = ctx
        .state
        .node
        .store()
        .create_token(NewToken {
            id,
            user_id: ctx.principal()?.user.id.clone(),
            name: name.to_owned(),
            token_hash,
            lifetime_seconds,
            live_max: ctx.state.auth.tokens_per_user_max,
        })
        .await?;
    Ok(json_reply(
        StatusCode::CREATED,
        NewTokenReply {
            id: row.id,
            name: row.name,
            token,
            expires_at: row.expires_at,
        },
    ))
}

fn token_reply(row: store::TokenRow) -> TokenReply {
    TokenReply {
        id: row.id,
        name: row.name,
        created_at: row.created_at,
        revoked: row.revoked,
        expires_at: row.expires_at,
    }
}

pub async fn list_tokens(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let rows = ctx
        .state
        .node
        .store()
        .list_tokens(&ctx.principal()?.user.id)
        .await?;
    Ok(json_reply(
        StatusCode::OK,
        TokensReply {
            tokens: rows.into_iter().map(token_reply).collect(),
        },
    ))
}

pub async fn revoke_token(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let token_id = super::workflows::path_id(ctx, "id")?;
    let user_id = &ctx.principal()?.user.id;
    let store = ctx.state.node.store();
    if !store.revoke_token(user_id, &token_id).await? {
        return Err(ApiError::not_found(format!(
            "no live API token {token_id:?} of yours"
        )));
    }
    let row = store
        .list_tokens(user_id)
        .await?
        .into_iter()
        .find(|t| t.id == token_id)
        .ok_or_else(|| ApiError::not_found(format!("no API token {token_id:?}")))?;
    Ok(json_reply(StatusCode::OK, token_reply(row)))
}

/// Every user, oldest first (admins).
pub async fn list_users(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let store = ctx.state.node.store();
    let users = store.list_users().await?;
    let stored: std::collections::HashMap<String, i64> = store
        .stored_bytes(None)
        .await?
        .into_iter()
        .map(|row| (row.user_id, row.stored_bytes))
        .collect();
    let users = users
        .iter()
        .map(|user| user_with_storage(ctx, user, stored.get(&user.id).copied().unwrap_or(0)))
        .collect();
    Ok(json_reply(StatusCode::OK, UsersReply { users }))
}

/// The user a path names (404 when there is none).
async fn path_user(ctx: &Ctx<'_>) -> Result<UserRow, ApiError> {
    let user_id = super::workflows::path_id(ctx, "id")?;
    ctx.state
        .node
        .store()
        .user_by_id(&user_id)
        .await?
        .ok_or_else(|| no_user(&user_id))
}

fn no_user(user_id: &str) -> ApiError {
    ApiError::not_found(format!("no user {user_id:?}"))
}

fn last_admin(email: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "last_admin",
        format!("{email:?} is the last enabled admin; make another admin first"),
    )
}

/// Changes a user's role or disables or enables them (admins). Disabling ends the user's
/// sessions and makes their API tokens refuse; the last enabled admin cannot be disabled or
/// demoted (409 `last_admin`).
pub async fn change_user(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: UserChangeBody = ctx.json()?;
    let user_id = super::workflows::path_id(ctx, "id")?;
    if body.role.is_none() && body.disabled.is_none() {
        return Err(ApiError::bad_request(
            "the body changes nothing: give `role`, `disabled` or both",
        ));
    }
    let change = UserChange {
        role: body.role.map(Role::from),
        disabled: body.disabled,
    };
    let store = ctx.state.node.store();
    match store.change_user(&user_id, change).await? {
        UserChanged::Changed(user) => Ok(json_reply(StatusCode::OK, user_reply(&user))),
        UserChanged::NotFound => Err(no_user(&user_id)),
        UserChanged::LastAdmin => {
            let email = store
                .user_by_id(&user_id)
                .await?
                .map_or(user_id.clone(), |user| user.email);
            Err(last_admin(&email))
        }
    }
}

/// Sets a user's password (admins) and ends every session of theirs; their API tokens stay.
pub async fn reset_password(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: PasswordResetBody = ctx.json()?;
    let user = path_user(ctx).await?;
    auth::check_credentials(&user.email, &body.password)?;
    let password_hash = ctx.state.hashing.hash(body.password).await?;
    let store = ctx.state.node.store();
    if !store.set_password(&user.id, &password_hash, None).await? {
        return Err(no_user(&user.id));
    }
    let user = store
        .user_by_id(&user.id)
        .await?
        .ok_or_else(|| no_user(&user.id))?;
    Ok(json_reply(StatusCode::OK, user_reply(&user)))
}

/// Ends every session of a user (admins); their API tokens stay.
pub async fn sign_out_user(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let user = path_user(ctx).await?;
    if !ctx.state.node.store().end_sessions(&user.id, None).await? {
        return Err(no_user(&user.id));
    }
    Ok(json_reply(StatusCode::OK, user_reply(&user)))
}

/// Deletes a user (admins) with their sessions and API tokens: not the caller (409
/// `own_account`), nor one who owns a live workflow (409 `live_workflows`).
pub async fn delete_user(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let user = path_user(ctx).await?;
    if user.id == ctx.principal()?.user.id {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "own_account",
            "you cannot delete your own account; another admin can",
        ));
    }
    match ctx.state.node.store().delete_user(&user.id).await? {
        UserDeletion::Deleted => Ok(json_reply(
            StatusCode::OK,
            DeletedUserReply {
                id: user.id,
                deleted: true,
            },
        )),
        UserDeletion::NotFound => Err(no_user(&user.id)),
        UserDeletion::OwnsLiveWorkflows(live) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "live_workflows",
            format!(
                "{:?} owns {live} live workflow(s); cancel them (or wait for them to end) first",
                user.email
            ),
        )),
        UserDeletion::LastAdmin => Err(last_admin(&user.email)),
    }
}

/// Changes the caller's own password, given the current one, and ends their other sessions
/// (this one stays). A wrong current password spends the sign-in budgets like a failed sign-in,
/// so a stolen session cannot guess it faster than the sign-in form could.
pub async fn change_password(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: PasswordChangeBody = ctx.json()?;
    let principal = ctx.principal()?;
    let user = &principal.user;
    auth::check_credentials(&user.email, &body.new_password)?;
    let throttle = &ctx.state.throttle;
    let reservation = throttle
        .reserve(ctx.client, &user.email)
        .map_err(|refused| {
            ApiError::too_many_attempts(
                refused.retry_after_seconds,
                "too_many_attempts",
                format!(
                    "too many wrong passwords {}; try again in {} s",
                    refused.budget, refused.retry_after_seconds
                ),
            )
        })?;
    let matches = match ctx
        .state
        .hashing
        .verify(Some(user.password_hash.clone()), body.current_password)
        .await
    {
        Ok(matches) => matches,
        Err(busy) => {
            throttle.refund(reservation);
            return Err(busy);
        }
    };
    if !matches {
        return Err(ApiError::forbidden(
            "wrong_password",
            "the current password is wrong",
        ));
    }
    throttle.succeeded(reservation);
    let password_hash = ctx.state.hashing.hash(body.new_password).await?;
    let store = ctx.state.node.store();
    if !store
        .set_password(&user.id, &password_hash, principal.credential.session_id())
        .await?
    {
        return Err(no_user(&user.id));
    }
    Ok(json_reply(StatusCode::OK, user_reply(user)))
}

/// Ends every session of the caller, this one too (API tokens stay).
pub async fn sign_out_everywhere(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let user = &ctx.principal()?.user;
    ctx.state.node.store().end_sessions(&user.id, None).await?;
    let mut reply = json_reply(StatusCode::OK, user_reply(user));
    set_cookies(ctx, &mut reply, "", "", 0)?;
    Ok(reply)
}
