//! Rust `tracing` events become Python `logging` records whose structured fields (`thread_id`,
//! `run_id`, `node`, `tool`, `event`, `ledger_key`, ...) are attributes of the `LogRecord`
//! (`extra`), so JSON formatters and log shippers index them.
//!
//! How: a `tracing` layer gathers an event's fields and those of its enclosing spans (a run is
//! one span, see `run_span`), then hands the event to the `log` facade as a record with key-values.
//! `pyo3-log` (feature `kv`) turns that into a Python record with `extra`. This layer never calls
//! Python itself: pyo3-log keeps doing the level check (cached per logger, so a disabled level never
//! touches the interpreter) and the attach, exactly as it did for plain records before.
//!
//! Installing a `tracing` subscriber switches off tracing's own `log` output (its `log` feature
//! only emits while no subscriber is set), so every event, ours and sqlx's, goes through here once.

use pyo3::prelude::*;
use std::fmt;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber, span};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, Registry};

/// Field values as text, first recorded first; a later value of the same field replaces it.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    pairs: Vec<(&'static str, String)>,
}

impl Fields {
    fn set(&mut self, name: &'static str, value: String) {
        if name == "message" {
            self.message = Some(value);
            return;
        }
        match self.pairs.iter_mut().find(|(k, _)| *k == name) {
            Some(pair) => pair.1 = value,
            None => self.pairs.push((name, value)),
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields and the message arrive here; their Debug is their Display.
        self.set(field.name(), format!("{value:?}"));
    }
}

/// Attributes every Python `LogRecord` already has: `makeRecord` refuses an `extra` that would
/// overwrite one (KeyError), so such a field is passed as `field_<name>` instead.
const RECORD_ATTRIBUTES: &[&str] = &[
    "name",
    "msg",
    "args",
    "levelname",
    "levelno",
    "pathname",
    "filename",
    "module",
    "exc_info",
    "exc_text",
    "stack_info",
    "lineno",
    "funcName",
    "created",
    "msecs",
    "relativeCreated",
    "thread",
    "threadName",
    "processName",
    "process",
    "taskName",
    "message",
    "asctime",
];

fn python_key(name: &str) -> String {
    if RECORD_ATTRIBUTES.contains(&name) { format!("field_{name}") } else { name.to_owned() }
}

fn log_level(level: &tracing::Level) -> log::Level {
    match *level {
        tracing::Level::ERROR => log::Level::Error,
        tracing::Level::WARN => log::Level::Warn,
        tracing::Level::INFO => log::Level::Info,
        tracing::Level::DEBUG => log::Level::Debug,
        tracing::Level::TRACE => log::Level::Trace,
    }
}

/// Whether Python would take a record of this level and target. After `_core.shutdown()` the
/// `log` max level is Off, so nothing reaches a finalizing interpreter.
fn wanted(meta: &Metadata<'_>) -> bool {
    let level = log_level(meta.level());
    level <= log::max_level()
        && log::logger().enabled(&log::Metadata::builder().level(level).target(meta.target()).build())
}

struct PyLogLayer;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for PyLogLayer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // Spans always exist (they only carry context); an event's interest depends on Python's
        // logging configuration, which may change, so it is asked each time (cheaply, cached).
        if meta.is_span() { Interest::always() } else { Interest::sometimes() }
    }

    fn enabled(&self, meta: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        meta.is_span() || wanted(meta)
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        // Outer spans first, so the innermost value of a field wins, and the event's own last.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<Fields>() {
                    for (k, v) in &f.pairs {
                        fields.set(k, v.clone());
                    }
                }
            }
        }
        event.record(&mut fields);
        let pairs: Vec<(String, &str)> = fields.pairs.iter().map(|(k, v)| (python_key(k), v.as_str())).collect();
        let kvs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let message = fields.message.as_deref().unwrap_or("");
        let kvs = kvs.as_slice();
        let log_it = || {
            log::logger().log(
                &log::Record::builder()
                    .level(log_level(meta.level()))
                    .target(meta.target())
                    .module_path(meta.module_path())
                    .file(meta.file())
                    .line(meta.line())
                    .key_values(&kvs)
                    .args(format_args!("{message}"))
                    .build(),
            )
        };
        // pyo3-log leaves a handler's exception set as the thread's current Python exception:
        // on a thread that is running Python code (the event loop's, inside a call from Rust),
        // the next call then failed with SystemError ("returned a result with an exception
        // set"), and a raising log handler failed the run (red-team, session 31). It is taken
        // here and printed, as `logging` does for a handler that fails (`handleError`).
        Python::attach(|py| {
            let earlier = PyErr::take(py);
            log_it();
            if let Some(failed) = PyErr::take(py) {
                failed.print(py);
            }
            if let Some(e) = earlier {
                e.restore(py);
            }
        });
    }
}

/// Installs the layer as the process's `tracing` subscriber. Call after the `log` logger (pyo3-log)
/// is installed. A second call (another interpreter in the process) leaves the first in place.
pub fn install() {
    let _ = tracing::subscriber::set_global_default(Registry::default().with(PyLogLayer));
}

/// The span of one run: every event inside it carries `thread_id` and `run_id`, and `node` once
/// the run enters a node (`enter_node`).
pub fn run_span(thread_id: &str, run_id: &str) -> tracing::Span {
    tracing::info_span!("run", thread_id = %thread_id, run_id = %run_id, node = tracing::field::Empty)
}

/// Records the node the current run is in; later events of the run carry it until the next node.
/// Called by the host when the loop starts a node, so the engine needs no span code of its own.
pub fn enter_node(node: &str) {
    tracing::Span::current().record("node", node);
}

#[cfg(test)]
mod tests {
    use super::python_key;

    #[test]
    fn fields_that_would_overwrite_record_attributes_are_renamed() {
        assert_eq!(python_key("thread_id"), "thread_id");
        assert_eq!(python_key("message"), "field_message");
        assert_eq!(python_key("name"), "field_name");
        assert_eq!(python_key("thread"), "field_thread");
    }
}
