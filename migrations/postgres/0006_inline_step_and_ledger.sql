-- Ours: the fenced step and ledger writes as one plpgsql body each. Same statements and the same
-- errors as versions 4 and 5, less overhead: each nested PERFORM of a helper function cost
-- 25-40 us on the server (bench/profile_pg.py --nested), four of them per step; and the thread
-- row is locked, owner-checked and stamped by one UPDATE ... RETURNING instead of an INSERT ...
-- ON CONFLICT, a SELECT ... FOR UPDATE and a later UPDATE (a new thread still takes the insert
-- path). The UPDATE takes a lock that conflicts with every other writer of the row, as FOR UPDATE
-- did, and lets foreign-key checks (FOR KEY SHARE) through.
--
-- The fence check (the lease row FOR SHARE, TX004 when the token moved) and the owner check
-- (TX002) are written out in each function rather than called, for the same reason. Table
-- aliases keep them unambiguous inside functions whose RETURNS TABLE columns share names with
-- the tables.

CREATE OR REPLACE FUNCTION tenx_put_step(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_fence BIGINT, p_release BOOLEAN, p_prev_mark TEXT
) RETURNS BIGINT LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_current BIGINT; v_new BIGINT; v_prev_mark TEXT;
  v_count INT := jsonb_array_length(p_messages); v_written INT;
BEGIN
  IF p_fence IS NOT NULL THEN
    SELECT l.token INTO v_token FROM tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
  UPDATE threads SET updated_at = NOW() WHERE thread_id = p_thread{{ID}} RETURNING user_id INTO v_owner;
  IF NOT FOUND THEN
    INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
  SELECT st.version, st.state_data->'__state_meta__'->>'write' INTO v_current, v_prev_mark
  FROM states st WHERE st.thread_id = p_thread{{ID}} ORDER BY st.version DESC, st.state_id DESC LIMIT 1;
  v_current := COALESCE(v_current, 0);
  IF v_current <> p_expected THEN
    RAISE EXCEPTION 'stale state' USING ERRCODE = 'TX001', DETAIL = p_expected || ',' || v_current;
  END IF;
  v_new := v_current + 1;
  -- The run's mark is kept only while the latest row still carries the mark the run last saw
  -- (store::chained_state): messages changed under the run make this commit unmarked.
  IF (p_state->'__state_meta__') ? 'write' AND v_prev_mark IS DISTINCT FROM p_prev_mark THEN
    p_state := p_state #- '{__state_meta__,write}';
  END IF;
  INSERT INTO states (thread_id, version, state_data) VALUES (p_thread{{ID}}, v_new, p_state);
  IF p_history > 0 THEN
    DELETE FROM states WHERE thread_id = p_thread{{ID}} AND version <= v_new - p_history;
  END IF;
  IF p_replace THEN
    DELETE FROM messages WHERE thread_id = p_thread{{ID}};
  END IF;
  IF v_count > 0 THEN
    INSERT INTO messages AS m (message_id, thread_id, role, content, tool_calls, reasoning, usages, meta, message_data)
    SELECT (e.value->>'message_id'){{ID}}, p_thread{{ID}}, (e.value->>'role')::message_role, (e.value->'content')::text,
           e.value->'tools_calls', e.value->>'reasoning', COALESCE(e.value->'usages', '{}'::jsonb),
           COALESCE(e.value->'metadata', '{}'::jsonb), e.value
    FROM jsonb_array_elements(p_messages) WITH ORDINALITY AS e(value, ord) ORDER BY e.ord
    ON CONFLICT (message_id) DO UPDATE SET content = EXCLUDED.content, tool_calls = EXCLUDED.tool_calls,
      reasoning = EXCLUDED.reasoning, usages = EXCLUDED.usages, meta = EXCLUDED.meta,
      message_data = EXCLUDED.message_data, updated_at = NOW()
    WHERE m.thread_id = EXCLUDED.thread_id;
    GET DIAGNOSTICS v_written = ROW_COUNT;
    IF v_written < v_count THEN
      RAISE EXCEPTION 'a message id belongs to another thread' USING ERRCODE = 'TX003';
    END IF;
  END IF;
  IF p_release AND p_fence IS NOT NULL THEN
    UPDATE tenx_leases SET released = TRUE, expires_at = clock_timestamp()
    WHERE thread_id = p_thread AND token = p_fence;
  END IF;
  RETURN v_new;
END $fn$;

CREATE OR REPLACE FUNCTION tenx_ledger_put(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_results JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_written INT;
BEGIN
  IF p_fence IS NOT NULL THEN
    SELECT l.token INTO v_token FROM tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
  SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  IF NOT FOUND THEN
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

-- The start of a tool node in one round trip: the rows already recorded for p_keys (read before
-- the insert: a data-modifying CTE does not see its own rows) and an intent record for each key
-- without a row.
CREATE OR REPLACE FUNCTION tenx_ledger_begin(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_intents JSONB[], p_fence BIGINT
) RETURNS TABLE (tool_call_id TEXT, result JSONB) LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
#variable_conflict use_column
DECLARE v_token BIGINT; v_owner TEXT;
BEGIN
  IF p_fence IS NOT NULL THEN
    SELECT l.token INTO v_token FROM tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
  SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
  RETURN QUERY
    WITH found AS (
      SELECT x.tool_call_id::TEXT AS k, x.result AS r FROM tool_executions x
      WHERE x.thread_id = p_thread{{ID}} AND x.tool_call_id = ANY(p_keys)
    ), written AS (
      INSERT INTO tool_executions AS l (thread_id, tool_call_id, result)
      SELECT p_thread{{ID}}, u.k, u.r FROM UNNEST(p_keys, p_intents) AS u(k, r)
      ON CONFLICT (thread_id, tool_call_id) DO NOTHING
      RETURNING 1
    )
    SELECT f.k, f.r FROM found f;
END $fn$;
