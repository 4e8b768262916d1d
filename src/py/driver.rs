//! Rust futures driven from the asyncio thread that awaits them.
//!
//! A `Driver` holds the future and polls it on the event-loop thread, inside the tokio runtime's
//! context: sqlx I/O and tokio timers register with the runtime, whose worker threads keep driving
//! the I/O and timer drivers. Python work the future awaits (node, tool and lifecycle coroutines)
//! is started on the same loop directly (src/py/bridge.rs), so a node or a tool costs no hop
//! between threads.
//!
//! Waking: on the loop thread (a task's done-callback, the future waking itself) the next poll is
//! scheduled with `call_soon`. From any other thread (I/O completion, a timer, a task spawned on
//! the runtime, another loop's thread) the waker queues the driver on its loop thread's [`Hub`]
//! and writes one byte to the hub's socket, which every loop run on that thread watches with
//! `add_reader` (registered once per loop by `tenxgraph._bridge`, not once per await: asyncio's
//! `add_reader`/`remove_reader` and a socket pair per awaited call were ~5% of a memory-backend
//! turn), without touching the interpreter: a runtime thread that re-takes the interpreter lock
//! during finalization aborts the process, which is what pyo3-async-runtimes'
//! `call_soon_threadsafe` hand-off did when a program ended right after a run.
//!
//! Dropping the future (the awaiting task cancelled, the driver collected) happens on a Python
//! thread with the interpreter held, in the runtime's context: the Python tasks it awaited are
//! cancelled there and then, and a store transaction it left open is rolled back by a task on the
//! runtime.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use std::future::Future;
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;

type Convert = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;
type BoxFuture = Pin<Box<dyn Future<Output = Convert> + Send>>;

/// What the waker needs to schedule a poll from the loop thread: `loop.call_soon`, the driver
/// itself (callable: one poll), and the keyword arguments (`context=`) of the call.
struct Schedule {
    call_soon: Py<PyAny>,
    step: Py<PyAny>,
    kwargs: Py<PyDict>,
}

/// The wakes from other threads for the drivers of one loop thread: the drivers woken, and the
/// socket pair that tells the loop (the reader is watched by every loop run on the thread).
///
/// Its sockets are never closed: when its thread ends the hub goes to its process's free list and
/// the next thread that needs one takes it. A loop that awaited on the ended thread and is still alive
/// keeps asyncio's record of the reader's fd number; had the socket closed, the OS would have
/// dropped it from the loop's selector, and another library's socket given the same number would
/// have been "already registered" for that loop: its `add_reader` only swaps asyncio's callback,
/// the socket is never polled, and its awaits hang. A fd number that names a hub names that hub
/// for the life of the process. (`ManuallyDrop`: no path closes them, a forked child's copies of
/// its parent's hubs included.)
pub struct Hub {
    reader: ManuallyDrop<UnixStream>,
    writer: ManuallyDrop<UnixStream>,
    woken: Mutex<Vec<Arc<Shared>>>,
    /// The process it was made in: a child forked from it makes its own (the inherited sockets
    /// are shared with the parent, which could read the child's wakes).
    pid: u32,
}

/// The hubs of ended threads of one process, ready for the next thread.
struct FreeList {
    pid: u32,
    hubs: Mutex<Vec<Arc<Hub>>>,
}

/// This process's [`FreeList`] (leaked: `'static`).
static FREE: AtomicPtr<FreeList> = AtomicPtr::new(std::ptr::null_mut());

/// This process's free list. A forked child makes its own and never touches its parent's: a
/// thread of the parent may have held its lock at the fork (a thread ending then, giving its hub
/// back), and its hubs are the parent's (they stay open in the child, unused).
fn free_list() -> &'static FreeList {
    let pid = super::pid::current();
    loop {
        let current = FREE.load(Ordering::Acquire);
        // SAFETY: FREE only ever holds null or a leaked `Box<FreeList>`, never freed.
        if let Some(list) = unsafe { current.as_ref() }.filter(|l| l.pid == pid) {
            return list;
        }
        let made = Box::into_raw(Box::new(FreeList { pid, hubs: Mutex::new(Vec::new()) }));
        if FREE.compare_exchange(current, made, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            // SAFETY: just leaked above, and now published for good.
            return unsafe { &*made };
        }
        // Another thread of this process got there first: use its list.
        // SAFETY: `made` was never published.
        drop(unsafe { Box::from_raw(made) });
    }
}

