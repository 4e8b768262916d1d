-- Ours: message order and exact JSON, a cache table for running without Redis, and the step and
-- ledger writes as functions, so a durable step is one round trip.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS seq BIGINT;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS message_data JSONB;
UPDATE messages m SET seq = r.rn FROM (
  SELECT message_id, ROW_NUMBER() OVER (ORDER BY created_at, message_id) AS rn FROM messages
) r WHERE m.message_id = r.message_id AND m.seq IS NULL;
CREATE SEQUENCE IF NOT EXISTS messages_seq_seq OWNED BY messages.seq;
SELECT setval('messages_seq_seq', GREATEST((SELECT COALESCE(MAX(seq), 0) FROM messages), 1));
ALTER TABLE messages ALTER COLUMN seq SET DEFAULT nextval('messages_seq_seq');
CREATE INDEX IF NOT EXISTS idx_messages_thread_seq ON messages(thread_id, seq);
CREATE TABLE IF NOT EXISTS tenx_cache (
  namespace TEXT NOT NULL,
  key TEXT NOT NULL,
  value JSONB NOT NULL,
  expires_at TIMESTAMPTZ,
  PRIMARY KEY (namespace, key)
);

-- Ensures the thread row, locks it and checks the owner.
CREATE OR REPLACE FUNCTION tenx_lock_thread(p_thread TEXT, p_user TEXT, p_isolate BOOLEAN)
RETURNS VOID LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_owner TEXT;
BEGIN
  INSERT INTO threads (thread_id, user_id) VALUES (p_thread{{ID}}, p_user{{USER_ID}}) ON CONFLICT (thread_id) DO NOTHING;
  SELECT user_id INTO v_owner FROM threads WHERE thread_id = p_thread{{ID}} FOR UPDATE;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
END $fn$;

-- Upserts messages (a JSON array, in order) into a thread; TX003 when an id belongs to another.
CREATE OR REPLACE FUNCTION tenx_upsert_messages(p_thread TEXT, p_messages JSONB)
RETURNS VOID LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_count INT := jsonb_array_length(p_messages); v_written INT;
BEGIN
  IF v_count = 0 THEN RETURN; END IF;
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
END $fn$;

-- One durable step: lock, compare versions, append the state row, write the step's messages,
-- prune history. Raises TX001 (stale, DETAIL "expected,current"), TX002 (forbidden),
-- TX003 (a message id of another thread).
CREATE OR REPLACE FUNCTION tenx_put_step(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN
) RETURNS BIGINT LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE v_current BIGINT; v_new BIGINT;
BEGIN
  PERFORM tenx_lock_thread(p_thread, p_user, p_isolate);
  SELECT COALESCE(MAX(version), 0) INTO v_current FROM states WHERE thread_id = p_thread{{ID}};
  IF v_current <> p_expected THEN
    RAISE EXCEPTION 'stale state' USING ERRCODE = 'TX001', DETAIL = p_expected || ',' || v_current;
  END IF;
  v_new := v_current + 1;
  INSERT INTO states (thread_id, version, state_data) VALUES (p_thread{{ID}}, v_new, p_state);
  IF p_history > 0 THEN
    DELETE FROM states WHERE thread_id = p_thread{{ID}} AND version <= v_new - p_history;
  END IF;
  IF p_replace THEN
    DELETE FROM messages WHERE thread_id = p_thread{{ID}};
  END IF;
  PERFORM tenx_upsert_messages(p_thread, p_messages);
  UPDATE threads SET updated_at = NOW() WHERE thread_id = p_thread{{ID}};
  RETURN v_new;
END $fn$;
