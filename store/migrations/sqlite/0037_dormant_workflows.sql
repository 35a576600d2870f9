-- Dormant workflows: see the PostgreSQL migration 37 of the same name.

ALTER TABLE workflows ADD COLUMN dormant INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN wake_at REAL;
CREATE INDEX workflows_dormant_by_wake ON workflows (wake_at) WHERE dormant;
