//! Retention on PostgreSQL, in batches. Each rule walks its table in key order, a window of rows
//! per statement (keyset: each window starts after the last key of the one before), deletes what
//! qualifies in the window and commits: the row locks a batch takes last as long as that batch (a
//! live thread's step that trims its own history, or a new turn on a finished thread, waits for
//! one batch, not for the whole prune, which on a large database may rightly take minutes), and
//! each statement reads at most a window of rows, whatever share of them qualifies, so every row
//! is read once and a batch's time does not grow with the table. A dry run runs the same batches
//! in one transaction and rolls it back, so what it reports is exactly what the real run removes
//! at that moment (rules that follow see what earlier ones deleted, in both). Which threads are
//! finished is decided per candidate row by index lookups. The numbers of a rule are bind
//! parameters.

use super::pooled::Tx;
use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{PruneReport, PruneRules, StoreResult, ThreadRef};

/// Rows read per batch: old state versions and ledger rows are small; a thread takes its
/// messages, states and ledger rows with it (by cascade), so fewer of those per batch.
const ROWS_PER_BATCH: i64 = 2000;
const THREADS_PER_BATCH: i64 = 100;

/// Each rule's statement twice: for the first window (no key to start after) and for the next
/// ones (`$3`, `$4`: the key). One statement with `$3 IS NULL OR key > $3` would be planned
/// without the key's index range.
pub(super) struct Stmts {
    states: [Stmt; 2],
    threads: [Stmt; 2],
    threads_delete: Stmt,
    ledger: [Stmt; 2],
    cache: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let (id, tt, ut) = (c.id, c.id_text, c.user_text);
        // A test of the latest state row (`st`) of the thread of row `x`; false without one.
        let latest = |x: &str, test: &str| {
            format!(
                "COALESCE((SELECT {test} FROM {s}.states st WHERE st.thread_id = {x}.thread_id \
                   ORDER BY st.version DESC LIMIT 1), FALSE)"
            )
        };
        let completed = "st.state_data->'execution_meta'->>'status' = 'completed'";
        // The thread of row `x` is completed (by its latest state) and not leased: the only
        // threads prune touches. A 10xGraph run may live in its Redis entry alone, the finished
        // turn's row latest (its ledger deleted, a resume fired its tools again; red-team, session
        // 42), so Redis is asked twice:
        // - `$h` (text[]): the threads whose 10xGraph entries (any user's) showed a run under way
        //   in a scan at the prune's start, which are not finished whoever wrote their latest row
        //   (a first turn's entry that lingers after our resume finished it is taken again by the
        //   thread's `{}`; a thread run by another user, isolation off, has its entry under that
        //   user's key); NULL when Redis could not be scanned, and then no thread whose latest row
        //   10xGraph wrote (`theirs`) counts;
        // - `$c` (text[], with `clear`): of the threads whose latest row is theirs, those whose
        //   entry this batch read by key, right before its delete, and found no run under way in:
        //   the scan missed a turn a live 10xGraph worker began later on a thread finished long ago
        //   (its turn does not touch `threads.updated_at`), and the thread went with the turn's
        //   user message (red-team, session 43). Without `clear` such a thread counts (a
        //   candidate, whose entry the batch then reads).
        // Nor does a thread count whose latest row 10xGraph wrote and whose ledger holds a row
        // newer than it, Redis or not: a turn under way past that row recorded a tool (10xGraph
        // records each result in its own transaction, before the turn's row).
        let finished = |x: &str, h: u8, clear: Option<u8>| {
            let asked = clear
                .map(|c| format!(" AND (NOT st.state_data ? 'context' OR st.thread_id{tt} = ANY(${c}::text[]))"))
                .unwrap_or_default();
            let row = latest(
                x,
                &format!(
                    "{completed} AND (${h}::text[] IS NOT NULL OR NOT st.state_data ? 'context') \
                     AND NOT (st.state_data ? 'context' AND EXISTS (SELECT 1 FROM {s}.tool_executions xn \
                       WHERE xn.thread_id = st.thread_id AND xn.created_at > st.created_at)){asked}"
                ),
            );
            format!(
                "{row} AND NOT {x}.thread_id{tt} = ANY(COALESCE(${h}::text[], '{{}}')) \
                 AND NOT EXISTS (SELECT 1 FROM {s}.tenx_leases l WHERE l.thread_id = {x}.thread_id{tt} \
                   AND NOT l.released AND l.expires_at > clock_timestamp())"
            )
        };
        // The thread of row `x` is completed, its latest row 10xGraph's, and `$h` NULL: left only
        // because Redis could not be scanned (for the report's `legacy_unchecked`).
        let unscanned = |x: &str, h: u8| {
            let row = latest(x, &format!("{completed} AND st.state_data ? 'context'"));
            format!("CASE WHEN ${h}::text[] IS NULL THEN {row} ELSE FALSE END")
        };
        let theirs = |x: &str| latest(x, "st.state_data ? 'context'");
        // Each statement returns: the rows its window read, the rows it deleted, the ledger rows
        // that went with deleted threads, and the window's last key (as text; NULL when empty);
        // the thread and ledger rules' differ where said.
        // $1: the rule's number; $2: the window; $3 (and $4): the key the window starts after.
        // `f` gets the window's start and the number of the statement's last parameter (the
        // first window has no key to bind).
        let both = |f: &dyn Fn(&str, u8) -> String, next: &str, keys: u8| {
            [Stmt::new(f("TRUE", 3)), Stmt::new(f(next, 3 + keys))]
        };
        Stmts {
            // $1: versions to keep (at least 1: the latest always stays).
            states: both(
                &|after, _| {
                    format!(
                        "WITH w AS (SELECT st.state_id, st.thread_id, st.version FROM {s}.states st \
                   WHERE {after} ORDER BY st.state_id LIMIT $2::int8), \
                 v AS (SELECT w.state_id FROM w WHERE w.version <= \
                   (SELECT MAX(s2.version) FROM {s}.states s2 WHERE s2.thread_id = w.thread_id) - $1::int8), \
                 d AS (DELETE FROM {s}.states WHERE state_id = ANY(ARRAY(SELECT state_id FROM v)) RETURNING 1) \
                 SELECT (SELECT COUNT(*) FROM w), (SELECT COUNT(*) FROM d), 0::int8, (SELECT MAX(state_id)::text FROM w), NULL::text"
                    )
                },
                "st.state_id > $3::text::int8",
                1,
            ),
            // The thread rule is two statements in the batch's transaction. This one chooses
            // ($1: seconds) and locks, never waiting: the chosen threads' lease rows first (the
            // order a run's input commit takes them in: the other order deadlocked with it), then
            // their thread rows, each `SKIP LOCKED` (a thread a run is writing is busy, not
            // finished). A thread whose lease row exists but was skipped is left. It returns the
            // rows the window read, its last key, the locked threads' ids (as text), the ids and
            // users of those whose latest row 10xGraph wrote (their entries are read next), and
            // whether a thread old enough was left `unscanned`.
            threads: both(
                &|after, h| {
                    format!(
                        "WITH w AS (SELECT t.thread_id, t.updated_at FROM {s}.threads t \
                   WHERE {after} ORDER BY t.thread_id LIMIT $2::int8), \
                 v AS (SELECT w.thread_id FROM w \
                   WHERE w.updated_at < clock_timestamp() - make_interval(secs => $1::float8) AND {}), \
                 lk AS (SELECT l.thread_id FROM {s}.tenx_leases l \
                   WHERE l.thread_id IN (SELECT thread_id{tt} FROM v) ORDER BY l.thread_id FOR UPDATE SKIP LOCKED), \
                 th AS (SELECT t.thread_id, t.user_id FROM {s}.threads t WHERE t.thread_id IN (SELECT thread_id FROM v) \
                   AND (t.thread_id{tt} IN (SELECT thread_id FROM lk) \
                     OR NOT EXISTS (SELECT 1 FROM {s}.tenx_leases l2 WHERE l2.thread_id = t.thread_id{tt})) \
                   ORDER BY t.thread_id FOR UPDATE SKIP LOCKED), \
                 ask AS (SELECT th.thread_id, th.user_id FROM th WHERE {}) \
                 SELECT (SELECT COUNT(*) FROM w), (SELECT MAX(thread_id){tt} FROM w), ARRAY(SELECT thread_id{tt} FROM th), \
                   ARRAY(SELECT thread_id{tt} FROM ask ORDER BY thread_id), ARRAY(SELECT user_id{ut} FROM ask ORDER BY thread_id), \
                   EXISTS (SELECT 1 FROM w WHERE w.updated_at < clock_timestamp() - make_interval(secs => $1::float8) AND {})",
                        finished("w", h, None),
                        theirs("th"),
                        unscanned("w", h)
                    )
                },
                &format!("t.thread_id > $3::text{id}"),
                1,
            ),
            // The second: the locked threads judged again on a snapshot taken now ($1: their
            // ids, $2: seconds, $3: `$h`, $4: `$c`), then deleted. The first statement's snapshot
            // is older than its locks: a run that committed in between (a new turn that took the
            // lease, paused at an interrupt, or crashed mid-node, its state no longer completed)
            // was judged on rows it had not written yet, and such a thread was deleted under its
            // run (red-team, session 22). From the locks on, no run of ours can commit to these
            // threads (their input and step commits write the thread row or rows that reference
            // it), so this check is the last word. The ledger rows go by cascade at the end of the statement; the
            // count reads them from its snapshot, before they went.
            threads_delete: Stmt::new(format!(
                "WITH d AS (DELETE FROM {s}.threads t WHERE t.thread_id = ANY($1::text[]{id}[]) \
                   AND t.updated_at < clock_timestamp() - make_interval(secs => $2::float8) AND {} RETURNING t.thread_id, t.user_id), \
                 dl AS (DELETE FROM {s}.tenx_leases l WHERE l.thread_id IN (SELECT thread_id{tt} FROM d) \
                   AND (l.released OR l.expires_at <= clock_timestamp())) \
                 SELECT (SELECT COUNT(*) FROM d), \
                   (SELECT COUNT(*) FROM {s}.tool_executions x WHERE x.thread_id IN (SELECT thread_id FROM d)), \
                   ARRAY(SELECT thread_id{tt} FROM d), ARRAY(SELECT user_id{ut} FROM d)",
                finished("t", 3, Some(4))
            )),
            // $1: seconds. Runs after the thread rule, so rows that went with their thread are
            // not counted twice. Keyed by the primary key (thread_id, tool_call_id). Its last two
            // parameters: `$h`, `$c`. Run first with no thread of 10xGraph's clear, it also returns
            // the ids and users of those the window holds rows of that would go but for their
            // entries; with the ones found clear, the same window again. And whether rows were
            // left `unscanned`.
            ledger: both(
                &|after, h| {
                    let c = h + 1;
                    format!(
                        "WITH w AS (SELECT x.thread_id, x.tool_call_id, x.created_at, x.ctid AS c FROM {s}.tool_executions x \
                   WHERE {after} ORDER BY x.thread_id, x.tool_call_id LIMIT $2::int8), \
                 q AS (SELECT w.c, w.thread_id, {} AS theirs FROM w \
                   WHERE w.created_at < clock_timestamp() - make_interval(secs => $1::float8) AND {}), \
                 d AS (DELETE FROM {s}.tool_executions WHERE ctid = ANY(ARRAY(SELECT c FROM q \
                   WHERE NOT q.theirs OR q.thread_id{tt} = ANY(${c}::text[]))) RETURNING 1), \
                 ask AS (SELECT DISTINCT t.thread_id, t.user_id FROM q JOIN {s}.threads t ON t.thread_id = q.thread_id \
                   WHERE q.theirs AND NOT q.thread_id{tt} = ANY(${c}::text[])), \
                 last AS (SELECT thread_id{tt} AS t, tool_call_id::text AS k FROM w ORDER BY thread_id DESC, tool_call_id DESC LIMIT 1) \
                 SELECT (SELECT COUNT(*) FROM w), (SELECT COUNT(*) FROM d), (SELECT t FROM last), (SELECT k FROM last), \
                   ARRAY(SELECT thread_id{tt} FROM ask ORDER BY thread_id), ARRAY(SELECT user_id{ut} FROM ask ORDER BY thread_id), \
                   EXISTS (SELECT 1 FROM w WHERE w.created_at < clock_timestamp() - make_interval(secs => $1::float8) AND {})",
                        theirs("w"),
                        finished("w", h, None),
                        unscanned("w", h)
                    )
                },
                &format!("(x.thread_id, x.tool_call_id) > ($3::text{id}, $4::text)"),
                2,
            ),
            // $1: the window. Expired cache entries: reads skip them and nothing else removes
            // them. No key to walk: what a batch finds it deletes, so the next batch's scan of
            // the partial index on expires_at (version 13) starts past them. The last column is
            // non-NULL while a batch found something, so the loop goes on until one finds less
            // than a window.
            cache: Stmt::new(format!(
                "WITH d AS (DELETE FROM {s}.tenx_cache WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.tenx_cache \
                   WHERE expires_at IS NOT NULL AND expires_at <= clock_timestamp() LIMIT $1::int8)) RETURNING 1) \
                 SELECT (SELECT COUNT(*) FROM d), (SELECT COUNT(*) FROM d), 0::int8, \
                   CASE WHEN EXISTS (SELECT 1 FROM d) THEN '' END, NULL::text"
            )),
        }
    }
}

