-- tenxgraph SQLite schema v3: fencing tokens from one counter for the whole file, so a lease row
-- nobody holds can go with its thread. Until v2 a token was its row's last one plus one and the
-- row was kept for ever: deleted with the thread, a reused thread id would have started again at
-- 1 and handed a new run the token a stalled run of the old thread might still hold. The counter
-- starts above every token already handed out.
CREATE TABLE IF NOT EXISTS lease_tokens (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
INSERT OR IGNORE INTO lease_tokens (id, last) VALUES (1, (SELECT COALESCE(MAX(token), 0) FROM leases));
