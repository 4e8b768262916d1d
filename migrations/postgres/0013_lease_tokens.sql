-- Ours: fencing tokens drawn from one sequence for the whole schema, so a free lease row can go
-- with its thread. Until version 12 a token was its row's last token plus one, and the row was
-- kept for ever: deleted with its thread, a reused thread id would have started again at 1 and
-- handed a new run the token a stalled run of the old thread might still hold (its writes would
-- then pass the fence). Every token is now above every token handed out before, by any thread,
-- so `aclean_thread` and `aprune` delete the lease rows nobody holds.
--
-- The two functions that take a lease are replaced: the input commit (version 11's, whose
-- 17-argument form of version 9 calls it, so a process of the previous release draws from the
-- sequence too) and tenx_lease_acquire. Each token is the greater of the row's next and the
-- sequence's next: the sequence starts above every token already given out, and the row's own
-- count still rises should the sequence ever be set back by hand. Not a trigger: each nested
-- plpgsql call costs 25-40 us of server time, and this one would run on every turn.
--
-- Also: an index for prune's sweep of expired cache entries.

CREATE SEQUENCE IF NOT EXISTS tenx_lease_tokens AS BIGINT;
-- The next token is one above the greatest already given out (1 on a new schema).
SELECT setval('tenx_lease_tokens', COALESCE((SELECT MAX(token) FROM tenx_leases), 0) + 1, false);

-- Version 11's input commit with its three token assignments drawing from the sequence (and
-- version 12's lock_timeout, which a replaced function would otherwise lose).
CREATE OR REPLACE FUNCTION tenx_put_input(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_prev_mark TEXT,
  p_holder TEXT, p_host TEXT, p_pid BIGINT, p_pid_start BIGINT, p_ttl FLOAT8, p_steal BIGINT,
  p_stop_ns TEXT, p_stop_key TEXT, p_on_head BOOLEAN
) RETURNS TABLE (acquired BOOLEAN, token BIGINT, holder TEXT, host TEXT, pid BIGINT, pid_start BIGINT,
                 expires_in FLOAT8, released BOOLEAN, version BIGINT)
LANGUAGE plpgsql SET search_path FROM CURRENT SET lock_timeout = 0 AS $fn$
DECLARE r tenx_leases%ROWTYPE; v_now TIMESTAMPTZ := clock_timestamp(); v_token BIGINT; v_owner TEXT;
  v_current BIGINT; v_new BIGINT; v_prev_mark TEXT; v_count INT := jsonb_array_length(p_messages); v_written INT;
