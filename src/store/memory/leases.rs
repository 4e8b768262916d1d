//! The in-process store's leases: the rows, the take (under the store's lock, like every change
//! here), renewal, release, and the fence every run's write passes.

use super::{Inner, MemoryStore};
use crate::store::{
    LeaseAttempt, LeaseInfo, LeaseRequest, StoreError, StoreResult, ThreadRef, fence_ok, may_take, now_secs,
};

/// A lease with its absolute expiry (`LeaseInfo::expires_in` is relative to the reader's now).
pub(super) struct LeaseRow {
    pub(super) info: LeaseInfo,
    pub(super) expires_at: f64,
}

impl LeaseRow {
    pub(super) fn view(&self) -> LeaseInfo {
        LeaseInfo { expires_in: self.expires_at - now_secs(), ..self.info.clone() }
    }
}

impl Inner {
    /// A run's ledger write (`fence` set) needs its thread: the run's input commit made it, so a
    /// missing one was deleted under the run, and writing would bring it back with that row and
    /// no state. Refused like a superseded lease, with no current token.
    pub(super) fn thread_of_run(&self, thread_id: &str, fence: Option<i64>) -> StoreResult<()> {
        match fence {
            Some(token) if !self.threads.contains_key(thread_id) => {
                Err(StoreError::Fenced { thread_id: thread_id.to_owned(), token, current: None })
            }
            _ => Ok(()),
        }
    }

    pub(super) fn fence(&self, thread_id: &str, fence: Option<i64>) -> StoreResult<()> {
        let current = self.leases.get(thread_id).map(|l| l.info.token);
        if fence_ok(current, fence) {
            Ok(())
        } else {
            Err(StoreError::Fenced { thread_id: thread_id.to_owned(), token: fence.unwrap_or_default(), current })
        }
    }

    /// Drops the thread's lease row unless somebody holds it (a live lease stays, so its run is
    /// still fenced, not silently freed).
    pub(super) fn forget_free_lease(&mut self, thread_id: &str) {
        if self.leases.get(thread_id).is_some_and(|l| !l.view().is_live()) {
            self.leases.remove(thread_id);
        }
    }

    /// Extends the lease if `token` still holds it and it was not released.
    pub(super) fn renew_lease(&mut self, thread_id: &str, token: i64, ttl: std::time::Duration) -> bool {
        match self.leases.get_mut(thread_id) {
            Some(l) if l.info.token == token && !l.info.released => {
                l.expires_at = now_secs() + ttl.as_secs_f64();
                true
            }
            _ => false,
        }
    }

    /// Frees the lease if `token` still holds it.
    pub(super) fn release_lease(&mut self, thread_id: &str, token: i64) {
        let gone = !self.threads.contains_key(thread_id);
        if let Some(l) = self.leases.get_mut(thread_id).filter(|l| l.info.token == token) {
            l.info.released = true;
            l.expires_at = now_secs();
            if gone {
                // Deleted while this run held it: nothing else would ever drop the row.
                self.leases.remove(thread_id);
            }
        }
    }
}

impl MemoryStore {
    /// The lease take under the store's lock (see `lease_acquire`).
    pub(super) fn take_locked(
        &self,
        inner: &mut Inner,
        thread_id: &str,
        req: &LeaseRequest,
    ) -> StoreResult<LeaseAttempt> {
        if let (Some(user), Some(d)) = (&req.user_id, inner.threads.get(thread_id)) {
            self.check_owner(d, &ThreadRef::new(thread_id, user.as_str()).scoped(req.owner_scoped))?;
        }
        let cur = inner.leases.get(thread_id).map(LeaseRow::view);
        if !may_take(cur.as_ref(), req) {
            return Ok(LeaseAttempt::Held(cur.expect("may_take is true without a row")));
        }
        let token = cur.map_or(0, |c| c.token).max(inner.last_token) + 1;
        inner.last_token = token;
        let info = LeaseInfo {
            token,
            holder: req.holder.clone(),
            host: req.host.clone(),
            pid: req.pid,
            pid_start: req.pid_start,
            expires_in: req.ttl.as_secs_f64(),
            released: false,
        };
        inner.leases.insert(thread_id.to_owned(), LeaseRow { info, expires_at: now_secs() + req.ttl.as_secs_f64() });
        Ok(LeaseAttempt::Acquired { token })
    }
}
