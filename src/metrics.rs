//! Process-wide counters and durations, cheap enough for every node and tool call (relaxed
//! atomics). Read with `snapshot()`; exporters (Prometheus, OTel) are built on that in Python.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

macro_rules! metrics {
    (
        durations { $($dfield:ident => $dname:literal),* $(,)? }
        $($field:ident => $name:literal),* $(,)?
    ) => {
        /// Every counter and duration of the process (see the field list in the `metrics!` call).
        #[derive(Default)]
        pub struct Metrics {
            $(#[doc = concat!("The `", $dname, "` duration.")] pub $dfield: DurationStat,)*
            $(#[doc = concat!("The `", $name, "` counter.")] pub $field: AtomicU64,)*
        }
        impl Metrics {
            /// `(metric name, value)`: every counter, each duration as a `<name>_sum` (seconds) /
            /// `<name>_count` pair, and the derived `tenxgraph.ledger.hits`.
            pub fn snapshot(&self) -> Vec<(&'static str, f64)> {
                let mut out = vec![$(($name, self.$field.load(Relaxed) as f64),)*];
                $(
                    out.push((concat!($dname, "_sum"), self.$dfield.sum_us.load(Relaxed) as f64 / 1e6));
                    out.push((concat!($dname, "_count"), self.$dfield.count.load(Relaxed) as f64));
                )*
                // Every call answered from the ledger is one ledger hit; counted once, as replays.
                out.push(("tenxgraph.ledger.hits", self.tool_replayed.load(Relaxed) as f64));
                out
            }
        }
    };
}

/// A duration metric: total microseconds and how many observations made it, so an exporter can
/// publish a summary (sum and count) and a reader can compute the mean.
#[derive(Default)]
pub struct DurationStat {
    /// Total, in microseconds.
    pub sum_us: AtomicU64,
    /// How many durations were added.
    pub count: AtomicU64,
}

metrics! {
    durations {
        node_duration_us => "tenxgraph.node.duration_seconds",
        tool_duration_us => "tenxgraph.tool.duration_seconds",
    }
    node_executions => "tenxgraph.node.executions",
    node_errors => "tenxgraph.node.errors",
    node_timeouts => "tenxgraph.node.timeouts",
    node_stopped => "tenxgraph.node.stopped",
    tool_calls => "tenxgraph.tool.calls",
    tool_errors => "tenxgraph.tool.errors",
    tool_timeouts => "tenxgraph.tool.timeouts",
    tool_replayed => "tenxgraph.tool.replayed",
    tool_record_failures => "tenxgraph.tool.record_failures",
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
    history_loads => "tenxgraph.storage.history_loads",
    live_state_reuses => "tenxgraph.storage.live_state_reuses",
    start_reads_skipped => "tenxgraph.storage.start_reads_skipped",
    gate_waits => "tenxgraph.storage.gate_waits",
    gate_bypasses => "tenxgraph.storage.gate_bypasses",
    gate_lowered => "tenxgraph.storage.gate_limit_lowered",
    gate_raised => "tenxgraph.storage.gate_limit_raised",
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    M.get_or_init(Metrics::default)
}

/// Adds one to a counter (relaxed: counts are exact, their order with other memory is not).
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// Adds one duration (whole microseconds).
pub fn add_duration(c: &DurationStat, d: Duration) {
    c.sum_us.fetch_add(d.as_micros() as u64, Relaxed);
    c.count.fetch_add(1, Relaxed);
}