/// One rule, with its number: a batch reads a window of its table after `after` and reports
/// the rows it read, the rows it deleted (fewer than qualified when a live thread's own trim
/// deleted some first), the ledger rows of deleted threads, and the window's last key.
enum Batch {
    States(i64),
    Threads(f64),
    Ledger(f64),
    Cache,
}

/// What one batch reports (see `Batch`), as its statement returns it.
type Row = (i64, i64, i64, Option<String>, Option<String>);

/// What one batch reports (see `Batch`), and the threads it deleted (their Redis entries are
/// deleted after its commit).
struct Got {
    row: Row,
    /// Why threads of 10xGraph's were left unasked (no Redis given, or it did not answer).
    unchecked: Option<String>,
    gone: Vec<ThreadRef>,
}

impl From<Row> for Got {
    fn from(row: Row) -> Self {
        Got { row, unchecked: None, gone: Vec::new() }
    }
}

impl Batch {
    async fn run(
        &self,
        s: &PgStore,
        tx: &mut Tx,
        after: &(Option<String>, Option<String>),
        scan: &Scan,
    ) -> Result<Got, sqlx::Error> {
        let next = usize::from(after.0.is_some());
        let q = match *self {
            Batch::States(keep) => sqlx::query_as(s.sql.prune.states[next].q()).bind(keep),
            Batch::Threads(age) => return threads_batch(s, tx, after.0.as_deref(), next, age, scan).await,
            Batch::Ledger(ttl) => return ledger_batch(s, tx, after, next, ttl, scan).await,
            Batch::Cache => {
                let row: Row = sqlx::query_as(s.sql.prune.cache.q()).bind(self.size()).fetch_one(&mut **tx).await?;
                return Ok(row.into());
            }
        };
        let q = q.bind(self.size());
        let q = match &after.0 {
            None => q,
            Some(key) => q.bind(key.as_str()),
        };
        let row: Row = q.fetch_one(&mut **tx).await?;
        Ok(row.into())
    }

