-- Events sent to a workflow: the same table as PostgreSQL's migration 35 (see there). Its
-- change-bus cue is a temporary trigger of the writer (store/src/sqlite/changes.rs).
CREATE TABLE sent_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    event_id    TEXT NOT NULL,
    name        TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_by  TEXT,
    created_at  REAL NOT NULL,
    taken_by    TEXT,
    taken_at    REAL,
    UNIQUE (workflow, event_id)
);

CREATE INDEX sent_events_untaken ON sent_events (workflow, seq) WHERE taken_by IS NULL;
