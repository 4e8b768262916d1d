//! One writer per thread, the engine's half: taking the thread's lease under the run's `on_busy`
//! policy, telling a dead holder from a live one, renewing while the run goes on, and noticing
//! when the lease was lost. The store keeps the rows and checks the fencing token on every write.

use super::{EngineError, RunConfig, STOP_NAMESPACE, StopSignals, stop_key};
use crate::metrics::{inc, metrics};
use crate::store::{Checkpointer, LeaseAttempt, LeaseInfo, LeaseRequest, StoreError};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// What a run does when another execution holds the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBusy {
    /// ThreadBusyError before any node or tool runs.
    Reject,
    /// Wait until the lease is free, at most `busy_timeout`.
    Wait,
    /// Ask the holder to stop at its next safe point, then wait as `Wait` does.
    Interrupt,
}

impl OnBusy {
    /// `"reject"`, `"wait"` or `"interrupt"`; None for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "reject" => Some(OnBusy::Reject),
            "wait" => Some(OnBusy::Wait),
            "interrupt" => Some(OnBusy::Interrupt),
            _ => None,
        }
    }
}

/// The lease settings of a run.
#[derive(Debug, Clone)]
pub struct LeasePolicy {
    /// How long a lease lasts after its last renewal; a crashed holder on another machine is
    /// taken over this long after it stopped renewing. Renewed every `ttl / 3`.
    pub ttl: Duration,
    /// What to do when another execution holds the thread.
    pub on_busy: OnBusy,
    /// How long `Wait` / `Interrupt` wait for the lease before `EngineError::LeaseBusy`.
    pub busy_timeout: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            ttl: Duration::from_secs_f64(super::config::DEFAULT_LEASE_TTL_SECONDS),
            on_busy: OnBusy::Reject,
            busy_timeout: Duration::from_secs_f64(super::config::DEFAULT_BUSY_TIMEOUT_SECONDS),
        }
    }
}

/// This process, as a lease row records it.
struct Me {
    host: String,
    pid: i64,
    pid_start: i64,
}

fn me() -> &'static Me {
    static ME: OnceLock<Me> = OnceLock::new();
    ME.get_or_init(|| {
        let pid = std::process::id() as i64;
        Me { host: host_identity(), pid, pid_start: proc_start(pid).unwrap_or(0) }
    })
}

/// Hostname, boot and PID namespace: two holders with the same identity see the same PIDs, so a
/// PID check is meaningful between them (containers on one host differ in their namespace).
fn host_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).unwrap_or_default();
    let mut name = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    let host = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        "unknown".into()
    };
    let pidns = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{host}|{}|{pidns}", read("/proc/sys/kernel/random/boot_id"))
}

/// Field 22 of /proc/PID/stat (start time in clock ticks), or None when the process is gone or a
/// zombie (killed, not yet reaped: it will never write again).
fn proc_start(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Runs of this process that hold or are taking a thread's lease, by (thread, run id), with a
/// count in case a caller reuses a run id. A run is entered *before* its acquire reaches the
/// store and leaves when its `Lease` drops: entered only after the acquire returned, a second run
/// of this process reading the lease row in between took the first for dead and stole its lease.
fn live_runs() -> &'static Mutex<HashMap<(String, String), usize>> {
    static LIVE: OnceLock<Mutex<HashMap<(String, String), usize>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// This run's entry in `live_runs`, removed on drop.
pub(super) struct LiveRun {
    key: (String, String),
}

impl LiveRun {
    fn enter(thread_id: &str, run_id: &str) -> Self {
        let key = (thread_id.to_owned(), run_id.to_owned());
        *live_runs().lock().unwrap_or_else(|p| p.into_inner()).entry(key.clone()).or_insert(0) += 1;
        LiveRun { key }
    }
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        let mut live = live_runs().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = live.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.key);
            }
        }
    }
}

/// How many runs of this process under `run_id` hold or are taking `thread_id`'s lease.
fn live_entries(thread_id: &str, run_id: &str) -> usize {
    let live = live_runs().lock().unwrap_or_else(|p| p.into_inner());
    live.get(&(thread_id.to_owned(), run_id.to_owned())).copied().unwrap_or(0)
}

/// The holder is this process.
fn is_me(info: &LeaseInfo) -> bool {
    let me = me();
    info.host == me.host && info.pid == me.pid && info.pid_start == me.pid_start
}