    fn size(&self) -> i64 {
        if matches!(self, Batch::Threads(_)) { THREADS_PER_BATCH } else { ROWS_PER_BATCH }
    }

    fn count(&self, report: &mut PruneReport, deleted: i64, ledger: i64) {
        match self {
            Batch::States(_) => report.state_versions += deleted as u64,
            Batch::Threads(_) => {
                report.threads += deleted as u64;
                report.ledger_rows += ledger as u64;
            }
            Batch::Ledger(_) => report.ledger_rows += deleted as u64,
            Batch::Cache => report.cache_entries += deleted as u64,
        }
    }
}

/// The thread rule's batch: choose and lock, read the entries of the locked threads of
/// 10xGraph's, then judge again and delete (see `Stmts::new`). The entries are read with the
/// threads locked, one bounded Redis call (a stalled Redis holds them for its answer timeout);
/// a thread of 10xGraph's is kept when the call fails.
async fn threads_batch(
    s: &PgStore,
    tx: &mut Tx,
    after: Option<&str>,
    next: usize,
    age: f64,
    scan: &Scan,
) -> Result<Got, sqlx::Error> {
    type Chosen = (i64, Option<String>, Vec<String>, Vec<String>, Vec<String>, bool);
    let q = sqlx::query_as(s.sql.prune.threads[next].q()).bind(age).bind(THREADS_PER_BATCH);
    let (read, last, locked, ids, users, unscanned): Chosen = match after {
        None => q,
        Some(key) => q.bind(key),
    }
    .bind(scan.held())
    .fetch_one(&mut **tx)
    .await?;
    let mut unchecked = scan.why(unscanned);
    if locked.is_empty() {
        return Ok(Got { row: (read, 0, 0, last, None), unchecked, gone: Vec::new() });
    }
    let (clear, why) = without_runs(s, ids, users).await;
    unchecked = unchecked.or(why);
    let (deleted, ledger, tids, uids): (i64, i64, Vec<String>, Vec<String>) =
        sqlx::query_as(s.sql.prune.threads_delete.q())
            .bind(&locked)
            .bind(age)
            .bind(scan.held())
            .bind(&clear)
            .fetch_one(&mut **tx)
            .await?;
    let gone = tids.into_iter().zip(uids).map(|(t, u)| ThreadRef::new(t, u)).collect();
    Ok(Got { row: (read, deleted, ledger, last, None), unchecked, gone })
}

