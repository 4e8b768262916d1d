-- Ours: a run's first commit in one statement. tenx_put_input takes the thread's lease
-- (tenx_lease_acquire, version 5), writes the input step fenced by the new token (tenx_put_step,
-- version 6) and clears the run's old stop request from tenx_cache. A take that is refused
-- returns the holder and writes nothing; the step's RAISEs (stale version, another user's
-- thread) abort the statement and so undo the take.

CREATE OR REPLACE FUNCTION tenx_put_input(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_prev_mark TEXT,
  p_holder TEXT, p_host TEXT, p_pid BIGINT, p_pid_start BIGINT, p_ttl FLOAT8, p_steal BIGINT,
  p_stop_ns TEXT, p_stop_key TEXT
) RETURNS TABLE (acquired BOOLEAN, token BIGINT, holder TEXT, host TEXT, pid BIGINT, pid_start BIGINT,
                 expires_in FLOAT8, released BOOLEAN, version BIGINT)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE l RECORD; v_new BIGINT;
BEGIN
  SELECT * INTO l FROM tenx_lease_acquire(p_thread, p_holder, p_host, p_pid, p_pid_start, p_ttl, p_steal);
  IF l.acquired THEN
    v_new := tenx_put_step(p_thread, p_user, p_expected, p_state, p_messages, p_replace, p_history,
                           p_isolate, l.token, FALSE, p_prev_mark);
    IF p_stop_key IS NOT NULL THEN
      DELETE FROM tenx_cache c WHERE c.namespace = p_stop_ns AND c.key = p_stop_key;
    END IF;
  END IF;
  RETURN QUERY SELECT l.acquired, l.token, l.holder, l.host, l.pid, l.pid_start, l.expires_in, l.released, v_new;
END $fn$;
