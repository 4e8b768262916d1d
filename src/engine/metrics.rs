//! Process-wide counters and durations, cheap enough for every node and tool call (relaxed
//! atomics). Read with `snapshot()`; exporters (Prometheus, OTel) are built on that in Python.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

macro_rules! metrics {
    ($($field:ident => $name:literal),* $(,)?) => {
        #[derive(Default)]
        pub struct Metrics { $(pub $field: AtomicU64,)* }
        impl Metrics {
            /// `(metric name, value)`; durations are `*_seconds_sum` / `*_count` pairs.
            pub fn snapshot(&self) -> Vec<(&'static str, f64)> {
                vec![$(($name, self.$field.load(Relaxed) as f64 / scale($name)),)*]
            }
        }
    };
}

metrics! {
    node_executions => "tenxgraph.node.executions",
    node_errors => "tenxgraph.node.errors",
    node_timeouts => "tenxgraph.node.timeouts",
    node_stopped => "tenxgraph.node.stopped",
    node_duration_us => "tenxgraph.node.duration_seconds_sum",
    tool_calls => "tenxgraph.tool.calls",
    tool_errors => "tenxgraph.tool.errors",
    tool_timeouts => "tenxgraph.tool.timeouts",
    tool_replayed => "tenxgraph.tool.replayed",
    tool_record_failures => "tenxgraph.tool.record_failures",
    tool_duration_us => "tenxgraph.tool.duration_seconds_sum",
    ledger_read_failures => "tenxgraph.ledger.read_failures",
    ledger_misses => "tenxgraph.ledger.misses",
    stale_conflicts => "tenxgraph.storage.stale_conflicts",
    steps_committed => "tenxgraph.storage.steps_committed",
    redis_fallbacks => "tenxgraph.storage.redis_fallbacks",
    nul_replaced => "tenxgraph.storage.nul_replaced",
    leases_acquired => "tenxgraph.lease.acquired",
    leases_taken_over => "tenxgraph.lease.taken_over",
    leases_lost => "tenxgraph.lease.lost",
    busy_rejections => "tenxgraph.lease.busy_rejections",
    preempt_requests => "tenxgraph.lease.preempt_requests",
    fenced_writes => "tenxgraph.lease.fenced_writes",
    tool_intents => "tenxgraph.tool.intents_recorded",
    tool_outcome_unknown => "tenxgraph.tool.outcome_unknown",
}

fn scale(name: &str) -> f64 {
    if name.ends_with("seconds_sum") { 1e6 } else { 1.0 }
}

pub fn metrics() -> &'static Metrics {
    static M: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    M.get_or_init(Metrics::default)
}

pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

pub fn add_duration(c: &AtomicU64, d: Duration) {
    c.fetch_add(d.as_micros() as u64, Relaxed);
}
