//! Retention on PostgreSQL. Each rule is one DELETE that counts what it removed, run in one
//! transaction; a dry run is the same transaction rolled back, so what it reports is exactly what
//! the real run removes (rules that follow see what earlier ones deleted, in both). The numbers
//! of a rule are bind parameters.

use super::{Casts, PgStore, Stmt, map_err};
use crate::store::{PruneReport, PruneRules, StoreResult};

pub(super) struct Stmts {
    states: Stmt,
    threads: Stmt,
    ledger: Stmt,
}

impl Stmts {
    pub(super) fn new(s: &str, c: &Casts) -> Self {
        let tt = c.id_text;
        // Completed (by their latest state) and not leased: the only threads prune touches.
        let finished = format!(
            "SELECT st.thread_id FROM {s}.states st \
             WHERE st.version = (SELECT MAX(version) FROM {s}.states WHERE thread_id = st.thread_id) \
               AND st.state_data->'execution_meta'->>'status' = 'completed' \
               AND st.thread_id{tt} NOT IN (SELECT thread_id FROM {s}.tenx_leases WHERE NOT released AND expires_at > clock_timestamp())"
        );
        Stmts {
            // $1: versions to keep (at least 1: the latest always stays).
            states: Stmt::new(format!(
                "WITH d AS (DELETE FROM {s}.states WHERE version <= \
                   (SELECT MAX(version) FROM {s}.states s2 WHERE s2.thread_id = {s}.states.thread_id) - $1::int8 RETURNING 1) \
                 SELECT COUNT(*) FROM d"
            )),
            // $1: seconds. The ledger rows go by cascade at the end of the statement; the count
            // reads them from the statement's snapshot, before they went.
            threads: Stmt::new(format!(
                "WITH d AS (DELETE FROM {s}.threads WHERE updated_at < clock_timestamp() - make_interval(secs => $1::float8) \
                   AND thread_id IN ({finished}) RETURNING thread_id) \
                 SELECT COUNT(*), (SELECT COUNT(*) FROM {s}.tool_executions x WHERE x.thread_id IN (SELECT thread_id FROM d)) FROM d"
            )),
            // $1: seconds. Runs after the thread rule, so rows that went with their thread are
            // not counted twice.
            ledger: Stmt::new(format!(
                "WITH d AS (DELETE FROM {s}.tool_executions WHERE created_at < clock_timestamp() - make_interval(secs => $1::float8) \
                   AND thread_id IN ({finished}) RETURNING 1) \
                 SELECT COUNT(*) FROM d"
            )),
        }
    }
}

pub(super) async fn prune(s: &PgStore, rules: &PruneRules) -> StoreResult<PruneReport> {
    let err = |e| map_err("prune", e, None);
    let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
    let mut tx = s.conns.begin().await.map_err(err)?;
    if let Some(keep) = rules.keep_versions {
        let n: i64 = sqlx::query_scalar(s.sql.prune.states.q()).bind(keep.max(1)).fetch_one(&mut *tx).await.map_err(err)?;
        report.state_versions += n as u64;
    }
    if let Some(age) = rules.finished_older_than {
        let (threads, ledger): (i64, i64) = sqlx::query_as(s.sql.prune.threads.q()).bind(age).fetch_one(&mut *tx).await.map_err(err)?;
        report.threads += threads as u64;
        report.ledger_rows += ledger as u64;
    }
    if let Some(ttl) = rules.ledger_ttl {
        let n: i64 = sqlx::query_scalar(s.sql.prune.ledger.q()).bind(ttl).fetch_one(&mut *tx).await.map_err(err)?;
        report.ledger_rows += n as u64;
    }
    if rules.dry_run {
        tx.rollback().await.map_err(err)?;
    } else {
        tx.commit().await.map_err(err)?;
    }
    Ok(report)
}
