//! A run's commits: the input commit (which takes the lease on an optimistic start), a step, the
//! last one (which frees the lease), and the error state when a node or the state itself failed.

use super::start::{Optimistic, refused_start};
use super::{Run, RunOutcome};
use crate::engine::{EngineError, ExecStatus, Lifecycle, NodeHost, STOP_NAMESPACE, lease};
use crate::engine::{MsgCursor, Snapshot};
use crate::failpoints::Armed;
use crate::store::{LeasedInput, SharedJson, StepWrite, StopKey, StoreError, StoredMessage, TxHook};
use serde_json::{Value, json};

/// The `in_step_tx` failpoint, run by the store inside the step's transaction.
struct InTx<'a> {
    armed: &'a Armed,
    node: &'a str,
}

#[async_trait::async_trait]
impl TxHook for InTx<'_> {
    async fn in_transaction(&self) -> Result<(), String> {
        self.armed.hit("in_step_tx", self.node).await.map_err(|f| f.to_string())
    }
}

/// A snapshot whose state carries this commit's write mark.
struct Marked {
    state: SharedJson,
    new_messages: Vec<StoredMessage>,
    replace_messages: bool,
    cursor: MsgCursor,
}

fn marked(snap: Snapshot, mark: &str) -> Result<Marked, EngineError> {
    let state = crate::store::marked_state(snap.state, mark)
        .map_err(|e| EngineError::InvalidInput(format!("the state cannot be stored: {e}")))?;
    Ok(Marked { state, new_messages: snap.new_messages, replace_messages: snap.replace_messages, cursor: snap.cursor })
}

/// A stored state without its messages: the part a commit writes.
fn without_context(state: &Value) -> Value {
    match state.as_object() {
        Some(o) if o.contains_key("context") => Value::Object(
            o.iter().filter(|(k, _)| k.as_str() != "context").map(|(k, v)| (k.clone(), v.clone())).collect(),
        ),
        _ => state.clone(),
    }
}

