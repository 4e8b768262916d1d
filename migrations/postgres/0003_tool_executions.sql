-- Version 3, as 10xGraph 0.10 creates it: the tool ledger, one row per recorded call.
CREATE TABLE IF NOT EXISTS tool_executions (
  thread_id {{ID_COLUMN}} NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
  tool_call_id VARCHAR(255) NOT NULL,
  result JSONB NOT NULL,
  created_at TIMESTAMPTZ DEFAULT NOW(),
  PRIMARY KEY (thread_id, tool_call_id)
);