/// The ledger rule's batch: the window with no thread of 10xGraph's clear; then, where the window
/// holds rows of such threads, their entries read and the window again with those found clear
/// (rows it deletes past the first window's end would go in the next batch anyway; the next
/// batch starts where the first window ended, so no row goes unjudged).
async fn ledger_batch(
    s: &PgStore,
    tx: &mut Tx,
    after: &(Option<String>, Option<String>),
    next: usize,
    ttl: f64,
    scan: &Scan,
) -> Result<Got, sqlx::Error> {
    type LedgerRow = (i64, i64, Option<String>, Option<String>, Vec<String>, Vec<String>, bool);
    let window = |clear: &[String]| {
        let q = sqlx::query_as::<_, LedgerRow>(s.sql.prune.ledger[next].q()).bind(ttl).bind(ROWS_PER_BATCH);
        let q = match &after.0 {
            None => q,
            Some(key) => q.bind(key.clone()).bind(after.1.clone().unwrap_or_default()),
        };
        q.bind(scan.held()).bind(clear.to_vec())
    };
    let (read, mut deleted, last, last_call, ids, users, unscanned) = window(&[]).fetch_one(&mut **tx).await?;
    let mut unchecked = scan.why(unscanned);
    if !ids.is_empty() {
        let (clear, why) = without_runs(s, ids, users).await;
        unchecked = unchecked.or(why);
        if !clear.is_empty() {
            deleted += window(&clear).fetch_one(&mut **tx).await?.1;
        }
    }
    Ok(Got { row: (read, deleted, 0, last, last_call), unchecked, gone: Vec::new() })
}

