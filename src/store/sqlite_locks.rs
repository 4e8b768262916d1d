//! Our bundled SQLite takes its file locks as Linux open-file-description (OFD) locks.
//!
//! Why: the wheel links its own SQLite, and an application may open the same file with Python's
//! `sqlite3` (a second SQLite library) in the same process. Classic POSIX `fcntl` locks belong to
//! the process, so (a) the two libraries never see each other's locks: the stdlib copy, believing
//! its connection is the last one, checkpoints and deletes the WAL and `-shm` under ours, and
//! (b) closing *any* descriptor of the file drops every POSIX lock the process holds on it. The
//! next operation of ours then fails with `disk I/O error` (522) or worse. OFD locks belong to an
//! open file description instead: they conflict with POSIX locks even inside one process (the
//! stdlib copy gets SQLITE_BUSY and retries) and only closing that description releases them.
//!
//! How: the unix VFS calls `fcntl` and `close` through a table that `xSetSystemCall` can
//! override; we replace both once, before our first connection opens. SQLite shares one lock
//! state per inode among all connections of the process and issues each lock call on whichever
//! connection's descriptor makes the transition, which is fine for POSIX locks (one owner: the
//! process) but would leak OFD locks taken through one description and "released" through
//! another. So every lock call for an inode goes to ONE description: a `dup` of the first
//! descriptor SQLite locked through, kept while SQLite still has a descriptor of that inode it
//! has locked through. That mirrors POSIX semantics exactly (one lock owner per inode) minus the
//! drop-on-any-close. The `-shm` file is handled the same way (SQLite maps it through one
//! descriptor per inode and locks it with `fcntl` too).
//!
//! Lifetime: SQLite relies on `close` to drop the `-shm` dead-man-switch lock, and a kept `dup`
//! would hold it (and keep a deleted file's inode alive) forever; the `close` hook closes our dup
//! right after SQLite closes its last locking descriptor of the inode, which is the moment POSIX
//! would have dropped the locks. SQLite only closes a database descriptor once no connection of
//! the process holds a lock on the inode (its deferred-close list), so nothing is dropped early.
//!
//! The other way round: the stdlib copy's POSIX locks are dropped when OUR copy closes a
//! descriptor of the file (a pool connection closing). Its reader then lost its WAL read mark:
//! our next checkpoint and WAL restart overwrote frames it still read ("database disk image is
//! malformed"). So a close of an inode on which /proc/locks shows POSIX locks of this process
//! (ours are all OFD locks) is deferred: the descriptor is parked and closed at a later close
//! once those locks are gone. Remaining window: a stdlib lock taken between that check and the
//! close (microseconds); a stdlib connection held open forever keeps the parked descriptors
//! (one per connection we close) open as long.
//!
//! Only on Linux x86_64/aarch64: `fcntl` is variadic in C and stable Rust cannot define a variadic
//! function, so the shim takes the third argument as a plain machine word; on these ABIs a
//! variadic caller passes it in the same register a fixed-argument callee reads. Elsewhere
//! nothing changes.

/// Installs the OFD-lock shim into our SQLite's unix VFS, once per process. Must run before our
/// first connection opens: locks taken as POSIX locks and released as OFD ones would leak.
/// Failure (no OFD support: Linux < 3.15) leaves SQLite's default behaviour and logs a warning.
pub fn install() {
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    imp::install_once();
}

