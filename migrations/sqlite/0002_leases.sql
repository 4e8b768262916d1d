-- tenxgraph SQLite schema v2: thread leases with fencing tokens (one writer per thread).
-- Not tied to the thread row: a lease is taken before the thread's first write, and its token
-- must keep rising even if the thread is deleted and reused.
CREATE TABLE IF NOT EXISTS leases (
    thread_id   TEXT PRIMARY KEY,
    token       INTEGER NOT NULL,
    holder      TEXT NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER NOT NULL,
    pid_start   INTEGER NOT NULL,
    expires_at  REAL NOT NULL,
    released    INTEGER NOT NULL DEFAULT 0,
    acquired_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_tool_executions_created ON tool_executions(created_at);
