-- A listing is newest first by (created_at, id), for everyone (admins, approvers) or for one
-- user: each reads its page from one of these indexes backwards instead of sorting the table.
CREATE INDEX workflows_newest_first ON workflows (created_at, id);
CREATE INDEX workflows_by_user_newest_first ON workflows (user_id, created_at, id);