/// Of the threads `ids` (with their `users`), whose latest rows 10xGraph wrote, the ids of those
/// whose entries show no run under way; with why none was asked when Redis was not given or did
/// not answer (then none is clear: each may hold a run the rows do not show; a prune run without
/// the application's Redis deleted such a run's ledger, and its resume charged again; red-team,
/// session 43).
async fn without_runs(s: &PgStore, ids: Vec<String>, users: Vec<String>) -> (Vec<String>, Option<String>) {
    if ids.is_empty() {
        return (Vec::new(), None);
    }
    let Some(r) = s.redis_configured() else {
        return (Vec::new(), Some("no Redis was given".into()));
    };
    let threads: Vec<ThreadRef> = ids.into_iter().zip(users).map(|(t, u)| ThreadRef::new(t, u)).collect();
    match r.legacy_runs_among(&threads).await {
        Ok(running) => {
            let clear = threads.into_iter().zip(running).filter(|(_, run)| !run).map(|(t, _)| t.thread_id).collect();
            (clear, None)
        }
        Err(e) => (Vec::new(), Some(e.to_string())),
    }
}

/// The deleted threads' Redis entries (ours and 10xGraph's) go too, as with `aclean_thread`:
/// after the batch's commit (a Redis that stalls must not hold its row locks: 150 deleted threads
/// held them 60 s, and a turn beside them failed; red-team, session 43), and only while Redis
/// answers. A failure is ignored: a finished thread's entry is a cache, and a later thread under
/// the id does not resume from an entry with a version and no row. (A 10xGraph turn begun on the
/// thread between the batch's read of its entry and this delete is lost: 10xGraph takes no lock
/// prune could wait on; red-team, session 44.)
async fn forget_entries(s: &PgStore, gone: Vec<ThreadRef>) {
    if let Some(r) = s.redis().filter(|_| !gone.is_empty()) {
        r.clear_state_caches(&gone).await;
    }
}