#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
mod imp {
    use libsqlite3_sys as ffi;
    use std::collections::{HashMap, HashSet};
    use std::ffi::{c_char, c_int};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, Once, OnceLock};

    type RealFcntl = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
    type RealClose = unsafe extern "C" fn(c_int) -> c_int;

    /// The entries we replaced, called for everything that is not ours to change.
    static REAL: OnceLock<(RealFcntl, RealClose)> = OnceLock::new();

    /// Per inode, the one description all of our SQLite's locks on it go through.
    struct Owner {
        dup: c_int,
        /// Our SQLite's descriptors of this inode that have made a lock call.
        fds: Vec<c_int>,
    }

    #[derive(Default)]
    struct Table {
        by_inode: HashMap<(u64, u64), Owner>,
        by_fd: HashMap<c_int, (u64, u64)>,
        /// Descriptors SQLite closed that we keep open for now, with their inode number.
        parked: Vec<(c_int, u64)>,
    }

    static TABLE: Mutex<Option<Table>> = Mutex::new(None);

    /// Set in a forked child: it shares our dups' descriptions (and so their locks) with the
    /// parent, so its table must start afresh.
    static FORKED: AtomicBool = AtomicBool::new(false);

    extern "C" fn after_fork_in_child() {
        FORKED.store(true, Ordering::Relaxed);
    }

    fn table() -> std::sync::MutexGuard<'static, Option<Table>> {
        // A panic cannot happen while the table is half-updated (no allocation failure is
        // recoverable anyway), so a poisoned lock still guards consistent data.
        let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        if FORKED.swap(false, Ordering::Relaxed) || t.is_none() {
            // Inherited dups are the parent's descriptions: never lock through them, never
            // close them here either (their fd numbers stay taken, which is harmless).
            *t = Some(Table::default());
        }
        t
    }

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
    }

    fn set_errno(e: c_int) {
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = e };
    }

    /// The description to lock `fd`'s inode through, registering `fd` as one of its users.
    fn owner_for(fd: c_int) -> Result<c_int, c_int> {
        {
            let mut guard = table();
            let t = guard.as_mut().expect("table() fills it");
            // Every close of a registered descriptor goes through close_shim, so a registered
            // number still names the inode it was registered for.
            if let Some(o) = t.by_fd.get(&fd).and_then(|key| t.by_inode.get(key)) {
                return Ok(o.dup);
            }
        }
        let key = inode_of(fd)?;
        let mut guard = table();
        let t = guard.as_mut().expect("table() fills it");
        if let Some(o) = t.by_inode.get_mut(&key) {
            if !o.fds.contains(&fd) {
                o.fds.push(fd);
            }
            t.by_fd.insert(fd, key);
            return Ok(o.dup);
        }
        // SAFETY: plain fcntl on a valid descriptor. CLOEXEC: an exec'd child must not inherit
        // (and keep alive) our locks. At least 3, like SQLite's own descriptors: a stray write
        // to a closed stdout/stderr must never land in the database.
        let dup = unsafe { real_fcntl()(fd, libc::F_DUPFD_CLOEXEC, 3 as c_int) };
        if dup < 0 {
            return Err(errno());
        }
        t.by_inode.insert(key, Owner { dup, fds: vec![fd] });
        t.by_fd.insert(fd, key);
        Ok(dup)
    }

    /// Drops `fd` from its inode's users; returns the dup to close when it was the last one.
    fn forget(t: &mut Table, fd: c_int, key: (u64, u64)) -> Option<c_int> {
        t.by_fd.remove(&fd);
        let o = t.by_inode.get_mut(&key)?;
        o.fds.retain(|f| *f != fd);
        if o.fds.is_empty() { t.by_inode.remove(&key).map(|o| o.dup) } else { None }
    }

    fn real_fcntl() -> RealFcntl {
        REAL.get().map_or(libc::fcntl as RealFcntl, |r| r.0)
    }

    fn real_close() -> RealClose {
        REAL.get().map_or(libc::close as RealClose, |r| r.1)
    }

    /// SQLite's `fcntl`: lock commands become OFD commands on the inode's one description.
    unsafe extern "C" fn fcntl_shim(fd: c_int, cmd: c_int, arg: usize) -> c_int {
        let ofd = match cmd {
            libc::F_SETLK => libc::F_OFD_SETLK,
            libc::F_SETLKW => libc::F_OFD_SETLKW,
            libc::F_GETLK => libc::F_OFD_GETLK,
            _ => return unsafe { real_fcntl()(fd, cmd, arg) },
        };
        let theirs = arg as *mut libc::flock;
        if theirs.is_null() {
            set_errno(libc::EFAULT);
            return -1;
        }
        let dup = match owner_for(fd) {
            Ok(d) => d,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        // OFD commands reject l_pid != 0, and SQLite leaves it uninitialised in places.
        // SAFETY: SQLite passes a valid struct flock for these commands.
        let mut lock = unsafe { *theirs };
        lock.l_pid = 0;
        // Not under the table lock: F_SETLKW may block. `fd` stays registered until SQLite
        // closes it, so the dup outlives this call.
        let rc = unsafe { real_fcntl()(dup, ofd, &mut lock as *mut libc::flock) };
        if rc == 0 && ofd == libc::F_OFD_GETLK {
            // SAFETY: as above.
            unsafe { *theirs = lock };
        }
        rc
    }

    /// SQLite's `close`: after its last locking descriptor of an inode, release our dup (and with
    /// it the inode's locks, as POSIX would have). A descriptor of an inode on which another
    /// library of this process holds POSIX locks is parked instead of closed: closing it would
    /// drop those locks (see the module comment), and closed later, once they are gone.
    unsafe extern "C" fn close_shim(fd: c_int) -> c_int {
        let mut close_now: Vec<c_int> = Vec::new();
        let mut park = false;
        {
            let mut guard = table();
            let t = guard.as_mut().expect("table() fills it");
            let registered = t.by_fd.get(&fd).copied();
            let key = registered.or_else(|| inode_of(fd).ok());
            // Deregistered before the number is freed, so a reuse cannot be mistaken for it.
            let dup = registered.and_then(|k| forget(t, fd, k));
            let ours = key.is_some_and(|k| dup.is_some() || t.by_inode.contains_key(&k));
            if ours || !t.parked.is_empty() {
                let foreign = foreign_posix_locked_inodes();
                t.parked.retain(|&(p, ino)| {
                    foreign.contains(&ino) || {
                        close_now.push(p);
                        false
                    }
                });
                match key {
                    Some((_, ino)) if ours && foreign.contains(&ino) => {
                        park = true;
                        t.parked.push((fd, ino));
                        if let Some(d) = dup {
                            // Our locks go now, as they would have; only the description waits.
                            unlock_all(d);
                            t.parked.push((d, ino));
                        }
                    }
                    _ => close_now.extend(dup),
                }
            } else {
                close_now.extend(dup);
            }
        }
        let rc = if park { 0 } else { unsafe { real_close()(fd) } };
        let saved = errno();
        for d in close_now {
            unsafe { real_close()(d) };
        }
        set_errno(saved);
        rc
    }

    fn inode_of(fd: c_int) -> Result<(u64, u64), c_int> {
        // SAFETY: fstat fills a zeroed stat; a bad descriptor only returns an error.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(errno());
        }
        Ok((st.st_dev, st.st_ino))
    }

    fn unlock_all(dup: c_int) {
        // SAFETY: a zeroed flock (l_pid 0) covering the whole file, on our own descriptor.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_UNLCK as _;
        lock.l_whence = libc::SEEK_SET as _;
        unsafe { real_fcntl()(dup, libc::F_OFD_SETLK, &mut lock as *mut libc::flock) };
    }

    /// Inode numbers on which this process holds classic POSIX locks, from /proc/locks. Ours are
    /// OFD locks ("OFDLCK"), so these belong to another library here (Python's sqlite3). The
    /// device is not compared: /proc/locks names the underlying filesystem's device, which is not
    /// fstat's on overlayfs; a false match only delays a close. Unreadable: none (close as POSIX
    /// would, the behaviour without this check).
    fn foreign_posix_locked_inodes() -> HashSet<u64> {
        let pid = std::process::id().to_string();
        let Ok(text) = std::fs::read_to_string("/proc/locks") else { return HashSet::new() };
        text.lines()
            .filter_map(|line| {
                // "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter's line has "->"
                // after the number and holds nothing.
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.get(1) != Some(&"POSIX") || f.get(4) != Some(&pid.as_str()) {
                    return None;
                }
                f.get(5)?.rsplit(':').next()?.parse().ok()
            })
            .collect()
    }

    /// Whether the kernel knows OFD locks (Linux >= 3.15): probe on a scratch file.
    fn ofd_supported() -> bool {
        let Ok(f) = tempfile_for_probe() else { return false };
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor and a zeroed flock asking about the whole file.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as _;
        lock.l_whence = libc::SEEK_SET as _;
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut lock as *mut libc::flock) == 0 }
    }

    fn tempfile_for_probe() -> std::io::Result<std::fs::File> {
        // An anonymous in-memory file: nothing is left behind, no directory needed.
        // SAFETY: a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"tenxgraph-ofd-probe".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        use std::os::fd::FromRawFd;
        // SAFETY: a fresh descriptor we own.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    pub(super) fn install_once() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            // SAFETY: registers a handler that only stores an atomic.
            unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
            if !ofd_supported() {
                tracing::warn!(
                    "this kernel has no open-file-description locks; SQLite keeps POSIX locks, so do not open \
                     the checkpointer's file with another SQLite library (e.g. Python's sqlite3) in this process"
                );
                return;
            }
            // SAFETY: sqlite3_vfs_find initialises SQLite and returns the static unix VFS; the
            // syscall table is changed before any connection of ours exists (the Once runs at
            // the top of SqliteStore::open), so no lock was taken with the old entries.
            unsafe {
                let vfs = ffi::sqlite3_vfs_find(std::ptr::null());
                let Some(vfs) = vfs.as_mut() else { return };
                let (Some(get), Some(set)) = (vfs.xGetSystemCall, vfs.xSetSystemCall) else { return };
                let fcntl_name: *const c_char = c"fcntl".as_ptr();
                let close_name: *const c_char = c"close".as_ptr();
                let (Some(old_fcntl), Some(old_close)) = (get(vfs, fcntl_name), get(vfs, close_name)) else { return };
                let _ = REAL.set((
                    std::mem::transmute::<unsafe extern "C" fn(), RealFcntl>(old_fcntl),
                    std::mem::transmute::<unsafe extern "C" fn(), RealClose>(old_close),
                ));
                let f: unsafe extern "C" fn(c_int, c_int, usize) -> c_int = fcntl_shim;
                let c: unsafe extern "C" fn(c_int) -> c_int = close_shim;
                // close first: a lock taken through the new fcntl must be released by the new close.
                let ok = set(
                    vfs,
                    close_name,
                    Some(std::mem::transmute::<unsafe extern "C" fn(c_int) -> c_int, unsafe extern "C" fn()>(c)),
                ) == ffi::SQLITE_OK
                    && set(
                        vfs,
                        fcntl_name,
                        Some(std::mem::transmute::<
                            unsafe extern "C" fn(c_int, c_int, usize) -> c_int,
                            unsafe extern "C" fn(),
                        >(f)),
                    ) == ffi::SQLITE_OK;
                if !ok {
                    set(vfs, close_name, Some(old_close));
                    tracing::warn!("could not switch SQLite to open-file-description locks; POSIX locks stay in use");
                }
            }
        });
    }
}
