-- SQLite form of postgres/0001_initial.sql: the same tables, columns and constraints. Timestamps
-- are epoch seconds (REAL); JSON is TEXT. The fence and the clock are SQL the store issues itself.

CREATE TABLE nodes (
    worker_id   TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         BIGINT NOT NULL,
    version     TEXT NOT NULL,
    started_at  REAL NOT NULL,
    stopped_at  REAL
);

CREATE TABLE users (
    id             TEXT PRIMARY KEY,
    email          TEXT NOT NULL UNIQUE,
    password_hash  TEXT NOT NULL,
    is_admin       INTEGER NOT NULL DEFAULT 0,
    token_version  BIGINT NOT NULL DEFAULT 0,
    created_at     REAL NOT NULL
);

CREATE TABLE extension_execution_leases (
    resource_id  TEXT PRIMARY KEY,
    owner        TEXT NOT NULL,
    epoch        BIGINT NOT NULL CHECK (epoch > 0),
    expires_at   REAL NOT NULL
);

CREATE TABLE workflows (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL,
    request_id   TEXT,
    status       TEXT NOT NULL CHECK (status IN ('running', 'paused', 'waiting_approval',
                     'cancelling', 'completed', 'failed', 'cancelled', 'needs_reconciliation')),
    owner        TEXT,
    fingerprint  TEXT NOT NULL,
    data         TEXT NOT NULL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    UNIQUE (user_id, request_id)
);
CREATE INDEX workflows_by_status ON workflows (status);

CREATE TABLE workflow_steps (
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL CHECK (attempt > 0),
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('queued', 'admitting', 'running', 'completed',
                    'failed', 'cancelled')),
    data        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (workflow, step_id, attempt)
);

CREATE TABLE workflow_slots (
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (workflow, step_id)
);

CREATE TABLE workflow_controls (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    kind        TEXT NOT NULL CHECK (kind IN ('resume', 'decide', 'cancel')),
    step_id     TEXT NOT NULL DEFAULT '',
    attempt     INTEGER NOT NULL DEFAULT 0,
    body        TEXT NOT NULL,
    created_by  TEXT,
    created_at  REAL NOT NULL,
    applied_at  REAL,
    UNIQUE (workflow, kind, step_id, attempt)
);

CREATE TABLE workflow_artifacts (
    workflow        TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    version         BIGINT NOT NULL CHECK (version > 0),
    source_step_id  TEXT,
    path            TEXT,
    content         BLOB NOT NULL,
    bytes           BIGINT NOT NULL,
    sha256          TEXT NOT NULL,
    created_at      REAL NOT NULL,
    PRIMARY KEY (workflow, version)
);

CREATE TABLE runs (
    run_id               TEXT PRIMARY KEY,
    thread_id            TEXT NOT NULL,
    workflow             TEXT,
    step_id              TEXT,
    attempt              INTEGER,
    agent                TEXT NOT NULL,
    status               TEXT NOT NULL CHECK (status IN ('pending', 'running', 'success', 'error',
                             'interrupted', 'waiting_for_input')),
    owner_worker_id      TEXT,
    lease_expires_at     REAL,
    cancel_action        TEXT CHECK (cancel_action IN ('interrupt', 'rollback')),
    error                TEXT,
    output               TEXT,
    idempotency_key      TEXT UNIQUE,
    idempotency_request  TEXT,
    metadata             TEXT NOT NULL DEFAULT '{}',
    total_tokens         BIGINT NOT NULL DEFAULT 0,
    message_count        BIGINT NOT NULL DEFAULT 0,
    created_at           REAL NOT NULL,
    updated_at           REAL NOT NULL
);
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('pending', 'running');
CREATE INDEX runs_by_step ON runs (workflow, step_id, attempt);

