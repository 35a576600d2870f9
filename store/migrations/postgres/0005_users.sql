-- Sessions and API tokens of the users (table `users`, from the first migration). An API token
-- is kept only as the SHA-256 of its secret (32 random bytes, so a slow hash adds nothing).

-- One row per signed-in browser: logout revokes just this one; expiry is judged by the
-- database clock, so every node agrees on it.
CREATE TABLE user_sessions (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at  DOUBLE PRECISION NOT NULL,
    revoked     BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  DOUBLE PRECISION NOT NULL DEFAULT reins_now()
);
CREATE INDEX user_sessions_by_user ON user_sessions (user_id);

CREATE TABLE api_tokens (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    token_hash  TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL DEFAULT reins_now(),
    revoked_at  DOUBLE PRECISION
);
CREATE INDEX api_tokens_by_user ON api_tokens (user_id);
