-- Ours: a thread created without a name is named "Thread <id>", the name 10xGraph 0.10 gives a
-- thread on its first write (its config.get("thread_name", f"Thread {thread_id}")). A trigger
-- rather than a name in each INSERT of the step, input and ledger functions, so those stay as
-- they are; it fires only on an insert whose name is NULL, and those functions insert only when
-- the thread is new. Threads created before this version keep their NULL name.

CREATE OR REPLACE FUNCTION tenx_name_thread() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
BEGIN
  -- Cut to the column's 255 characters: a thread id of 249 or more would not fit the prefix
  -- (10xGraph's own insert fails there).
  NEW.thread_name := left('Thread ' || NEW.thread_id::text, 255);
  RETURN NEW;
END $fn$;

DROP TRIGGER IF EXISTS tenx_name_thread ON threads;
CREATE TRIGGER tenx_name_thread BEFORE INSERT ON threads
  FOR EACH ROW WHEN (NEW.thread_name IS NULL) EXECUTE FUNCTION tenx_name_thread();
