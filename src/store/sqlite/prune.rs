//! Retention: old state versions, finished threads and old ledger rows, never a thread that is not
//! completed or whose lease is held.

use super::*;

/// Threads `prune` may clear around: latest state completed, lease not held (`?1` = now).
pub(super) const FINISHED: &str = "SELECT s.thread_id FROM states s \
     WHERE s.version = (SELECT MAX(version) FROM states WHERE thread_id = s.thread_id) \
       AND json_extract(s.state_data, '$.execution_meta.status') = 'completed' \
       AND s.thread_id NOT IN (SELECT thread_id FROM leases WHERE released = 0 AND expires_at > ?1)";

pub(super) async fn prune(s: &SqliteStore, rules: &PruneRules) -> StoreResult<PruneReport> {
    let now = now_secs();
    let mut tx = WriteTx::begin(&s.pool, &s.write_gate, "prune").await?;
    let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
    // Each rule is counted with the WHERE clause it deletes with, so a dry run reports exactly
    // what the real run would remove. Every value is a bind: `?1` is now, then the rule's own.
    let mut plan: Vec<(String, Vec<f64>)> = Vec::new();
    if let Some(keep) = rules.keep_versions {
        plan.push((
            "FROM states WHERE version <= (SELECT MAX(version) FROM states s2 WHERE s2.thread_id = states.thread_id) - ?2".into(),
            vec![keep.max(1) as f64],
        ));
    }
    if let Some(age) = rules.finished_older_than {
        plan.push((format!("FROM threads WHERE updated_at < ?2 AND thread_id IN ({FINISHED})"), vec![now - age]));
    }
    if let Some(ttl) = rules.ledger_ttl {
        // Rows of threads the rule above deletes are counted there, not twice.
        let from = format!("FROM tool_executions WHERE created_at < ?2 AND thread_id IN ({FINISHED})");
        plan.push(match rules.finished_older_than {
            Some(age) => (format!("{from} AND thread_id NOT IN (SELECT thread_id FROM threads WHERE updated_at < ?3)"),
                vec![now - ttl, now - age]),
            None => (from, vec![now - ttl]),
        });
    }
    for (from, args) in plan {
        let counted: i64 = bind_all(sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) {from}"))), now, &args)
            .fetch_one(tx.conn())
            .await
            .map_err(be("prune"))?;
        if from.starts_with("FROM threads") {
            // The ledger rows that go with the threads (cascade) are reported too.
            let rows: i64 = bind_all(
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT COUNT(*) FROM tool_executions WHERE thread_id IN (SELECT thread_id {from})"
                ))),
                now,
                &args,
            )
            .fetch_one(tx.conn())
            .await
            .map_err(be("prune"))?;
            report.threads += counted as u64;
            report.ledger_rows += rows as u64;
        } else if from.starts_with("FROM states") {
            report.state_versions += counted as u64;
        } else {
            report.ledger_rows += counted as u64;
        }
        if !rules.dry_run {
            let mut delete = sqlx::query(sqlx::AssertSqlSafe(format!("DELETE {from}"))).bind(now);
            for a in &args {
                delete = delete.bind(*a);
            }
            delete
                .execute(tx.conn())
                .await
                .map_err(be("prune"))?;
        }
    }
    tx.commit("prune").await?;
    Ok(report)
}

/// A count query with its binds: now, then the rule's values in order.
fn bind_all<'q>(
    mut q: sqlx::query::QueryScalar<'q, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments>,
    now: f64,
    args: &[f64],
) -> sqlx::query::QueryScalar<'q, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments> {
    q = q.bind(now);
    for a in args {
        q = q.bind(*a);
    }
    q
}
