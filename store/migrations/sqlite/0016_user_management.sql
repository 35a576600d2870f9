-- User management: a role instead of the admin flag (`approver` may see and answer every
-- workflow), disabled accounts, the time of the last sign-in, and API tokens that expire.
ALTER TABLE users ADD COLUMN role TEXT NOT NULL DEFAULT 'user'
    CHECK (role IN ('user', 'approver', 'admin'));
UPDATE users SET role = 'admin' WHERE is_admin;
ALTER TABLE users DROP COLUMN is_admin;
-- A disabled user's sessions and API tokens are refused by the very query that reads them.
ALTER TABLE users ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN last_login_at REAL;
-- NULL: the token does not expire (every token made before this migration).
ALTER TABLE api_tokens ADD COLUMN expires_at REAL;
