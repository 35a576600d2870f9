-- Sessions and API tokens of the users (table `users`, from the first migration). An API token
-- is kept only as the SHA-256 of its secret (32 random bytes, so a slow hash adds nothing).

-- One row per signed-in browser: logout revokes just this one; expiry is judged by the
-- database clock.
CREATE TABLE user_sessions (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at  REAL NOT NULL,
    revoked     INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL DEFAULT (unixepoch('subsec'))
);
CREATE INDEX user_sessions_by_user ON user_sessions (user_id);

CREATE TABLE api_tokens (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    token_hash  TEXT NOT NULL,
    created_at  REAL NOT NULL DEFAULT (unixepoch('subsec')),
    revoked_at  REAL
);
CREATE INDEX api_tokens_by_user ON api_tokens (user_id);
