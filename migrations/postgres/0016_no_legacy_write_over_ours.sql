-- Ours: a 10xGraph 0.10 worker writing a thread that tenxgraph wrote last is refused, loudly.
-- Our state rows carry no `context` (the messages live in `messages`), so such a worker (a rolling
-- deploy with both runtimes on one database, a rollback) read an empty history and wrote a row
-- holding only its own turn; tenxgraph takes a 10xGraph row's context as the truth and rewrote
-- the thread's messages from it: every earlier turn was lost (red-team, session 34). A thread
-- 10xGraph wrote last (its own runs, one it is finishing while the database is migrated) is left
-- alone. Idempotent.

CREATE OR REPLACE FUNCTION tenx_refuse_legacy_over_ours() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $fn$
DECLARE v_ours BOOLEAN;
BEGIN
  IF NEW.state_data ? 'context' THEN
    SELECT NOT (s.state_data ? 'context') INTO v_ours FROM states s
      WHERE s.thread_id = NEW.thread_id ORDER BY s.version DESC LIMIT 1;
    IF v_ours THEN
      RAISE EXCEPTION 'thread % was last written by tenxgraph: a 10xGraph 0.10 worker cannot write it without losing its history (stop 10xGraph workers before tenxgraph serves their threads)', NEW.thread_id
        USING ERRCODE = 'TX005';
    END IF;
  END IF;
  RETURN NEW;
END $fn$;

DROP TRIGGER IF EXISTS tenx_refuse_legacy_over_ours ON states;
-- Only rows with a context call the function: tenxgraph's own steps (never a context) pay a jsonb
-- key test, not a plpgsql call each.
CREATE TRIGGER tenx_refuse_legacy_over_ours BEFORE INSERT ON states
  FOR EACH ROW WHEN (NEW.state_data ? 'context') EXECUTE FUNCTION tenx_refuse_legacy_over_ours();
