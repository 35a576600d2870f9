-- The database clock: every lease decision is judged by it, never by a node's clock.
CREATE OR REPLACE FUNCTION reins_now() RETURNS double precision
    LANGUAGE sql VOLATILE
    AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;

CREATE TABLE nodes (
    worker_id   TEXT PRIMARY KEY,
    host        TEXT NOT NULL,
    pid         BIGINT NOT NULL,
    version     TEXT NOT NULL,
    started_at  DOUBLE PRECISION NOT NULL,
    stopped_at  DOUBLE PRECISION
);

CREATE TABLE users (
    id             TEXT PRIMARY KEY,
    email          TEXT NOT NULL UNIQUE,
    password_hash  TEXT NOT NULL,
    is_admin       BOOLEAN NOT NULL DEFAULT FALSE,
    token_version  BIGINT NOT NULL DEFAULT 0,
    created_at     DOUBLE PRECISION NOT NULL
);

CREATE TABLE extension_execution_leases (
    resource_id  TEXT PRIMARY KEY,
    owner        TEXT NOT NULL,
    epoch        BIGINT NOT NULL CHECK (epoch > 0),
    expires_at   DOUBLE PRECISION NOT NULL
);

CREATE TABLE workflows (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL,
    request_id   TEXT,
    status       TEXT NOT NULL CHECK (status IN ('running', 'paused', 'waiting_approval',
                     'cancelling', 'completed', 'failed', 'cancelled', 'needs_reconciliation')),
    owner        TEXT,
    fingerprint  TEXT NOT NULL,
    data         JSONB NOT NULL,
    created_at   DOUBLE PRECISION NOT NULL,
    updated_at   DOUBLE PRECISION NOT NULL,
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
    data        JSONB NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (workflow, step_id, attempt)
);

CREATE TABLE workflow_slots (
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (workflow, step_id)
);

CREATE TABLE workflow_controls (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    kind        TEXT NOT NULL CHECK (kind IN ('resume', 'decide', 'cancel')),
    step_id     TEXT NOT NULL DEFAULT '',
    attempt     INTEGER NOT NULL DEFAULT 0,
    body        JSONB NOT NULL,
    created_by  TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    applied_at  DOUBLE PRECISION,
    UNIQUE (workflow, kind, step_id, attempt)
);

CREATE TABLE workflow_artifacts (
    workflow        TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    version         BIGINT NOT NULL CHECK (version > 0),
    source_step_id  TEXT,
    path            TEXT,
    content         BYTEA NOT NULL,
    bytes           BIGINT NOT NULL,
    sha256          TEXT NOT NULL,
    created_at      DOUBLE PRECISION NOT NULL,
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
    lease_expires_at     DOUBLE PRECISION,
    cancel_action        TEXT CHECK (cancel_action IN ('interrupt', 'rollback')),
    error                TEXT,
    output               JSONB,
    idempotency_key      TEXT UNIQUE,
    idempotency_request  JSONB,
    metadata             JSONB NOT NULL DEFAULT '{}',
    total_tokens         BIGINT NOT NULL DEFAULT 0,
    message_count        BIGINT NOT NULL DEFAULT 0,
    created_at           DOUBLE PRECISION NOT NULL,
    updated_at           DOUBLE PRECISION NOT NULL
);
CREATE UNIQUE INDEX runs_one_active_per_thread ON runs (thread_id)
    WHERE status IN ('pending', 'running');
CREATE INDEX runs_by_step ON runs (workflow, step_id, attempt);

-- The fence: succeeds only while (resource, owner, epoch) holds the unexpired lease, and keeps a
-- FOR SHARE lock on the lease row until the calling transaction ends, so a takeover (an UPDATE of
-- that row) waits for the fenced write to commit, and a fenced write that waited for a takeover
-- re-reads the new epoch and fails. SQLSTATE RL001 is how the store recognises a lost lease.
CREATE OR REPLACE FUNCTION reins_fence(p_resource TEXT, p_owner TEXT, p_epoch BIGINT)
    RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM extension_execution_leases
     WHERE resource_id = p_resource AND owner = p_owner AND epoch = p_epoch
       AND expires_at > reins_now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RL001', MESSAGE = 'lease lost';
    END IF;
END $$;

-- Makes a statement fail (and so its whole transaction roll back) unless it touched exactly the
-- expected number of rows. SQLSTATE RN001 is how the store recognises a missing row.
CREATE OR REPLACE FUNCTION reins_expect(p_found BIGINT, p_wanted BIGINT, p_what TEXT)
    RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_found <> p_wanted THEN
        RAISE EXCEPTION USING ERRCODE = 'RN001', MESSAGE = p_what;
    END IF;
END $$;