pub(super) async fn prune(s: &PgStore, rules: &PruneRules) -> StoreResult<PruneReport> {
    let err = |e| map_err("prune", e, None);
    let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
    let mut rule_batches = Vec::new();
    if let Some(keep) = rules.keep_versions {
        rule_batches.push(Batch::States(keep.max(1)));
    }
    if let Some(age) = rules.finished_older_than {
        rule_batches.push(Batch::Threads(age));
    }
    if let Some(ttl) = rules.ledger_ttl {
        rule_batches.push(Batch::Ledger(ttl));
    }
    rule_batches.push(Batch::Cache);
    let scan = if rules.finished_older_than.is_some() || rules.ledger_ttl.is_some() {
        legacy_runs(s).await
    } else {
        Scan::Done(Vec::new())
    };
    // A dry run: every batch in one transaction, rolled back at the end (unbounded: a count of a
    // large database may take minutes, and its row locks are held until then).
    let mut dry = if rules.dry_run { Some(s.conns.begin().await.map_err(err)?) } else { None };
    if let Some(tx) = dry.as_mut() {
        sqlx::raw_sql("SET LOCAL statement_timeout = 0").execute(&mut **tx).await.map_err(err)?;
    }
    for batch in &rule_batches {
        let mut after: (Option<String>, Option<String>) = (None, None);
        loop {
            let got = match dry.as_mut() {
                Some(tx) => batch.run(s, tx, &after, &scan).await.map_err(err)?,
                // Each batch commits on its own, bounded like any transaction of the store.
                None => {
                    s.bounded("prune", async {
                        let mut tx = s.conns.begin().await.map_err(err)?;
                        let got = batch.run(s, &mut tx, &after, &scan).await.map_err(err)?;
                        tx.commit().await.map_err(err)?;
                        Ok(got)
                    })
                    .await?
                }
            };
            if let Some(why) = &got.unchecked {
                if !report.legacy_unchecked {
                    tracing::warn!(
                        event = "legacy_cache_unreachable",
                        "prune leaves the threads 10xGraph wrote last (a run of theirs may live in Redis alone): {why}"
                    );
                }
                report.legacy_unchecked = true;
            }
            if dry.is_none() {
                forget_entries(s, got.gone).await;
            }
            let (read, deleted, ledger, last, last_call) = got.row;
            batch.count(&mut report, deleted, ledger);
            if read < batch.size() || last.is_none() {
                break;
            }
            after = (last, last_call);
        }
    }
    if let Some(tx) = dry {
        tx.rollback().await.map_err(err)?;
    }
    Ok(report)
}

/// What the scan at the prune's start found (see `Stmts::new`, `$h`).
enum Scan {
    /// The threads 10xGraph's entries (any user's) show a run under way in.
    Done(Vec<String>),
    /// Redis was not given, or could not be scanned (why).
    Failed(String),
}

impl Scan {
    fn held(&self) -> Option<&[String]> {
        match self {
            Scan::Done(held) => Some(held),
            Scan::Failed(_) => None,
        }
    }

    /// Why threads were left unchecked, where a statement says it left some for the scan's failure.
    fn why(&self, unscanned: bool) -> Option<String> {
        match self {
            Scan::Failed(why) if unscanned => Some(why.clone()),
            _ => None,
        }
    }
}

/// The scan: one pass over 10xGraph's `state_cache:*` keys.
async fn legacy_runs(s: &PgStore) -> Scan {
    let Some(r) = s.redis_configured() else { return Scan::Failed("no Redis was given".into()) };
    match r.legacy_running_threads().await {
        Ok(found) => Scan::Done(found.into_iter().map(|(t, _)| t.thread_id).collect()),
        Err(e) => Scan::Failed(e.to_string()),
    }
}
