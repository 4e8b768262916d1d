//! The in-process store's cache (stop requests, the state cache, values with a TTL): every
//! function here runs under the store's lock.

use super::Inner;
use crate::store::now_secs;
use serde_json::Value;

impl Inner {
    /// Drops expired cache entries once the cache has doubled since the last sweep: amortised
    /// O(1) per write. Before, an expired entry went only when its own key was read again, so a
    /// cache written with TTLs (sessions, rate limits, the stop requests' hour) only grew.
    pub(super) fn sweep_cache(&mut self) {
        if self.cache.len() < 2 * self.cache_swept_at.max(512) {
            return;
        }
        self.drop_expired_cache(now_secs());
    }

    /// Drops the cache entries expired at `now`; returns how many went.
    pub(super) fn drop_expired_cache(&mut self, now: f64) -> usize {
        let before = self.cache.len();
        self.cache.retain(|_, (_, exp)| exp.is_none_or(|e| e > now));
        self.cache_swept_at = self.cache.len();
        before - self.cache.len()
    }

    /// How many entries are expired at `now` (a dry run's count).
    pub(super) fn expired_cache(&self, now: f64) -> usize {
        self.cache.values().filter(|(_, exp)| exp.is_some_and(|e| e <= now)).count()
    }

    pub(super) fn cache_put(&mut self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) {
        let expires = ttl.filter(|t| *t > 0.0).map(|t| now_secs() + t);
        self.cache.insert((ns.into(), key.into()), (value.clone(), expires));
        self.sweep_cache();
    }

    /// Writes only where no live entry is; returns whether it wrote.
    pub(super) fn cache_put_absent(&mut self, ns: &str, key: &str, value: &Value, ttl: Option<f64>) -> bool {
        let k = (ns.to_owned(), key.to_owned());
        let now = now_secs();
        if self.cache.get(&k).is_some_and(|(_, exp)| exp.is_none_or(|e| e > now)) {
            return false;
        }
        self.cache.insert(k, (value.clone(), ttl.filter(|t| *t > 0.0).map(|t| now + t)));
        self.sweep_cache();
        true
    }

    /// The entry's value; an expired one is dropped on the way.
    pub(super) fn cache_get(&mut self, ns: &str, key: &str) -> Option<Value> {
        let k = (ns.to_owned(), key.to_owned());
        match self.cache.get(&k) {
            Some((_, Some(exp))) if *exp <= now_secs() => {
                self.cache.remove(&k);
                None
            }
            Some((v, _)) => Some(v.clone()),
            None => None,
        }
    }

    /// The live keys of a namespace (under `prefix`), sorted.
    pub(super) fn cache_keys(&self, ns: &str, prefix: Option<&str>) -> Vec<String> {
        let now = now_secs();
        let mut keys: Vec<String> = self
            .cache
            .iter()
            .filter(|((n, k), (_, exp))| {
                n == ns && prefix.is_none_or(|p| k.starts_with(p)) && exp.is_none_or(|e| e > now)
            })
            .map(|((_, k), _)| k.clone())
            .collect();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::Inner;
    use crate::store::now_secs;
    use serde_json::json;

    #[test]
    fn expired_cache_entries_are_swept_as_the_cache_grows() {
        let mut inner = Inner::default();
        let past = Some(now_secs() - 1.0);
        for i in 0..5000 {
            inner.cache.insert(("ns".into(), format!("k{i}")), (json!(i), past));
            inner.sweep_cache();
        }
        inner.cache.insert(("ns".into(), "kept".into()), (json!(1), None));
        inner.cache.insert(("ns".into(), "later".into()), (json!(1), Some(now_secs() + 3600.0)));
        for i in 0..2000 {
            inner.cache.insert(("ns".into(), format!("j{i}")), (json!(i), past));
            inner.sweep_cache();
        }
        // Never more than twice the live entries (or the floor of 512) between two sweeps.
        assert!(inner.cache.len() <= 1024, "{} entries", inner.cache.len());
        assert!(inner.cache.contains_key(&("ns".into(), "kept".into())));
        assert!(inner.cache.contains_key(&("ns".into(), "later".into())));
    }
}
