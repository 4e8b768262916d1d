//! Postgres schema: 10xGraph's versions 1-3, then ours, applied in one transaction under an
//! advisory lock so two processes starting at once apply each step exactly once. A database that
//! 10xGraph 0.10 created (at v1, v2 or v3) is upgraded in place.

use crate::store::{StoreError, StoreResult};
use sqlx::{AssertSqlSafe, PgPool};

/// 10xGraph's lock key (ASCII "AGNTFLW!"), so we also serialise against its own migrator.
const LOCK_KEY: i64 = 0x4147_4E54_464C_5721;
pub const CURRENT_VERSION: i32 = 8;

/// `[a-zA-Z_][a-zA-Z0-9_]*`, at most 63 bytes: the only text ever spliced into SQL.
pub fn validate_schema(schema: &str) -> StoreResult<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok { Ok(()) } else { Err(StoreError::InvalidInput(format!("invalid schema name {schema:?}"))) }
}

fn v1(s: &str) -> String {
    format!(
        r#"
DO $$ BEGIN
  CREATE TYPE {s}.message_role AS ENUM ('user', 'assistant', 'system', 'tool');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
CREATE TABLE IF NOT EXISTS {s}.threads (
  thread_id VARCHAR(255) PRIMARY KEY,
  thread_name VARCHAR(255),
  user_id VARCHAR(255) NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  meta JSONB DEFAULT '{{}}'::jsonb
);
CREATE TABLE IF NOT EXISTS {s}.states (
  state_id SERIAL PRIMARY KEY,
  thread_id VARCHAR(255) NOT NULL REFERENCES {s}.threads(thread_id) ON DELETE CASCADE,
  state_data JSONB NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  meta JSONB DEFAULT '{{}}'::jsonb
);
CREATE TABLE IF NOT EXISTS {s}.messages (
  message_id VARCHAR(255) PRIMARY KEY,
  thread_id VARCHAR(255) NOT NULL REFERENCES {s}.threads(thread_id) ON DELETE CASCADE,
  role {s}.message_role NOT NULL,
  content TEXT,
  tool_calls JSONB,
  tool_call_id VARCHAR(255),
  reasoning TEXT,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  total_tokens INT DEFAULT 0,
  usages JSONB DEFAULT '{{}}'::jsonb,
  meta JSONB DEFAULT '{{}}'::jsonb
);
CREATE INDEX IF NOT EXISTS idx_threads_user_id ON {s}.threads(user_id);
CREATE INDEX IF NOT EXISTS idx_states_thread_id ON {s}.states(thread_id);
CREATE INDEX IF NOT EXISTS idx_messages_thread_id ON {s}.messages(thread_id);
"#
    )
}

fn v2(s: &str) -> String {
    format!(
        r#"
ALTER TABLE {s}.states ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;
UPDATE {s}.states st SET version = r.rn FROM (
  SELECT state_id, ROW_NUMBER() OVER (PARTITION BY thread_id ORDER BY created_at, state_id) AS rn FROM {s}.states
) r WHERE st.state_id = r.state_id AND st.version = 0;
CREATE INDEX IF NOT EXISTS idx_states_thread_version ON {s}.states(thread_id, version DESC);
DO $$ BEGIN
  ALTER TABLE {s}.states ADD CONSTRAINT uq_states_thread_version UNIQUE (thread_id, version);
EXCEPTION WHEN duplicate_object OR duplicate_table THEN NULL; END $$;
"#
    )
}

fn v3(s: &str) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {s}.tool_executions (
  thread_id VARCHAR(255) NOT NULL REFERENCES {s}.threads(thread_id) ON DELETE CASCADE,
  tool_call_id VARCHAR(255) NOT NULL,
  result JSONB NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  PRIMARY KEY (thread_id, tool_call_id)
);
"#
    )
}

