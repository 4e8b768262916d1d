-- Version 2, as 10xGraph 0.10 creates it: a version number per state row, unique per thread.
ALTER TABLE states ADD COLUMN IF NOT EXISTS version BIGINT NOT NULL DEFAULT 0;
UPDATE states st SET version = r.rn FROM (
  SELECT state_id, ROW_NUMBER() OVER (PARTITION BY thread_id ORDER BY created_at, state_id) AS rn FROM states
) r WHERE st.state_id = r.state_id AND st.version = 0;
CREATE INDEX IF NOT EXISTS idx_states_thread_version ON states(thread_id, version DESC);
DO $$ BEGIN
  ALTER TABLE states ADD CONSTRAINT uq_states_thread_version UNIQUE (thread_id, version);
EXCEPTION WHEN duplicate_object OR duplicate_table THEN NULL; END $$;
