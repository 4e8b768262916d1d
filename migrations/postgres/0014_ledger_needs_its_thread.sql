-- Ours: a run's ledger write no longer brings back a thread deleted under it. Until version 13 the
-- three ledger functions created the thread row when it was missing; a thread deleted by
-- aclean_thread while its tool node ran (its lease row stays while held, so the fence passed) came
-- back as a row with the tool's result and no state, listed by alist_threads. A fenced write
-- (a run's: its input commit made the thread) now finds the thread or writes nothing, with the
-- fence's error and no current token (the run no longer has a thread to own). A fence of 0
-- checks no token but needs the thread too: a result a run records after it stopped waiting
-- (a sync tool past its deadline, results recorded as a run is cancelled). An unfenced write
-- (ledger_put outside a run) still creates it, as before.
--
-- The three functions of versions 6 and 7 with that one change (tenx_ledger_put keeps version
-- 12's lock_timeout, which a replaced function would otherwise lose). Idempotent.

CREATE OR REPLACE FUNCTION tenx_ledger_put(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_results JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql SET search_path FROM CURRENT SET lock_timeout = 0 AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_written INT;
BEGIN
  IF p_fence IS NOT NULL AND p_fence <> 0 THEN
    SELECT l.token INTO v_token FROM tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
  SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  IF NOT FOUND THEN
    IF p_fence IS NOT NULL THEN
      RAISE EXCEPTION 'thread deleted under its run' USING ERRCODE = 'TX004', DETAIL = p_fence || ',';
    END IF;
    INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
  INSERT INTO tool_executions AS l (thread_id, tool_call_id, result)
  SELECT p_thread{{ID}}, k, r FROM UNNEST(p_keys, p_results) AS u(k, r)
  ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET result = EXCLUDED.result, created_at = NOW()
  WHERE l.result->>'__kind__' = 'started' AND EXCLUDED.result->>'__kind__' IS DISTINCT FROM 'started';
  GET DIAGNOSTICS v_written = ROW_COUNT;
  RETURN v_written;
END $fn$;

CREATE OR REPLACE FUNCTION tenx_ledger_mark(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_marks JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_written INT;
BEGIN
  IF p_fence IS NOT NULL AND p_fence <> 0 THEN
    SELECT l.token INTO v_token FROM tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
  SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  IF NOT FOUND THEN
    IF p_fence IS NOT NULL THEN
      RAISE EXCEPTION 'thread deleted under its run' USING ERRCODE = 'TX004', DETAIL = p_fence || ',';
    END IF;
    INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
  UPDATE tool_executions x SET result = u.r, created_at = NOW()
  FROM UNNEST(p_keys, p_marks) AS u(k, r)
  WHERE x.thread_id = p_thread{{ID}} AND x.tool_call_id = u.k
    AND x.result->>'__kind__' = 'started' AND u.r->>'__kind__' = 'started';
  GET DIAGNOSTICS v_written = ROW_COUNT;
  RETURN v_written;
END $fn$;

CREATE OR REPLACE FUNCTION tenx_ledger_begin(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_intents JSONB[], p_fence BIGINT, p_read TEXT[]
) RETURNS TABLE (tool_call_id TEXT, result JSONB) LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
#variable_conflict use_column
DECLARE v_token BIGINT; v_owner TEXT;
BEGIN
  IF p_fence IS NOT NULL AND p_fence <> 0 THEN
    SELECT l.token INTO v_token FROM tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
  SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  IF NOT FOUND THEN
    IF p_fence IS NOT NULL THEN
      RAISE EXCEPTION 'thread deleted under its run' USING ERRCODE = 'TX004', DETAIL = p_fence || ',';
    END IF;
    INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
  RETURN QUERY
    WITH found AS (
      SELECT x.tool_call_id::TEXT AS k, x.result AS r FROM tool_executions x
      WHERE x.thread_id = p_thread{{ID}} AND (x.tool_call_id = ANY(p_keys) OR x.tool_call_id = ANY(p_read))
    ), written AS (
      INSERT INTO tool_executions AS l (thread_id, tool_call_id, result)
      SELECT p_thread{{ID}}, u.k, u.r FROM UNNEST(p_keys, p_intents) AS u(k, r)
      ON CONFLICT (thread_id, tool_call_id) DO NOTHING
      RETURNING 1
    )
    SELECT f.k, f.r FROM found f;
END $fn$;