/// Ours: message order and exact JSON, a cache table for running without Redis, and the step and
/// ledger writes as functions, so a durable step is one round trip.
fn v4(s: &str) -> String {
    format!(
        r#"
ALTER TABLE {s}.messages ADD COLUMN IF NOT EXISTS seq BIGINT;
ALTER TABLE {s}.messages ADD COLUMN IF NOT EXISTS message_data JSONB;
UPDATE {s}.messages m SET seq = r.rn FROM (
  SELECT message_id, ROW_NUMBER() OVER (ORDER BY created_at, message_id) AS rn FROM {s}.messages
) r WHERE m.message_id = r.message_id AND m.seq IS NULL;
CREATE SEQUENCE IF NOT EXISTS {s}.messages_seq_seq OWNED BY {s}.messages.seq;
SELECT setval('{s}.messages_seq_seq', GREATEST((SELECT COALESCE(MAX(seq), 0) FROM {s}.messages), 1));
ALTER TABLE {s}.messages ALTER COLUMN seq SET DEFAULT nextval('{s}.messages_seq_seq');
CREATE INDEX IF NOT EXISTS idx_messages_thread_seq ON {s}.messages(thread_id, seq);
CREATE TABLE IF NOT EXISTS {s}.tenx_cache (
  namespace TEXT NOT NULL,
  key TEXT NOT NULL,
  value JSONB NOT NULL,
  expires_at TIMESTAMPTZ,
  PRIMARY KEY (namespace, key)
);

-- Ensures the thread row, locks it and checks the owner. Returns the owner.
CREATE OR REPLACE FUNCTION {s}.tenx_lock_thread(p_thread TEXT, p_user TEXT, p_isolate BOOLEAN)
RETURNS VOID LANGUAGE plpgsql AS $fn$
DECLARE v_owner TEXT;
BEGIN
  INSERT INTO {s}.threads (thread_id, user_id) VALUES (p_thread, p_user) ON CONFLICT (thread_id) DO NOTHING;
  SELECT user_id INTO v_owner FROM {s}.threads WHERE thread_id = p_thread FOR UPDATE;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
END $fn$;

-- Upserts messages (a JSON array, in order) into a thread; TX003 when an id belongs to another.
CREATE OR REPLACE FUNCTION {s}.tenx_upsert_messages(p_thread TEXT, p_messages JSONB)
RETURNS VOID LANGUAGE plpgsql AS $fn$
DECLARE v_count INT := jsonb_array_length(p_messages); v_written INT;
BEGIN
  IF v_count = 0 THEN RETURN; END IF;
  INSERT INTO {s}.messages AS m (message_id, thread_id, role, content, tool_calls, reasoning, usages, meta, message_data)
  SELECT e.value->>'message_id', p_thread, (e.value->>'role')::{s}.message_role, (e.value->'content')::text,
         e.value->'tools_calls', e.value->>'reasoning', COALESCE(e.value->'usages', '{{}}'::jsonb),
         COALESCE(e.value->'metadata', '{{}}'::jsonb), e.value
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
CREATE OR REPLACE FUNCTION {s}.tenx_put_step(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN
) RETURNS BIGINT LANGUAGE plpgsql AS $fn$
DECLARE v_current BIGINT; v_new BIGINT;
BEGIN
  PERFORM {s}.tenx_lock_thread(p_thread, p_user, p_isolate);
  SELECT COALESCE(MAX(version), 0) INTO v_current FROM {s}.states WHERE thread_id = p_thread;
  IF v_current <> p_expected THEN
    RAISE EXCEPTION 'stale state' USING ERRCODE = 'TX001', DETAIL = p_expected || ',' || v_current;
  END IF;
  v_new := v_current + 1;
  INSERT INTO {s}.states (thread_id, version, state_data) VALUES (p_thread, v_new, p_state);
  IF p_history > 0 THEN
    DELETE FROM {s}.states WHERE thread_id = p_thread AND version <= v_new - p_history;
  END IF;
  IF p_replace THEN
    DELETE FROM {s}.messages WHERE thread_id = p_thread;
  END IF;
  PERFORM {s}.tenx_upsert_messages(p_thread, p_messages);
  UPDATE {s}.threads SET updated_at = NOW() WHERE thread_id = p_thread;
  RETURN v_new;
END $fn$;
"#
    )
}

