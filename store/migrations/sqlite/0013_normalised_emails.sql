-- Emails are stored normalised from now on: trimmed, ASCII letters in lower case (SQLite's
-- lower() changes only those). Existing addresses are normalised in place, except where that
-- would merge two users: of each group of addresses equal but for case, only the oldest user is
-- lowered (and none if one of them already is), the others stay as they were and sign in with
-- the address exactly as stored.
UPDATE users SET email = lower(email)
 WHERE email <> lower(email)
   AND NOT EXISTS (
       SELECT 1 FROM users other
        WHERE other.id <> users.id
          AND lower(other.email) = lower(users.email)
          AND (other.email = lower(other.email)
               OR other.created_at < users.created_at
               OR (other.created_at = users.created_at AND other.id < users.id)));
