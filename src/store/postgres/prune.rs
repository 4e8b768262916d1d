//! Retention on PostgreSQL, in batches. Each rule deletes at most a batch of rows per statement
//! and repeats until a batch comes back short: a real run commits each batch on its own, so the
//! row locks a batch takes last as long as that batch (a live thread's step that trims its own
//! history, or a new turn on a finished thread, waits for one batch, not for the whole prune,
//! which on a large database may rightly take minutes). A dry run runs the same batches in one
//! transaction and rolls it back, so what it reports is exactly what the real run removes at that
//! moment (rules that follow see what earlier ones deleted, in both). Which threads are finished
//! is decided per candidate row by index lookups, not by a scan of every state per batch. The
//! numbers of a rule are bind parameters.

use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{PruneReport, PruneRules, StoreResult};
use sqlx::{Postgres, Transaction};

/// Rows per batch: old state versions and ledger rows are small; a thread takes its messages,
/// states and ledger rows with it (by cascade), so fewer of those per batch.
const ROWS_PER_BATCH: i64 = 2000;
const THREADS_PER_BATCH: i64 = 100;

pub(super) struct Stmts {
    states: Stmt,
    threads: Stmt,
    ledger: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let tt = c.id_text;
        // The thread of row `x` is completed (by its latest state) and not leased: the only
        // threads prune touches.
        let finished = |x: &str| {
            format!(
                "(SELECT st.state_data->'execution_meta'->>'status' FROM {s}.states st WHERE st.thread_id = {x}.thread_id \
                   ORDER BY st.version DESC LIMIT 1) = 'completed' \
                 AND NOT EXISTS (SELECT 1 FROM {s}.tenx_leases l WHERE l.thread_id = {x}.thread_id{tt} \
                   AND NOT l.released AND l.expires_at > clock_timestamp())"
            )
        };
        Stmts {
            // $1: versions to keep (at least 1: the latest always stays); $2: the batch.
            states: Stmt::new(format!(
                "WITH v AS (SELECT st.state_id FROM {s}.states st WHERE st.version <= \
                   (SELECT MAX(s2.version) FROM {s}.states s2 WHERE s2.thread_id = st.thread_id) - $1::int8 LIMIT $2::int8), \
                 d AS (DELETE FROM {s}.states WHERE state_id = ANY(ARRAY(SELECT state_id FROM v)) RETURNING 1) \
                 SELECT (SELECT COUNT(*) FROM v), (SELECT COUNT(*) FROM d), 0::int8"
            )),
            // $1: seconds; $2: the batch. The ledger rows go by cascade at the end of the
            // statement; the count reads them from the statement's snapshot, before they went.
            // The DELETE repeats the age test, so a thread a new turn touched while the batch
            // chose it is judged on its new row and kept, whatever the plan re-checks of the
            // choosing query.
            threads: Stmt::new(format!(
                "WITH v AS (SELECT t.thread_id FROM {s}.threads t \
                   WHERE t.updated_at < clock_timestamp() - make_interval(secs => $1::float8) AND {} LIMIT $2::int8), \
                 d AS (DELETE FROM {s}.threads WHERE thread_id IN (SELECT thread_id FROM v) \
                   AND updated_at < clock_timestamp() - make_interval(secs => $1::float8) RETURNING thread_id) \
                 SELECT (SELECT COUNT(*) FROM v), COUNT(*), \
                   (SELECT COUNT(*) FROM {s}.tool_executions x WHERE x.thread_id IN (SELECT thread_id FROM d)) FROM d",
                finished("t")
            )),
            // $1: seconds; $2: the batch. Runs after the thread rule, so rows that went with
            // their thread are not counted twice.
            ledger: Stmt::new(format!(
                "WITH v AS (SELECT x.ctid AS c FROM {s}.tool_executions x \
                   WHERE x.created_at < clock_timestamp() - make_interval(secs => $1::float8) AND {} LIMIT $2::int8), \
                 d AS (DELETE FROM {s}.tool_executions WHERE ctid = ANY(ARRAY(SELECT c FROM v)) RETURNING 1) \
                 SELECT (SELECT COUNT(*) FROM v), (SELECT COUNT(*) FROM d), 0::int8",
                finished("x")
            )),
        }
    }
}

/// One batch of one rule, with its bind. A batch reports the rows it chose, the rows it deleted
/// (fewer when a live thread's own trim deleted some first) and, for threads, their ledger rows.
enum Batch {
    States(i64),
    Threads(f64),
    Ledger(f64),
}

impl Batch {
    async fn run(&self, s: &PgStore, tx: &mut Transaction<'static, Postgres>) -> Result<(i64, i64, i64), sqlx::Error> {
        let q = match *self {
            Batch::States(keep) => sqlx::query_as(s.sql.prune.states.q()).bind(keep),
            Batch::Threads(age) => sqlx::query_as(s.sql.prune.threads.q()).bind(age),
            Batch::Ledger(ttl) => sqlx::query_as(s.sql.prune.ledger.q()).bind(ttl),
        };
        q.bind(self.size()).fetch_one(&mut **tx).await
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
        }
    }
}

pub(super) async fn prune(s: &PgStore, rules: &PruneRules) -> StoreResult<PruneReport> {
    let err = |e| map_err("prune", e, None);
    let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
    let mut rule_batches = Vec::new();
    if let Some(keep) = rules.keep_versions {
        rule_batches.push(Batch::States(keep.max(1) as i64));
    }
    if let Some(age) = rules.finished_older_than {
        rule_batches.push(Batch::Threads(age));
    }
    if let Some(ttl) = rules.ledger_ttl {
        rule_batches.push(Batch::Ledger(ttl));
    }
    // A dry run: every batch in one transaction, rolled back at the end (unbounded, as before: a
    // count of a large database may take minutes, and its row locks are held until then).
    let mut dry = if rules.dry_run { Some(s.conns.begin().await.map_err(err)?) } else { None };
    for batch in &rule_batches {
        loop {
            let got = match dry.as_mut() {
                Some(tx) => batch.run(s, tx).await.map_err(err)?,
                // Each batch commits on its own, bounded like any transaction of the store.
                None => {
                    s.bounded("prune", async {
                        let mut tx = s.conns.begin().await.map_err(err)?;
                        let got = batch.run(s, &mut tx).await.map_err(err)?;
                        tx.commit().await.map_err(err)?;
                        Ok(got)
                    })
                    .await?
                }
            };
            let (chosen, deleted, ledger) = got;
            batch.count(&mut report, deleted, ledger);
            if chosen < batch.size() {
                break;
            }
        }
    }
    if let Some(tx) = dry {
        tx.rollback().await.map_err(err)?;
    }
    Ok(report)
}