/// A holder that can be proven dead: same machine and PID namespace, and its process is gone (or
/// is this process, which no longer runs anything under that token). A holder elsewhere is alive
/// until its lease expires.
pub(super) fn holder_is_dead(thread_id: &str, asking_run: &str, info: &LeaseInfo) -> bool {
    let me = me();
    if info.host != me.host || !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    if is_me(info) {
        // The asking run is in `live_runs` itself: a holder with its run id (a caller reusing run
        // ids, or a retry of a run that died) is alive only if another entry exists.
        return live_entries(thread_id, &info.holder) <= usize::from(info.holder == asking_run);
    }
    proc_start(info.pid) != Some(info.pid_start)
}

/// A run of this process dropped before it held its lease, maybe while taking it (the take's
/// write may land after the drop, and no `Lease` is left to release it): other processes found
/// the row held until `lease_ttl` (red-team, session 24: 4 of 15 resumes elsewhere waited out a
/// 60 s lease). The row is looked at a few times over a few seconds, and released if this run
/// holds it, by its token. A run of this process under the same run id (a caller reusing ids)
/// is in `live_runs` and keeps it.
pub(super) async fn release_if_taken(store: &dyn Checkpointer, thread_id: &str, run_id: &str) {
    for pause in [0, 100, 500, 2000] {
        sleep(Duration::from_millis(pause)).await;
        let info = match store.lease_get(thread_id).await {
            Ok(Some(info)) => info,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(thread_id = %thread_id, "could not read the lease of a run dropped while taking it: {e}");
                continue;
            }
        };
        if info.holder != run_id || !is_me(&info) || !info.is_live() {
            continue;
        }
        if live_entries(thread_id, run_id) > 0 {
            return;
        }
        if let Err(e) = store.lease_release(thread_id, info.token).await {
            tracing::warn!(thread_id = %thread_id, "could not release the lease of a run dropped while taking it (it expires by itself): {e}");
        }
        return;
    }
}

/// The lease a run holds.
pub struct Lease {
    /// The thread leased.
    pub thread_id: String,
    /// The fencing token: every write of the run carries it, and the store refuses it once a newer
    /// holder took the thread.
    pub token: i64,
    ttl: Duration,
    next_renewal: Mutex<Instant>,
    /// Until when the store surely still holds the lease for this run: the TTL counted from
    /// the moment the last acquire or renewal that succeeded was sent (the store counts from
    /// when it got it, later). Past it, a newer holder may have taken the thread: no tool call
    /// may start (a process frozen past its lease, thawed, started sibling calls that the new
    /// holder had already run and recorded).
    held_until: Mutex<Instant>,
    /// The `lease_renew` failpoint fired: renewals stop for the rest of the run (a partition).
    cut_off: std::sync::atomic::AtomicBool,
    /// The run's last commit freed the lease in its own transaction.
    released: std::sync::atomic::AtomicBool,
    /// Keeps the run in `live_runs` for as long as it holds the lease.
    _live: LiveRun,
    /// The run waited for another live holder before it got the lease (`on_busy` wait or
    /// interrupt): what it loads is what that run left, not what its caller saw.
    pub waited: bool,
    /// The thread's head version when the run first found the lease held (None: it did not wait,
    /// or the thread had no state). A holder that wrote nothing (a recovery check, a `{}` on a
    /// paused thread) leaves it as it was: the caller saw that thread, and its `{}` goes on.
    pub waited_from: Option<i64>,
}