/// A thread's own hub; given back to this process's free list when the thread ends.
struct Owned(Arc<Hub>);

impl Drop for Owned {
    fn drop(&mut self) {
        // Not when a forked child replaces its parent's hub (the forking thread's): that one stays
        // the parent's, and is never used here again.
        if self.0.pid == super::pid::current() {
            free_list().hubs.lock().unwrap_or_else(|p| p.into_inner()).push(self.0.clone());
        }
    }
}

thread_local! {
    static HUB: std::cell::RefCell<Option<Owned>> = const { std::cell::RefCell::new(None) };
}

/// An ended thread's hub of this process, the one freed last first.
fn take_free() -> Option<Arc<Hub>> {
    free_list().hubs.lock().unwrap_or_else(|p| p.into_inner()).pop()
}

impl Hub {
    /// This thread's hub: an ended thread's, or one made on first use (and again in a forked child).
    fn here() -> PyResult<Arc<Hub>> {
        HUB.with(|cell| {
            let pid = super::pid::current();
            if let Some(Owned(h)) = cell.borrow().as_ref().filter(|h| h.0.pid == pid) {
                return Ok(h.clone());
            }
            let hub = match take_free() {
                Some(hub) => hub,
                None => {
                    let os_err = |e: std::io::Error| pyo3::exceptions::PyOSError::new_err(e.to_string());
                    let (reader, writer) = UnixStream::pair().map_err(os_err)?;
                    reader.set_nonblocking(true).map_err(os_err)?;
                    writer.set_nonblocking(true).map_err(os_err)?;
                    Arc::new(Hub {
                        reader: ManuallyDrop::new(reader),
                        writer: ManuallyDrop::new(writer),
                        woken: Mutex::new(Vec::new()),
                        pid,
                    })
                }
            };
            *cell.borrow_mut() = Some(Owned(hub.clone()));
            Ok(hub)
        })
    }

    fn wake(&self, shared: Arc<Shared>) {
        self.woken.lock().unwrap_or_else(|p| p.into_inner()).push(shared);
        let _ = (&*self.writer).write_all(&[1]); // a full socket is already readable: the loop will look
    }
}

/// The socket this thread's loops watch for wakes from other threads (`add_reader`).
pub fn hub_fileno() -> PyResult<i32> {
    Ok(Hub::here()?.reader.as_raw_fd())
}

fn unwatch_helper(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static HELPER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    HELPER.import(py, "tenxgraph._bridge", "_unwatch")
}