impl<H: NodeHost + ?Sized> Run<'_, H> {
    pub(super) fn outcome(&self, stopped: bool) -> RunOutcome {
        RunOutcome {
            exec: self.exec.clone(),
            version: self.version,
            stopped,
            mark: self.mark.clone(),
            nothing_to_resume: false,
            state: self.last_state.clone(),
        }
    }

    /// The input commit of an optimistic start: the lease and the step in one transaction. The
    /// outer error ends the run as it is (a failpoint, a refusal marked on `opt`: nothing was
    /// written); the inner one is the store's, handled as `put_step`'s.
    pub(super) async fn commit_input(
        &self,
        w: StepWrite<'_>,
        opt: &Optimistic,
    ) -> Result<Result<i64, StoreError>, EngineError> {
        let cfg = self.cfg;
        if !cfg.failpoints.is_off() {
            cfg.failpoints.hit("before_input_tx", &cfg.thread.thread_id).await?;
        }
        let taking = lease::taking(cfg);
        let stop = StopKey { namespace: STOP_NAMESPACE, key: &self.stop_key };
        let req = lease::request(cfg);
        let sent = tokio::time::Instant::now();
        let put = if self.on_head {
            self.store.put_input_on_head(&cfg.thread, &req, w, Some(stop)).await
        } else {
            self.store.put_input_leased(&cfg.thread, &req, w, Some(stop)).await
        };
        match put {
            Ok(LeasedInput::Committed { token, version }) => {
                let _ = self.lease.set(taking.taken(cfg, token));
                if self.on_head {
                    let m = crate::metrics::metrics();
                    crate::metrics::inc(&m.live_state_reuses);
                    crate::metrics::inc(&m.start_reads_skipped);
                }
                Ok(Ok(version))
            }
            Ok(LeasedInput::Held(_)) | Err(StoreError::Stale { .. }) => {
                opt.refuse();
                Err(refused_start())
            }
            // A lock the write could not get within the store's wait (SQLite's busy wait: another
            // process inside a write transaction); nothing was written. A run told to wait takes
            // the lease first, which waits through such locks to its `busy_timeout`: it failed
            // at the store's wait whatever it asked for (red-team, session 41).
            // Not when the wait already spent the caller's `busy_timeout` (a short one waited two
            // busy waits).
            Err(StoreError::LockWait { .. })
                if cfg.lease.on_busy != lease::OnBusy::Reject && sent.elapsed() < cfg.lease.busy_timeout =>
            {
                opt.refuse();
                Err(refused_start())
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// The run's last commit: it also frees the thread's lease, in the same transaction.
    pub(super) async fn commit_final(&mut self) -> Result<(), EngineError> {
        self.finishing = true;
        self.commit(true).await
    }

    /// Commits the live state. A non-durable step leaves the cursor alone, so the next durable
    /// commit carries every message since the last one.
    pub(super) async fn commit(&mut self, durable: bool) -> Result<(), EngineError> {
        if !durable {
            return Ok(());
        }
        self.hooks(Lifecycle::Checkpoint).await;
        let mark = crate::store::unique_mark();
        let snapshot = if self.unserialisable && self.exec.status == ExecStatus::Error {
            // The live state could not be stored (the host could not serialise it, or the store
            // refused what it holds): the error state is written from the last stored one.
            Err(EngineError::InvalidInput("the thread has no stored state to mark as failed".into()))
        } else {
            self.host.snapshot(&self.exec, &self.cursor).and_then(|snap| marked(snap, &mark))
        };
        let snap = match snapshot {
            Ok(snap) => snap,
            Err(e) if self.exec.status == ExecStatus::Error => match self.error_snapshot().map(|s| marked(s, &mark)) {
                Some(Ok(snap)) => snap,
                _ => return Err(e),
            },
            Err(e) => {
                self.unserialisable = true;
                return Err(e);
            }
        };
        let hook = InTx { armed: &self.cfg.failpoints, node: &self.step_node };
        let w = StepWrite {
            expected_version: self.version,
            state: &snap.state,
            mark: Some(&mark),
            new_messages: &snap.new_messages,
            replace_messages: snap.replace_messages || self.rewrite,
            fence: self.lease.get().map(|l| l.token),
            release_lease: self.finishing,
            in_tx: if self.cfg.failpoints.is_off() { None } else { Some(&hook as &dyn TxHook) },
            previous_mark: self.seen_mark.as_deref(),
            expected_mark: None,
        };
        let written = match (self.lease.get(), self.optimistic) {
            (None, Some(opt)) => self.commit_input(w, opt).await?,
            _ => self.put_step_carrying(w).await,
        };
        self.version = match written {
            Ok(v) => v,
            Err(e) => {
                match e {
                    StoreError::Stale { .. } => crate::metrics::inc(&crate::metrics::metrics().stale_conflicts),
                    StoreError::Fenced { .. } => crate::metrics::inc(&crate::metrics::metrics().fenced_writes),
                    _ => {}
                }
                // A node's step the store refuses fails the same way on every retry: the thread
                // ends in the error status, as for a state that cannot be serialised, instead of
                // staying `running` (new input refused with STORAGE_BUSY_001, every `ainvoke({})`
                // failing again). Not for the input commit: a refused input leaves the thread as
                // it was.
                if self.exec.status != ExecStatus::Error && self.step_node != "__input__" && e.refuses_the_data() {
                    self.unserialisable = true;
                }
                return Err(e.into());
            }
        };
        crate::metrics::inc(&crate::metrics::metrics().steps_committed);
        if self.finishing {
            self.lease().mark_released();
        }
        self.cursor = snap.cursor;
        self.last_state = Some(snap.state);
        self.seen_mark = Some(mark.clone());
        self.mark = Some(mark);
        self.rewrite = false;
        self.host.committed(self.version);
        // A tool node's calls are answered in the state now: what the store kept of the thread's
        // unrecorded results will not be asked for again (src/store/unrecorded.rs). Not at a
        // pause inside the node (it runs again on resume) nor at a failure.
        if matches!(self.exec.status, ExecStatus::Running | ExecStatus::Completed | ExecStatus::InterruptedAfter)
            && self.graph.tool_nodes.contains(&self.step_node)
            && let Some(kept) = self.store.unrecorded()
        {
            kept.forget_thread(&self.cfg.thread.thread_id);
        }
        if !self.cfg.failpoints.is_off() {
            self.cfg.failpoints.hit("after_step", &self.step_node).await?;
            if self.host.streaming() {
                self.cfg.failpoints.hit("mid_stream", &self.step_node).await?;
            }
        }
        tracing::debug!(thread_id = %self.cfg.thread.thread_id, version = self.version, "step committed");
        Ok(())
    }

    /// The error state when the live state cannot be serialised: the last state the store holds
    /// from this run (or as loaded), with the loop's fields saying the node in flight failed. The
    /// node's work is lost, as when it raises; None for a thread with nothing stored yet.
    pub(super) fn error_snapshot(&self) -> Option<crate::engine::Snapshot> {
        let mut state = match (&self.last_state, self.loaded_state) {
            (Some(committed), _) => serde_json::from_str(committed.get()).ok()?,
            (None, loaded) => without_context(loaded?),
        };
        let mut exec = self.exec.clone();
        if self.step_node != "__input__" {
            exec.current_node = self.step_node.clone();
        }
        let meta = state.as_object_mut()?.entry("execution_meta").or_insert_with(|| json!({}));
        let meta = meta.as_object_mut()?;
        if let Ok(Value::Object(fields)) = serde_json::to_value(&exec) {
            meta.extend(fields);
        }
        let internal = meta.entry("internal_data").or_insert_with(|| json!({}));
        if let Some(internal) = internal.as_object_mut() {
            internal.insert("error".into(), json!(exec.error));
        }
        Some(crate::engine::Snapshot {
            state: state.to_string(),
            new_messages: vec![],
            replace_messages: false,
            cursor: self.cursor.clone(),
        })
    }

    /// Marks the thread as failed, commits that, and returns `err`.
    pub(super) async fn fail(&mut self, err: EngineError) -> Result<RunOutcome, EngineError> {
        if matches!(err, EngineError::Store(_)) && !self.unserialisable {
            return Err(err); // the store itself failed: writing the error state would fail too
        }
        self.exec.status = ExecStatus::Error;
        // As `str()` of the raised exception gives it, "[CODE] message": 10xGraph stores that, and
        // code that reads a failed thread learns what failed it (differential red-team, session 35).
        self.exec.error = Some(match err.code() {
            Some(code) => format!("[{code}] {err}"),
            None => err.to_string(),
        });
        if let Some(message) = self.hooks(Lifecycle::Error).await {
            self.exec.error = Some(message);
        }
        if let Err(e) = self.commit_final().await {
            tracing::error!(thread_id = %self.cfg.thread.thread_id, "could not record the failed state: {e}");
        }
        Err(err)
    }
}
