-- tenxgraph SQLite schema v1. Messages live in their own rows so a step writes only what it added.
CREATE TABLE IF NOT EXISTS threads (
    thread_id   TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL,
    thread_name TEXT,
    meta        TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_threads_user_id ON threads(user_id);

CREATE TABLE IF NOT EXISTS states (
    thread_id  TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
    version    INTEGER NOT NULL,
    state_data TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (thread_id, version)
);

CREATE TABLE IF NOT EXISTS messages (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id    TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
    message_id   TEXT NOT NULL,
    message_data TEXT NOT NULL,
    created_at   REAL NOT NULL,
    UNIQUE (thread_id, message_id)
);

CREATE TABLE IF NOT EXISTS tool_executions (
    thread_id    TEXT NOT NULL REFERENCES threads(thread_id) ON DELETE CASCADE,
    tool_call_id TEXT NOT NULL,
    result       TEXT NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (thread_id, tool_call_id)
);

CREATE TABLE IF NOT EXISTS cache (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    expires_at REAL,
    PRIMARY KEY (namespace, key)
);