BEGIN
  -- The take. A concurrent taker's row lock makes this UPDATE wait and then test its new row.
  UPDATE tenx_leases l SET token = GREATEST(l.token + 1, nextval('tenx_lease_tokens')), holder = p_holder, host = p_host, pid = p_pid,
    pid_start = p_pid_start, expires_at = v_now + make_interval(secs => p_ttl), released = FALSE, acquired_at = v_now
  WHERE l.thread_id = p_thread AND (l.released OR l.expires_at <= v_now OR l.token = p_steal)
  RETURNING l.token INTO v_token;
  IF NOT FOUND THEN
    INSERT INTO tenx_leases AS l (thread_id, token, holder, host, pid, pid_start, expires_at, released, acquired_at)
    VALUES (p_thread, nextval('tenx_lease_tokens'), p_holder, p_host, p_pid, p_pid_start, v_now + make_interval(secs => p_ttl), FALSE, v_now)
    ON CONFLICT (thread_id) DO NOTHING
    RETURNING l.token INTO v_token;
  END IF;
  IF v_token IS NULL THEN
    SELECT * INTO r FROM tenx_leases l WHERE l.thread_id = p_thread FOR UPDATE;
    IF r.released OR r.expires_at <= v_now OR r.token = p_steal THEN
      UPDATE tenx_leases l SET token = GREATEST(r.token + 1, nextval('tenx_lease_tokens')), holder = p_holder, host = p_host, pid = p_pid,
        pid_start = p_pid_start, expires_at = v_now + make_interval(secs => p_ttl), released = FALSE,
        acquired_at = v_now
      WHERE l.thread_id = p_thread
      RETURNING l.token INTO v_token;
    ELSE
      acquired := FALSE; token := r.token; holder := r.holder; host := r.host; pid := r.pid;
      pid_start := r.pid_start; expires_in := EXTRACT(EPOCH FROM r.expires_at - v_now)::FLOAT8;
      released := r.released; version := NULL;
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  -- The input step, fenced by the token just taken (see the header).
  UPDATE threads SET updated_at = NOW() WHERE thread_id = p_thread{{ID}} RETURNING user_id INTO v_owner;
  IF NOT FOUND THEN
    INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM threads th WHERE th.thread_id = p_thread{{ID}} FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
  SELECT st.version, st.state_data->'__state_meta__'->>'write' INTO v_current, v_prev_mark
  FROM states st WHERE st.thread_id = p_thread{{ID}} ORDER BY st.version DESC LIMIT 1;
  v_current := COALESCE(v_current, 0);
  IF v_current <> p_expected THEN
    RAISE EXCEPTION 'stale state' USING ERRCODE = 'TX001', DETAIL = p_expected || ',' || v_current;
  END IF;
  -- A run that skipped its start read holds the commit (p_expected, p_prev_mark) and built this
  -- input on it: any other row at that version (a thread deleted and written again) is stale.
  IF p_on_head AND v_prev_mark IS DISTINCT FROM p_prev_mark THEN
    RAISE EXCEPTION 'stale state' USING ERRCODE = 'TX001', DETAIL = p_expected || ',' || v_current;
  END IF;
  v_new := v_current + 1;
  IF (p_state->'__state_meta__') ? 'write' AND v_prev_mark IS DISTINCT FROM p_prev_mark THEN
    p_state := p_state #- '{__state_meta__,write}';
  END IF;
  INSERT INTO states (thread_id, version, state_data) VALUES (p_thread{{ID}}, v_new, p_state);
  IF p_history > 0 AND v_new > p_history THEN
    DELETE FROM states WHERE thread_id = p_thread{{ID}} AND states.version <= v_new - p_history;
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
  IF p_stop_key IS NOT NULL THEN
    DELETE FROM tenx_cache c WHERE c.namespace = p_stop_ns AND c.key = p_stop_key;
  END IF;
  acquired := TRUE; token := v_token; holder := p_holder; host := p_host; pid := p_pid;
  pid_start := p_pid_start; expires_in := p_ttl; released := FALSE; version := v_new;
  RETURN NEXT;
END $fn$;

CREATE OR REPLACE FUNCTION tenx_lease_acquire(
  p_thread TEXT, p_holder TEXT, p_host TEXT, p_pid BIGINT, p_pid_start BIGINT, p_ttl FLOAT8, p_steal BIGINT
) RETURNS TABLE (acquired BOOLEAN, token BIGINT, holder TEXT, host TEXT, pid BIGINT, pid_start BIGINT,
                 expires_in FLOAT8, released BOOLEAN)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE r tenx_leases%ROWTYPE; v_now TIMESTAMPTZ := clock_timestamp(); v_token BIGINT;
BEGIN
  INSERT INTO tenx_leases AS l (thread_id, token, holder, host, pid, pid_start, expires_at, released)
  VALUES (p_thread, 0, '', '', 0, 0, v_now, TRUE) ON CONFLICT (thread_id) DO NOTHING;
  SELECT * INTO r FROM tenx_leases l WHERE l.thread_id = p_thread FOR UPDATE;
  IF r.released OR r.expires_at <= v_now OR r.token = p_steal THEN
    UPDATE tenx_leases l SET token = GREATEST(r.token + 1, nextval('tenx_lease_tokens')), holder = p_holder,
      host = p_host, pid = p_pid, pid_start = p_pid_start, expires_at = v_now + make_interval(secs => p_ttl),
      released = FALSE, acquired_at = v_now
    WHERE l.thread_id = p_thread
    RETURNING l.token INTO v_token;
    RETURN QUERY SELECT TRUE, v_token, p_holder, p_host, p_pid, p_pid_start, p_ttl, FALSE;
  ELSE
    RETURN QUERY SELECT FALSE, r.token, r.holder, r.host, r.pid, r.pid_start,
      EXTRACT(EPOCH FROM r.expires_at - v_now)::FLOAT8, r.released;
  END IF;
END $fn$;

CREATE INDEX IF NOT EXISTS idx_tenx_cache_expires ON tenx_cache (expires_at) WHERE expires_at IS NOT NULL;
