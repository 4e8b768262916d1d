-- Version 1, as 10xGraph 0.10 creates it: threads, their state rows and their messages.
-- Every migration runs with search_path set to the configured schema only (src/store/postgres/
-- migrations.rs), so unqualified names land there; each function pins that path (its SET
-- clause) so it resolves the same tables whatever the caller's path is.
DO $$ BEGIN
  CREATE TYPE message_role AS ENUM ('user', 'assistant', 'system', 'tool');
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
CREATE TABLE IF NOT EXISTS threads (
  thread_id {{ID_COLUMN}} PRIMARY KEY,
  thread_name VARCHAR(255),
  user_id {{USER_ID_COLUMN}} NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  meta JSONB DEFAULT '{}'::jsonb
);
CREATE TABLE IF NOT EXISTS states (
  state_id SERIAL PRIMARY KEY,
  thread_id {{ID_COLUMN}} NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
  state_data JSONB NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  meta JSONB DEFAULT '{}'::jsonb
);
CREATE TABLE IF NOT EXISTS messages (
  message_id {{ID_COLUMN}} PRIMARY KEY,
  thread_id {{ID_COLUMN}} NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
  role message_role NOT NULL,
  content TEXT,
  tool_calls JSONB,
  tool_call_id VARCHAR(255),
  reasoning TEXT,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  updated_at TIMESTAMPTZ DEFAULT NOW(),
  total_tokens INT DEFAULT 0,
  usages JSONB DEFAULT '{}'::jsonb,
  meta JSONB DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS idx_threads_user_id ON threads(user_id);
CREATE INDEX IF NOT EXISTS idx_states_thread_id ON states(thread_id);
CREATE INDEX IF NOT EXISTS idx_messages_thread_id ON messages(thread_id);