/// The reader callback of the hub's socket `fd`: takes the wake bytes, then schedules a poll of every driver woken
/// from another thread since the last call. One read: bytes left over keep the socket readable,
/// which costs one more call that finds nothing (a read until EAGAIN cost a syscall every time).
///
/// `fd` is the hub socket the loop registered this callback for, on a thread it ran on earlier:
/// when it is not this thread's (that thread ended and its hub is another thread's now, or free),
/// the loop stops watching it and takes nothing: reading there would take another thread's
/// wakes and call its loops' `call_soon` from this thread.
pub fn hub_run(py: Python<'_>, fd: i32) -> PyResult<()> {
    let hub = Hub::here()?;
    if hub.reader.as_raw_fd() != fd {
        return unwatch_helper(py)?.call1((fd,)).map(drop);
    }
    let mut buf = [0u8; 256];
    let _ = (&*hub.reader).read(&mut buf); // WouldBlock: called with nothing to read
    let woken = std::mem::take(&mut *hub.woken.lock().unwrap_or_else(|p| p.into_inner()));
    let mut first_err = None;
    let here = std::thread::current().id();
    for shared in woken {
        // Started on the thread that had this hub before (its loop now runs elsewhere, if at all):
        // its `call_soon` is not this thread's to call.
        if shared.loop_thread.get() != Some(&here) {
            continue;
        }
        let scheduled = {
            let guard = shared.schedule.lock().unwrap_or_else(|p| p.into_inner());
            guard.as_ref().map(|s| (s.call_soon.clone_ref(py), s.step.clone_ref(py), s.kwargs.clone_ref(py)))
        };
        // None: the driver has ended since it was woken, nothing to poll.
        let Some((call_soon, step, kwargs)) = scheduled else { continue };
        // Scheduled with `call_soon(step, context=...)`, as a wake on the loop thread is: this
        // callback runs in whatever context the reader was registered in, and a poll made here
        // would give the run's Python code (log fields, contextvars) another run's values.
        if let Err(e) = call_soon.bind(py).call((step.bind(py),), Some(kwargs.bind(py))) {
            first_err.get_or_insert(e); // every other woken driver is still scheduled
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// The waker's side of a driver; shared with every waker the future hands out.
struct Shared {
    loop_thread: OnceLock<ThreadId>,
    /// A poll is already scheduled: further wakes until it runs are free.
    scheduled: AtomicBool,
    /// The loop thread's hub, set when the driver starts (no waker exists before its first poll).
    hub: OnceLock<Arc<Hub>>,
    /// Set while the driver runs; cleared when it ends, which also breaks the reference cycle
    /// driver -> shared -> driver. Only read on the loop thread, attached.
    schedule: Mutex<Option<Schedule>>,
}

impl Shared {
    fn wake_here(&self) -> bool {
        if self.loop_thread.get() != Some(&std::thread::current().id()) {
            return false;
        }
        // On the loop thread every caller of Rust code is Python code, attached: this only
        // re-enters the interpreter lock the thread already holds.
        Python::try_attach(|py| {
            let guard = self.schedule.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(s) => s.call_soon.bind(py).call((s.step.bind(py),), Some(s.kwargs.bind(py))).is_ok(),
                None => true, // the driver has ended: nothing to poll
            }
        })
        .unwrap_or(false)
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        if !self.wake_here()
            && let Some(hub) = self.hub.get()
        {
            hub.wake(self.clone());
        }
    }
}

/// A Rust future awaited from asyncio and polled on the awaiting loop's thread (see the module
/// comment). Awaiting it more than once is an error.
#[pyclass(module = "tenxgraph._core", frozen)]
pub struct Driver {
    fut: Mutex<Option<BoxFuture>>,
    shared: Arc<Shared>,
    /// The asyncio future the result goes to.
    done: Mutex<Option<Py<PyAny>>>,
}

/// Wraps `fut` in a `Driver`; nothing runs until it is awaited.
pub fn drive<F, T, C>(py: Python<'_>, fut: F, convert: C) -> PyResult<Py<Driver>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
{
    super::runtime::check_not_forked(py)?;
    let fut: BoxFuture = Box::pin(async move {
        let out = fut.await;
        Box::new(move |py: Python<'_>| convert(py, out)) as Convert
    });
    let shared = Arc::new(Shared {
        loop_thread: OnceLock::new(),
        scheduled: AtomicBool::new(false),
        hub: OnceLock::new(),
        schedule: Mutex::new(None),
    });
    keep_a_timer_pending();
    Py::new(py, Driver { fut: Mutex::new(Some(fut)), shared, done: Mutex::new(None) })
}

fn drive_helper(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static HELPER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    HELPER.import(py, "tenxgraph._bridge", "drive")
}

impl Driver {
    /// Drops the future inside the runtime's context (a drop may spawn a rollback).
    fn drop_future(&self) {
        let fut = self.fut.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(fut) = fut {
            let _enter = pyo3_async_runtimes::tokio::get_runtime().enter();
            drop(fut);
        }
    }

    fn finish(&self, py: Python<'_>, outcome: PyResult<Py<PyAny>>) -> PyResult<()> {
        self.shared.schedule.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        let done = done.bind(py);
        if done.call_method0("done")?.is_truthy()? {
            return Ok(()); // the awaiting task was cancelled meanwhile
        }
        match outcome {
            Ok(v) => done.call_method1("set_result", (v,))?,
            Err(e) => done.call_method1("set_exception", (e.into_value(py),))?,
        };
        Ok(())
    }
}

#[pymethods]
impl Driver {
    /// Binds the driver to the running loop (`call_soon` with `context`) and the asyncio future
    /// `done` its outcome goes to, then polls once.
    fn start(
        slf: &Bound<'_, Self>,
        event_loop: &Bound<'_, PyAny>,
        context: &Bound<'_, PyAny>,
        done: Py<PyAny>,
    ) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        if me.shared.loop_thread.set(std::thread::current().id()).is_err() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("this native awaitable was already awaited"));
        }
        let _ = me.shared.hub.set(Hub::here()?);
        let kwargs = PyDict::new(py);
        kwargs.set_item("context", context)?;
        *me.shared.schedule.lock().unwrap_or_else(|p| p.into_inner()) = Some(Schedule {
            call_soon: event_loop.getattr("call_soon")?.unbind(),
            step: slf.clone().into_any().unbind(),
            kwargs: kwargs.unbind(),
        });
        *me.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(done);
        me.shared.scheduled.store(true, Ordering::Release);
        Self::__call__(slf)
    }

    /// One poll of the future, on the loop thread; sets the outcome on `done` when it is ready.
    fn __call__(slf: &Bound<'_, Self>) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        me.shared.scheduled.store(false, Ordering::Release);
        let ready = {
            // A poll never runs inside another (the loop calls this from its own callbacks), but a
            // re-entrant call must not deadlock: it is dropped, the outer poll sees the wake.
            let Ok(mut guard) = me.fut.try_lock() else {
                return Ok(());
            };
            let Some(fut) = guard.as_mut() else {
                return Ok(());
            };
            let waker = Waker::from(me.shared.clone());
            let mut cx = Context::from_waker(&waker);
            let _enter = pyo3_async_runtimes::tokio::get_runtime().enter();
            // A panic must end the await with an error: raised from a `call_soon` callback it
            // would only be logged by the loop, and the awaiting task would wait forever.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
                Ok(Poll::Pending) => return Ok(()),
                Ok(Poll::Ready(convert)) => {
                    *guard = None;
                    convert
                }
                Err(panic) => {
                    *guard = None;
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    Box::new(move |_py: Python<'_>| {
                        Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                            "the native call failed with an internal error: {what}"
                        )))
                    }) as Convert
                }
            }
        };
        let outcome = ready(py);
        me.finish(py, outcome)
    }

    /// Drops the Rust future here and now (and with it any Python work it awaits).
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        self.drop_future();
        self.finish(py, Err(pyo3::exceptions::asyncio::CancelledError::new_err("the native call was cancelled")))
    }

    fn __await__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        drive_helper(py)?.call1((slf,))?.call_method0("__await__")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Collected without having finished (never awaited, or its awaiting coroutine was closed).
        self.drop_future();
    }
}

/// Keeps one tokio timer pending at all times, [`ANCHOR_PERIOD`] ahead at most. The time driver
/// wakes a parked worker (an eventfd write, then the worker's epoll round) whenever a timer is
/// registered that is due before every pending one; with the run polled on the loop thread, each
/// node's and each tool's deadline was such a timer (its predecessor was cancelled when the call
/// returned), ~5% of the loop thread's samples in a memory-backend turn. A deadline later than
/// the anchor registers without a wake.
fn keep_a_timer_pending() {
    static ANCHOR: std::sync::Once = std::sync::Once::new();
    ANCHOR.call_once(|| {
        pyo3_async_runtimes::tokio::get_runtime().spawn(async {
            loop {
                tokio::time::sleep(ANCHOR_PERIOD).await;
            }
        });
    });
}

/// How far ahead the anchor timer is at most. Below the loop's stop poll (500 ms, re-armed at
/// every node): with a 1 s anchor that timer was due first about half the time, one worker wake
/// (a write to tokio's eventfd from the loop thread) per node. The anchor costs four worker
/// wake-ups a second.
pub const ANCHOR_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);