impl Lease {
    /// When the run should renew next.
    pub fn renewal_due(&self) -> Instant {
        *self.next_renewal.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn schedule(&self, after: Duration) {
        *self.next_renewal.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now() + after;
    }

    /// How long the lease is surely still held (zero once it may have expired).
    pub fn surely_held_for(&self) -> Duration {
        self.held_until.lock().unwrap_or_else(|p| p.into_inner()).saturating_duration_since(Instant::now())
    }

    fn fresh(ttl: Duration, sent: Instant) -> (Mutex<Instant>, Mutex<Instant>) {
        (Mutex::new(Instant::now() + ttl / 3), Mutex::new(sent + ttl))
    }

    /// Renews if due. `false`: a newer holder took the thread; the run must stop writing.
    pub async fn renew(&self, store: &dyn Checkpointer, cfg: &RunConfig) -> bool {
        if Instant::now() < self.renewal_due() {
            return true;
        }
        self.schedule(self.ttl / 3);
        // Crash tests: `raise` cuts the run off from the store's lease row from then on, as a
        // network partition would; the lease then expires under the live run.
        use std::sync::atomic::Ordering;
        if self.cut_off.load(Ordering::Acquire) || cfg.failpoints.hit("lease_renew", &self.thread_id).await.is_err() {
            self.cut_off.store(true, Ordering::Release);
            return true;
        }
        let sent = Instant::now();
        match store.lease_renew(&self.thread_id, self.token, self.ttl).await {
            Ok(true) => {
                *self.held_until.lock().unwrap_or_else(|p| p.into_inner()) = sent + self.ttl;
                true
            }
            Ok(false) => {
                inc(&metrics().leases_lost);
                tracing::error!(
                    thread_id = %self.thread_id,
                    run_id = %cfg.run_id,
                    event = "lease_lost",
                    "run lost its lease on the thread (token {} superseded); it stops and writes nothing more",
                    self.token
                );
                false
            }
            Err(e) => {
                // Not a verdict: fencing still refuses our writes if someone took over meanwhile.
                tracing::warn!(thread_id = %self.thread_id, "lease renewal failed, will retry: {e}");
                self.schedule(Duration::from_millis(200).min(self.ttl / 3));
                true
            }
        }
    }

    /// Renews now, whatever the schedule: whether the store still holds the lease for this run
    /// (a lease past its TTL that nobody took is renewed). False when a newer holder has the
    /// thread or the store could not say (a run cut off from it by the `lease_renew` failpoint
    /// cannot either).
    pub async fn confirm(&self, store: &dyn Checkpointer, cfg: &RunConfig) -> bool {
        if self.cut_off.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        *self.next_renewal.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.renew(store, cfg).await && !self.surely_held_for().is_zero()
    }

    /// The error of a run that no longer holds this lease (no newer token known).
    pub fn fenced(&self) -> StoreError {
        StoreError::Fenced { thread_id: self.thread_id.clone(), token: self.token, current: None }
    }

    /// Records that the run's last commit freed the lease in its own transaction.
    pub fn mark_released(&self) {
        self.released.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the lease was freed by the run's last commit (nothing left to release).
    pub fn released(&self) -> bool {
        self.released.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The lease's token and its entry among this process's live runs, for a run whose future
    /// was dropped holding it (`run_loop::abandoned` keeps both until its late writes land).
    pub(super) fn into_parked(self) -> (i64, Duration, LiveRun) {
        (self.token, self.ttl, self._live)
    }

    /// Frees the thread for the next run at once.
    pub async fn release(&self, store: &dyn Checkpointer) {
        if let Err(e) = store.lease_release(&self.thread_id, self.token).await {
            tracing::warn!(thread_id = %self.thread_id, "could not release the lease (it expires by itself): {e}");
        }
    }
}

/// What this run asks of the store when it takes the thread's lease.
pub(super) fn request(cfg: &RunConfig) -> LeaseRequest {
    let me = me();
    LeaseRequest {
        holder: cfg.run_id.clone(),
        host: me.host.clone(),
        pid: me.pid,
        pid_start: me.pid_start,
        ttl: cfg.lease.ttl,
        steal: None,
        // The owner check happens in the take itself, so another user's run never moves the
        // owner's lease row (fencing token, holder).
        user_id: Some(cfg.thread.user_id.clone()),
        owner_scoped: cfg.thread.owner_scoped,
    }
}

/// A run about to take its lease together with its input (`Checkpointer::put_input_leased`):
/// entered in `live_runs` before the take reaches the store, as `acquire` does; and when.
pub struct Taking(LiveRun, Instant);

pub(super) fn taking(cfg: &RunConfig) -> Taking {
    Taking(LiveRun::enter(&cfg.thread.thread_id, &cfg.run_id), Instant::now())
}

impl Taking {
    /// The lease the store granted with the run's input.
    pub(super) fn taken(self, cfg: &RunConfig, token: i64) -> Lease {
        inc(&metrics().leases_acquired);
        let (next_renewal, held_until) = Lease::fresh(cfg.lease.ttl, self.1);
        Lease {
            thread_id: cfg.thread.thread_id.clone(),
            token,
            ttl: cfg.lease.ttl,
            next_renewal,
            held_until,
            cut_off: Default::default(),
            released: Default::default(),
            _live: self.0,
            waited: false,
            waited_from: None,
        }
    }
}

/// Takes the thread's lease for this run, following `cfg.lease.on_busy` when it is held.
pub async fn acquire(store: &dyn Checkpointer, cfg: &RunConfig) -> Result<Lease, EngineError> {
    let policy = &cfg.lease;
    let thread_id = cfg.thread.thread_id.clone();
    let mut req = request(cfg);
    let started = Instant::now();
    let deadline = started + policy.busy_timeout;
    let mut pause = Duration::from_millis(10);
    let mut asked = false;
    let mut waited = false;
    let mut waited_from: Option<i64> = None;
    let mut live = Some(LiveRun::enter(&thread_id, &cfg.run_id));
    let mut settle_pause = Duration::from_millis(1);
    loop {
        if super::run_loop::settling_thread(&thread_id) {
            // A run of this process whose caller dropped it, its late ledger writes (the results
            // of tools that returned before the drop) still on their way: taking the thread now
            // would run a returned tool again. Not a busy holder, whatever `on_busy` says: the
            // caller's own retry waits for them (milliseconds), at most `busy_timeout` here too.
            // Checked before the store is asked: the parked lease is kept renewed, but one whose
            // renewal failed must not let this run in early either.
            if Instant::now() >= deadline {
                inc(&metrics().busy_rejections);
                return Err(EngineError::Settling {
                    thread_id: thread_id.clone(),
                    waited: started.elapsed().as_secs_f64(),
                });
            }
            sleep(settle_pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            settle_pause = (settle_pause * 2).min(Duration::from_millis(50));
            continue;
        }
        let sent = Instant::now();
        let attempt = match store.lease_acquire(&thread_id, &req).await {
            // A holder frozen (or slow) inside a transaction holds the lease row's lock: busy, not
            // broken. A caller told to wait waits on through it, to its own `busy_timeout`; it got
            // STORAGE_TRANSIENT_001 at the store's lock wait (5 s) whatever it asked for
            // (red-team, session 41). Reject and the deadline passed keep the error.
            Err(StoreError::LockWait { .. }) if policy.on_busy != OnBusy::Reject && Instant::now() < deadline => {
                note_wait(store, cfg, &mut waited, &mut waited_from).await;
                sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
                pause = (pause * 2).min(Duration::from_millis(200));
                continue;
            }
            other => other?,
        };
        let info = match attempt {
            LeaseAttempt::Acquired { token } => {
                inc(&metrics().leases_acquired);
                if !cfg.failpoints.is_off() {
                    // A raise leaves the lease row behind, as a crash would: this run has left
                    // `live_runs`, so the next run of this process takes it over at once.
                    cfg.failpoints.hit("after_lease", &thread_id).await?;
                }
                if req.steal.is_some() {
                    inc(&metrics().leases_taken_over);
                    tracing::info!(thread_id = %thread_id, token, "took over the lease of a holder whose process is gone");
                }
                let (next_renewal, held_until) = Lease::fresh(policy.ttl, sent);
                let _live = live.take().expect("entered once, taken once");
                return Ok(Lease {
                    thread_id,
                    token,
                    ttl: policy.ttl,
                    next_renewal,
                    held_until,
                    cut_off: Default::default(),
                    released: Default::default(),
                    _live,
                    waited,
                    waited_from,
                });
            }
            LeaseAttempt::Held(info) => info,
        };
        if holder_is_dead(&thread_id, &cfg.run_id, &info) && req.steal != Some(info.token) {
            req.steal = Some(info.token);
            continue;
        }
        req.steal = None;
        match policy.on_busy {
            OnBusy::Reject => {
                inc(&metrics().busy_rejections);
                return Err(busy(store, cfg, info, 0.0).await);
            }
            OnBusy::Wait | OnBusy::Interrupt => {
                if policy.on_busy == OnBusy::Interrupt {
                    // Asked on each wait, written only where nothing is pending: a request in the
                    // way (a stale stop, a void preemption, which the holder clears at its next
                    // check) kept the first from being written, and the caller waited out
                    // busy_timeout; a clear of such a request may also take this one with it
                    // (red-teams, session 36). A user's stop pending stays as it is.
                    asked |= request_preempt(store, cfg).await;
                }
                let now = Instant::now();
                if now >= deadline {
                    inc(&metrics().busy_rejections);
                    if asked {
                        withdraw_preempt(store, cfg).await;
                    }
                    return Err(busy(store, cfg, info, started.elapsed().as_secs_f64().max(0.001)).await);
                }
                note_wait(store, cfg, &mut waited, &mut waited_from).await;
                sleep(pause.min(deadline - now)).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
        }
    }
}

/// A wait begins: the version the thread was at is read once (the contended path only; it sleeps
/// next anyway), so a bare resume can tell whether the holder moved the thread meanwhile.
async fn note_wait(store: &dyn Checkpointer, cfg: &RunConfig, waited: &mut bool, waited_from: &mut Option<i64>) {
    if !*waited {
        *waited_from = store.load_with(&cfg.thread, None).await.ok().flatten().map(|cp| cp.version);
    }
    *waited = true;
}

/// The busy error, naming the holder (run id, pid, token) only to the thread's owner: under user
/// isolation a run the caller cannot be shown to own (the thread has no owner yet, or the owner
/// check cannot be read) is described as "another execution", nothing more.
async fn busy(store: &dyn Checkpointer, cfg: &RunConfig, info: LeaseInfo, waited: f64) -> EngineError {
    let shown = match store.is_owner(&cfg.thread).await {
        Ok(true) => Some(info),
        Ok(false) => None,
        Err(e) => {
            tracing::warn!(thread_id = %cfg.thread.thread_id, "could not read the thread's owner; the busy error names no holder: {e}");
            None
        }
    };
    EngineError::LeaseBusy { thread_id: cfg.thread.thread_id.clone(), holder: shown, waited }
}

/// Asks the running execution (in any process) to stop at its next safe point: a soft stop
/// request in the store, plus the in-process signal for a run of this process.
///
/// The request names its requester (run id and process), and expires when the requester stops
/// waiting (`busy_timeout`): a requester that gave up or was cancelled cut the running turn short
/// at its next safe point anyway, and nobody took the thread (red-team, session 30). One that
/// gives up withdraws it; a run finds one of a requester that is gone (`preempter_gone`) void.
///
/// Whether the request was written. Not written, the signal still goes out: the holder's check
/// it wakes clears a stale request in the way.
async fn request_preempt(store: &dyn Checkpointer, cfg: &RunConfig) -> bool {
    let key = stop_key(&cfg.thread.thread_id, &cfg.thread.user_id);
    let me = me();
    let value = json!({"preempt": cfg.run_id, "host": me.host, "pid": me.pid, "pid_start": me.pid_start});
    let ttl = cfg.lease.busy_timeout.as_secs_f64().clamp(1.0, 3600.0);
    // Only where no request is pending: a user's hard stop under this key must stay hard (it
    // ends a hung node; a preemption waits for the next safe point).
    let written = match store.cache_put_absent(STOP_NAMESPACE, &key, &value, Some(ttl)).await {
        Ok(written) => written,
        Err(e) => {
            tracing::warn!(thread_id = %cfg.thread.thread_id, "could not ask the running execution to stop: {e}");
            false
        }
    };
    StopSignals::global().signal(&key);
    if written {
        inc(&metrics().preempt_requests);
    }
    written
}

/// A requester that gave up withdraws its preemption request, where it is still its own (a
/// user's stop written since stays). Read, then cleared: a stop written between the two is lost,
/// a window of one round trip.
async fn withdraw_preempt(store: &dyn Checkpointer, cfg: &RunConfig) {
    let key = stop_key(&cfg.thread.thread_id, &cfg.thread.user_id);
    match store.cache_get(STOP_NAMESPACE, &key).await {
        Ok(Some(v)) if v.get("preempt").and_then(serde_json::Value::as_str) == Some(cfg.run_id.as_str()) => {
            if let Err(e) = store.cache_clear(STOP_NAMESPACE, &key).await {
                tracing::warn!(thread_id = %cfg.thread.thread_id, "could not withdraw a preemption request (it expires by itself): {e}");
            }
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(thread_id = %cfg.thread.thread_id, "could not withdraw a preemption request (it expires by itself): {e}")
        }
    }
}

/// Whether the requester of a preemption `request` is shown to have stopped asking: a run of this
/// process no longer taking or holding `thread_id` (its caller cancelled it, or it gave up), or a
/// process of this machine that is gone. A requester elsewhere is believed until its request
/// expires; a request without a requester (an older version's) too.
pub(super) fn preempter_gone(thread_id: &str, request: &serde_json::Value) -> bool {
    let (Some(run), Some(host), Some(pid), Some(pid_start)) = (
        request.get("preempt").and_then(serde_json::Value::as_str),
        request.get("host").and_then(serde_json::Value::as_str),
        request.get("pid").and_then(serde_json::Value::as_i64),
        request.get("pid_start").and_then(serde_json::Value::as_i64),
    ) else {
        return false;
    };
    let me = me();
    if host != me.host || !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    if pid == me.pid && pid_start == me.pid_start {
        return live_entries(thread_id, run) == 0;
    }
    proc_start(pid) != Some(pid_start)
}