/// Ours: thread leases with fencing tokens, intent records in the ledger, and the fenced versions
/// of the step and ledger writes. Every fenced write takes the lease row FOR SHARE, so it and a
/// takeover (which updates that row) are serialised: a takeover either sees the write committed or
/// the write sees the new token and raises TX004.
fn v5(s: &str) -> String {
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {s}.tenx_leases (
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
CREATE INDEX IF NOT EXISTS idx_tool_executions_created ON {s}.tool_executions(created_at);

CREATE OR REPLACE FUNCTION {s}.tenx_check_fence(p_thread TEXT, p_fence BIGINT)
RETURNS VOID LANGUAGE plpgsql AS $fn$
DECLARE v_token BIGINT;
BEGIN
  IF p_fence IS NULL THEN RETURN; END IF;
  SELECT token INTO v_token FROM {s}.tenx_leases WHERE thread_id = p_thread FOR SHARE;
  IF v_token IS DISTINCT FROM p_fence THEN
    RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
  END IF;
END $fn$;

-- The fenced step; p_release frees the lease in the same transaction (the run's last commit).
CREATE OR REPLACE FUNCTION {s}.tenx_put_step(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_fence BIGINT, p_release BOOLEAN
) RETURNS BIGINT LANGUAGE plpgsql AS $fn$
DECLARE v_new BIGINT;
BEGIN
  PERFORM {s}.tenx_check_fence(p_thread, p_fence);
  v_new := {s}.tenx_put_step(p_thread, p_user, p_expected, p_state, p_messages, p_replace, p_history, p_isolate);
  IF p_release AND p_fence IS NOT NULL THEN
    UPDATE {s}.tenx_leases SET released = TRUE, expires_at = clock_timestamp()
    WHERE thread_id = p_thread AND token = p_fence;
  END IF;
  RETURN v_new;
END $fn$;

-- Ledger rows in one round trip: the first result wins; an intent record ('started') goes only
-- where no row exists, and a result replaces an intent. Returns the rows written.
CREATE OR REPLACE FUNCTION {s}.tenx_ledger_put(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_results JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql AS $fn$
DECLARE v_written INT;
BEGIN
  PERFORM {s}.tenx_check_fence(p_thread, p_fence);
  PERFORM {s}.tenx_lock_thread(p_thread, p_user, p_isolate);
  INSERT INTO {s}.tool_executions AS l (thread_id, tool_call_id, result)
  SELECT p_thread, k, r FROM UNNEST(p_keys, p_results) AS u(k, r)
  ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET result = EXCLUDED.result, created_at = NOW()
  WHERE l.result->>'__kind__' = 'started' AND EXCLUDED.result->>'__kind__' IS DISTINCT FROM 'started';
  GET DIAGNOSTICS v_written = ROW_COUNT;
  RETURN v_written;
END $fn$;

CREATE OR REPLACE FUNCTION {s}.tenx_lease_acquire(
  p_thread TEXT, p_holder TEXT, p_host TEXT, p_pid BIGINT, p_pid_start BIGINT, p_ttl FLOAT8, p_steal BIGINT
) RETURNS TABLE (acquired BOOLEAN, token BIGINT, holder TEXT, host TEXT, pid BIGINT, pid_start BIGINT,
                 expires_in FLOAT8, released BOOLEAN)
LANGUAGE plpgsql AS $fn$
DECLARE r {s}.tenx_leases%ROWTYPE; v_now TIMESTAMPTZ := clock_timestamp();
BEGIN
  INSERT INTO {s}.tenx_leases AS l (thread_id, token, holder, host, pid, pid_start, expires_at, released)
  VALUES (p_thread, 0, '', '', 0, 0, v_now, TRUE) ON CONFLICT (thread_id) DO NOTHING;
  SELECT * INTO r FROM {s}.tenx_leases l WHERE l.thread_id = p_thread FOR UPDATE;
  IF r.released OR r.expires_at <= v_now OR r.token = p_steal THEN
    UPDATE {s}.tenx_leases l SET token = r.token + 1, holder = p_holder, host = p_host, pid = p_pid,
      pid_start = p_pid_start, expires_at = v_now + make_interval(secs => p_ttl), released = FALSE,
      acquired_at = v_now
    WHERE l.thread_id = p_thread;
    RETURN QUERY SELECT TRUE, r.token + 1, p_holder, p_host, p_pid, p_pid_start, p_ttl, FALSE;
  ELSE
    RETURN QUERY SELECT FALSE, r.token, r.holder, r.host, r.pid, r.pid_start,
      EXTRACT(EPOCH FROM r.expires_at - v_now)::FLOAT8, r.released;
  END IF;
END $fn$;
"#
    )
}

/// The fence check, spliced into each fenced function rather than called: a nested call is what
/// cost the time. Table aliases keep it unambiguous inside functions whose RETURNS TABLE columns
/// share names with the tables.
fn fence_sql(s: &str) -> String {
    format!(
        "  IF p_fence IS NOT NULL THEN
    SELECT l.token INTO v_token FROM {s}.tenx_leases l WHERE l.thread_id = p_thread FOR SHARE;
    IF v_token IS DISTINCT FROM p_fence THEN
      RAISE EXCEPTION 'lease superseded' USING ERRCODE = 'TX004', DETAIL = p_fence || ',' || COALESCE(v_token::text, '');
    END IF;
  END IF;
"
    )
}

/// After a statement that locked the thread row and read its owner into v_owner, or found none.
fn owner_check_sql(s: &str) -> String {
    format!(
        "  IF NOT FOUND THEN
    INSERT INTO {s}.threads (thread_id, user_id) VALUES (p_thread, p_user) ON CONFLICT (thread_id) DO NOTHING;
    SELECT th.user_id INTO v_owner FROM {s}.threads th WHERE th.thread_id = p_thread FOR UPDATE;
  END IF;
  IF p_isolate AND v_owner IS DISTINCT FROM p_user THEN
    RAISE EXCEPTION 'thread % belongs to another user', p_thread USING ERRCODE = 'TX002';
  END IF;
"
    )
}

/// The thread row locked and its owner checked, for the ledger functions.
fn lock_for_ledger_sql(s: &str) -> String {
    format!(
        "  SELECT th.user_id INTO v_owner FROM {s}.threads th WHERE th.thread_id = p_thread FOR UPDATE;\n{}",
        owner_check_sql(s)
    )
}

/// Ours: the fenced step and ledger writes as one plpgsql body each. Same statements and the same
/// errors as v4/v5, less overhead: each nested PERFORM of a helper function cost 25-40 us on the
/// server (bench/profile_pg.py --nested), four of them per step; and the thread row is locked,
/// owner-checked and stamped by one UPDATE ... RETURNING instead of an INSERT ... ON CONFLICT, a
/// SELECT ... FOR UPDATE and a later UPDATE (a new thread still takes the insert path). The UPDATE
/// takes a lock that conflicts with every other writer of the row, as FOR UPDATE did, and lets
/// foreign-key checks (FOR KEY SHARE) through.
fn v6(s: &str) -> String {
    let (fence, owner_check, lock_for_ledger) = (fence_sql(s), owner_check_sql(s), lock_for_ledger_sql(s));
    format!(
        r#"
CREATE OR REPLACE FUNCTION {s}.tenx_put_step(
  p_thread TEXT, p_user TEXT, p_expected BIGINT, p_state JSONB, p_messages JSONB,
  p_replace BOOLEAN, p_history INT, p_isolate BOOLEAN, p_fence BIGINT, p_release BOOLEAN, p_prev_mark TEXT
) RETURNS BIGINT LANGUAGE plpgsql AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_current BIGINT; v_new BIGINT; v_prev_mark TEXT;
  v_count INT := jsonb_array_length(p_messages); v_written INT;
BEGIN
{fence}  UPDATE {s}.threads SET updated_at = NOW() WHERE thread_id = p_thread RETURNING user_id INTO v_owner;
{owner_check}  SELECT st.version, st.state_data->'__state_meta__'->>'write' INTO v_current, v_prev_mark
  FROM {s}.states st WHERE st.thread_id = p_thread ORDER BY st.version DESC, st.state_id DESC LIMIT 1;
  v_current := COALESCE(v_current, 0);
  IF v_current <> p_expected THEN
    RAISE EXCEPTION 'stale state' USING ERRCODE = 'TX001', DETAIL = p_expected || ',' || v_current;
  END IF;
  v_new := v_current + 1;
  -- The run's mark is kept only while the latest row still carries the mark the run last saw
  -- (store::chained_state): messages changed under the run make this commit unmarked.
  IF (p_state->'__state_meta__') ? 'write' AND v_prev_mark IS DISTINCT FROM p_prev_mark THEN
    p_state := p_state #- '{{__state_meta__,write}}';
  END IF;
  INSERT INTO {s}.states (thread_id, version, state_data) VALUES (p_thread, v_new, p_state);
  IF p_history > 0 THEN
    DELETE FROM {s}.states WHERE thread_id = p_thread AND version <= v_new - p_history;
  END IF;
  IF p_replace THEN
    DELETE FROM {s}.messages WHERE thread_id = p_thread;
  END IF;
  IF v_count > 0 THEN
    INSERT INTO {s}.messages AS m (message_id, thread_id, role, content, tool_calls, reasoning, usages, meta, message_data)
    SELECT e.value->>'message_id', p_thread, (e.value->>'role')::{s}.message_role, (e.value->'content')::text,
           e.value->'tools_calls', e.value->>'reasoning', COALESCE(e.value->'usages', '{{}}'::jsonb),
           COALESCE(e.value->'metadata', '{{}}'::jsonb), e.value
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
    UPDATE {s}.tenx_leases SET released = TRUE, expires_at = clock_timestamp()
    WHERE thread_id = p_thread AND token = p_fence;
  END IF;
  RETURN v_new;
END $fn$;

CREATE OR REPLACE FUNCTION {s}.tenx_ledger_put(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_results JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_written INT;
BEGIN
{fence}{lock_for_ledger}  INSERT INTO {s}.tool_executions AS l (thread_id, tool_call_id, result)
  SELECT p_thread, k, r FROM UNNEST(p_keys, p_results) AS u(k, r)
  ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET result = EXCLUDED.result, created_at = NOW()
  WHERE l.result->>'__kind__' = 'started' AND EXCLUDED.result->>'__kind__' IS DISTINCT FROM 'started';
  GET DIAGNOSTICS v_written = ROW_COUNT;
  RETURN v_written;
END $fn$;

-- The start of a tool node in one round trip: the rows already recorded for p_keys (read before
-- the insert: a data-modifying CTE does not see its own rows) and an intent record for each key
-- without a row.
CREATE OR REPLACE FUNCTION {s}.tenx_ledger_begin(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_intents JSONB[], p_fence BIGINT
) RETURNS TABLE (tool_call_id TEXT, result JSONB) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE v_token BIGINT; v_owner TEXT;
BEGIN
{fence}{lock_for_ledger}  RETURN QUERY
    WITH found AS (
      SELECT x.tool_call_id::TEXT AS k, x.result AS r FROM {s}.tool_executions x
      WHERE x.thread_id = p_thread AND x.tool_call_id = ANY(p_keys)
    ), written AS (
      INSERT INTO {s}.tool_executions AS l (thread_id, tool_call_id, result)
      SELECT p_thread, u.k, u.r FROM UNNEST(p_keys, p_intents) AS u(k, r)
      ON CONFLICT (thread_id, tool_call_id) DO NOTHING
      RETURNING 1
    )
    SELECT f.k, f.r FROM found f;
END $fn$;
"#
    )
}

/// Ours: paused calls and 10xGraph's old-format ledger keys. `tenx_ledger_mark` replaces intent
/// records with intent records only (a call marked paused at `interrupt()`, or started again on
/// resume); `tenx_ledger_begin` gains `p_read`, keys read along with the node's own but never
/// written (the `"<message id>:<call id>"` rows a 10xGraph 0.10 database holds).
fn v7(s: &str) -> String {
    let (fence, lock_for_ledger) = (fence_sql(s), lock_for_ledger_sql(s));
    format!(
        r#"
CREATE OR REPLACE FUNCTION {s}.tenx_ledger_mark(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_marks JSONB[], p_fence BIGINT
) RETURNS INT LANGUAGE plpgsql AS $fn$
DECLARE v_token BIGINT; v_owner TEXT; v_written INT;
BEGIN
{fence}{lock_for_ledger}  UPDATE {s}.tool_executions x SET result = u.r, created_at = NOW()
  FROM UNNEST(p_keys, p_marks) AS u(k, r)
  WHERE x.thread_id = p_thread AND x.tool_call_id = u.k
    AND x.result->>'__kind__' = 'started' AND u.r->>'__kind__' = 'started';
  GET DIAGNOSTICS v_written = ROW_COUNT;
  RETURN v_written;
END $fn$;

CREATE OR REPLACE FUNCTION {s}.tenx_ledger_begin(
  p_thread TEXT, p_user TEXT, p_isolate BOOLEAN, p_keys TEXT[], p_intents JSONB[], p_fence BIGINT, p_read TEXT[]
) RETURNS TABLE (tool_call_id TEXT, result JSONB) LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE v_token BIGINT; v_owner TEXT;
BEGIN
{fence}{lock_for_ledger}  RETURN QUERY
    WITH found AS (
      SELECT x.tool_call_id::TEXT AS k, x.result AS r FROM {s}.tool_executions x
      WHERE x.thread_id = p_thread AND (x.tool_call_id = ANY(p_keys) OR x.tool_call_id = ANY(p_read))
    ), written AS (
      INSERT INTO {s}.tool_executions AS l (thread_id, tool_call_id, result)
      SELECT p_thread, u.k, u.r FROM UNNEST(p_keys, p_intents) AS u(k, r)
      ON CONFLICT (thread_id, tool_call_id) DO NOTHING
      RETURNING 1
    )
    SELECT f.k, f.r FROM found f;
END $fn$;
"#
    )
}

/// Applies every missing version. Idempotent; concurrent callers wait on the advisory lock.
pub async fn migrate(pool: &PgPool, schema: &str) -> StoreResult<()> {
    validate_schema(schema)?;
    let err = |e: sqlx::Error| StoreError::Schema(e.to_string());
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(LOCK_KEY).execute(&mut *tx).await.map_err(err)?;
    let setup = format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}; CREATE TABLE IF NOT EXISTS {schema}.schema_version \
         (version INT PRIMARY KEY, applied_at TIMESTAMPTZ DEFAULT NOW())"
    );
    sqlx::raw_sql(AssertSqlSafe(setup)).execute(&mut *tx).await.map_err(err)?;
    let current: i32 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COALESCE(MAX(version), 0) FROM {schema}.schema_version")))
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    let steps: [(i32, fn(&str) -> String); 8] =
        [(1, v1), (2, v2), (3, v3), (4, v4), (5, v5), (6, v6), (7, v7), (8, super::input_lease::v8)];
    for (version, sql) in steps {
        if version <= current {
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(sql(schema))).execute(&mut *tx).await.map_err(|e| {
            StoreError::Schema(format!("migration to version {version} failed: {e}"))
        })?;
        sqlx::query(AssertSqlSafe(format!("INSERT INTO {schema}.schema_version (version) VALUES ($1) ON CONFLICT DO NOTHING")))
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
    }
    tx.commit().await.map_err(err)
}
