//! The in-process store's retention (`aprune`): the same rules as SQLite and Postgres, under the
//! store's lock.

use super::Inner;
use crate::store::{PruneReport, PruneRules, is_completed_state, now_secs};

impl Inner {
    /// Applies `rules` (counts only, on a dry run); see `Checkpointer::prune`.
    pub(super) fn prune(&mut self, rules: &PruneRules) -> PruneReport {
        let now = now_secs();
        let mut report = PruneReport { dry_run: rules.dry_run, ..Default::default() };
        let held: std::collections::HashSet<String> =
            self.leases.iter().filter(|(_, l)| l.view().is_live()).map(|(k, _)| k.clone()).collect();
        let mut doomed = Vec::new();
        for (id, d) in self.threads.iter_mut() {
            if let Some(keep) = rules.keep_versions {
                let excess = d.states.len().saturating_sub(keep.max(1) as usize);
                report.state_versions += excess as u64;
                if !rules.dry_run {
                    d.states.drain(..excess);
                }
            }
            let finished = d.states.last().is_some_and(|(_, s)| is_completed_state(&s.value())) && !held.contains(id);
            if !finished {
                continue;
            }
            let updated = d.row.as_ref().map(|r| r.updated_at).unwrap_or(now);
            if rules.finished_older_than.is_some_and(|age| now - updated > age) {
                report.threads += 1;
                report.ledger_rows += d.ledger.len() as u64;
                doomed.push(id.clone());
                continue;
            }
            if let Some(ttl) = rules.ledger_ttl {
                let expired = d.ledger.values().filter(|(_, at)| now - at > ttl).count();
                report.ledger_rows += expired as u64;
                if !rules.dry_run {
                    d.ledger.retain(|_, (_, at)| now - *at <= ttl);
                }
            }
        }
        if !rules.dry_run {
            for id in doomed {
                self.threads.remove(&id);
                self.forget_free_lease(&id);
            }
        }
        report.cache_entries =
            if rules.dry_run { self.expired_cache(now) } else { self.drop_expired_cache(now) } as u64;
        report
    }
}
