-- Emails are stored normalised from now on: trimmed, ASCII letters in lower case (translate, not
-- lower(), whose result depends on the locale for other letters). Existing addresses are
-- normalised in place, except where that would merge two users: of each group of addresses equal
-- but for case, only the oldest user is lowered (and none if one of them already is), the others
-- stay as they were and sign in with the address exactly as stored.
UPDATE users SET email = translate(email, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
 WHERE email <> translate(email, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
   AND NOT EXISTS (
       SELECT 1 FROM users other
        WHERE other.id <> users.id
          AND translate(other.email, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
              = translate(users.email, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
          AND (other.email = translate(other.email, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
               OR other.created_at < users.created_at
               OR (other.created_at = users.created_at AND other.id < users.id)));
