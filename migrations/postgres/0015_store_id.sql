-- Ours: an id of this database and schema, made once and never changed. Redis keys carry it, so
-- two stores sharing one Redis (two services, or two schemas, with the same thread ids) never
-- read or clear each other's entries. Idempotent.

CREATE TABLE IF NOT EXISTS tenx_store (
  only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
  store_id TEXT NOT NULL DEFAULT md5(random()::text || clock_timestamp()::text || txid_current()::text)
);
INSERT INTO tenx_store DEFAULT VALUES ON CONFLICT DO NOTHING;
