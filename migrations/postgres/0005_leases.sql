-- Ours: thread leases with fencing tokens, intent records in the ledger, and the fenced versions
-- of the step and ledger writes. Every fenced write takes the lease row FOR SHARE, so it and a
-- takeover (which updates that row) are serialised: a takeover either sees the write committed or
-- the write sees the new token and raises TX004.
CREATE TABLE IF NOT EXISTS tenx_leases (
  thread_id VARCHAR(255) PRIMARY KEY,
  token BIGINT NOT NULL,
  holder TEXT NOT NULL,
  host TEXT NOT NULL,
  pid BIGINT NOT NULL,
  pid_start BIGINT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL,
  released BOOLEAN NOT NULL DEFAULT FALSE,
  acquired_at TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE INDEX IF NOT EXISTS idx_tool_executions_created ON tool_executions(created_at);

CREATE OR REPLACE FUNCTION tenx_check_fence(p_thread TEXT, p_fence BIGINT)
RETURNS VOID LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_token BIGINT;
BEGIN
  IF p_fence IS NULL THEN RETURN; END IF;
  SELECT token INTO v_token FROM tenx_leases WHERE thread_id = p_thread FOR SHARE;
  IF v_token IS DISTINCT FROM p_fence THEN
    RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
  END IF;
END $fn$;

-- The fenced step; p_release frees the lease in the same transaction (the run's last commit).
CREATE OR REPLACE FUNCTION tenx_put_step(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_fence BIGINT, p_release BOOLEAN
) RETURNS BIGINT LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_new BIGINT;
BEGIN
  PERFORM tenx_check_fence(p_thread, p_fence);
  v_new := tenx_put_step(p_thread, p_user, p_expected, p_state, p_messages, p_replace, p_history, p_isolate);
  IF p_release AND p_fence IS NOT NULL THEN
    UPDATE tenx_leases SET released = TRUE, expires_at = clock_timestamp()
    WHERE thread_id = p_thread AND token = p_fence;
  END IF;
  RETURN v_new;
END $fn$;

-- Ledger rows in one round trip: the first result wins; an intent record ('started') goes only
-- where no row exists, and a result replaces an intent. Returns the rows written.
CREATE OR REPLACE FUNCTION tenx_ledger_put(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_results JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_written INT;
BEGIN
  PERFORM tenx_check_fence(p_thread, p_fence);
  PERFORM tenx_lock_thread(p_thread, p_user, p_isolate);
  INSERT INTO tool_executions AS l (thread_id, tool_call_id, result)
  SELECT p_thread{{ID}}, k, r FROM UNNEST(p_keys, p_results) AS u(k, r)
  ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET result = EXCLUDED.result, created_at = NOW()
  WHERE l.result->>'__kind__' = 'started' AND EXCLUDED.result->>'__kind__' IS DISTINCT FROM 'started';
  GET DIAGNOSTICS v_written = ROW_COUNT;
  RETURN v_written;
END $fn$;

CREATE OR REPLACE FUNCTION tenx_lease_acquire(
  p_thread TEXT, p_holder TEXT, p_host TEXT, p_pid BIGINT, p_pid_start BIGINT, p_ttl FLOAT8, p_steal BIGINT
) RETURNS TABLE (acquired BOOLEAN, token BIGINT, holder TEXT, host TEXT, pid BIGINT, pid_start BIGINT,
                 expires_in FLOAT8, released BOOLEAN)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE r tenx_leases%ROWTYPE; v_now TIMESTAMPTZ := clock_timestamp();
BEGIN
  INSERT INTO tenx_leases AS l (thread_id, token, holder, host, pid, pid_start, expires_at, released)
  VALUES (p_thread, 0, '', '', 0, 0, v_now, TRUE) ON CONFLICT (thread_id) DO NOTHING;
  SELECT * INTO r FROM tenx_leases l WHERE l.thread_id = p_thread FOR UPDATE;
  IF r.released OR r.expires_at <= v_now OR r.token = p_steal THEN
    UPDATE tenx_leases l SET token = r.token + 1, holder = p_holder, host = p_host, pid = p_pid,
      pid_start = p_pid_start, expires_at = v_now + make_interval(secs => p_ttl), released = FALSE,
      acquired_at = v_now
    WHERE l.thread_id = p_thread;
    RETURN QUERY SELECT TRUE, r.token + 1, p_holder, p_host, p_pid, p_pid_start, p_ttl, FALSE;
  ELSE
    RETURN QUERY SELECT FALSE, r.token, r.holder, r.host, r.pid, r.pid_start,
      EXTRACT(EPOCH FROM r.expires_at - v_now)::FLOAT8, r.released;
  END IF;
END $fn$;
