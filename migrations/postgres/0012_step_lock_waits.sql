-- A step's, an input's and a ledger write's own lock waits are bounded by the client's statement
-- deadline (pool_config["command_timeout"], 30 s), not by the session's lock_timeout (5 s).
-- The session-wide lock_timeout exists so that a lease take never waits for ever behind a frozen
-- session; applied to the writes of a run it turned a legit wait into a lost step: a live
-- thread's history trim (DELETE FROM states ... version <= v_new - p_history) waits for a prune's
-- one long transaction, which row-locks every old state row until it commits, and the turn failed
-- with STORAGE_TRANSIENT_001 after 5 s. The client deadline still ends a wait behind a frozen
-- session (the server cancels the statement once it sees the client gone). Idempotent.
DO $do$
DECLARE f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
           WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n WHERE n.nspname = current_schema())
             AND p.proname IN ('tenx_put_step', 'tenx_put_input', 'tenx_ledger_put')
  LOOP
    EXECUTE format('ALTER FUNCTION %s SET lock_timeout = 0', f);
  END LOOP;
END
$do$;
