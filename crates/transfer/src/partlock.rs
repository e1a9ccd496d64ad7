//! A part file's lock against other processes, held while its data moves.
//!
//! A file of several chunks is received by one process at a time: its part
//! file is locked (flock) from the time the receiver sets it up until it is
//! placed, so a second process stops at once. But descriptors must follow
//! the work in flight, not the manifest: past the process's budget of locked
//! parts ([`budget`]), those written (or set up) longest ago give back their
//! lock and descriptors, and a complete part waiting for its commit holds
//! none.
//!
//! Locked again, the part must be as this receiver left it: the same inode,
//! and its journal the same inode, ending where this receiver's own appends
//! ended, with this receiver's owner record (a nonce, see
//! [`crate::journal`]) where it put it. Any process that sets the part up
//! appends an owner record of its own, so another process that took the
//! lock meanwhile shows, and the data is refused ("the part file changed")
//! rather than mixed.

use crate::journal;
use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

fn os(b: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(b))
}

/// Parts locked by this process now, in all its sessions.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Parts locked by this process now.
pub fn held() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// How many parts the process keeps locked before it gives back the lock
/// (and the two descriptors) of those written longest ago: a sixteenth of
/// its soft RLIMIT_NOFILE, 8 to 1,024 (64 under the usual 1,024; a part
/// holds two descriptors, its lock and its data).
pub fn budget() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        usize::try_from(soft_nofile() / 16)
            .unwrap_or(usize::MAX)
            .clamp(8, 1024)
    })
}

/// The process's soft RLIMIT_NOFILE (1,024 if it cannot be read).
pub fn soft_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct given.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } {
        0 => r.rlim_cur,
        _ => 1024,
    }
}

/// A part's locked descriptor, counted in [`held`] while it lives.
pub(crate) struct Locked(File);

impl Locked {
    fn new(f: File) -> Locked {
        HELD.fetch_add(1, Ordering::Relaxed);
        Locked(f)
    }

    /// The part's (device, inode).
    pub(crate) fn ident(&self) -> io::Result<(u64, u64)> {
        ident(&self.0)
    }

    /// The part, open.
    pub(crate) fn file(&self) -> &File {
        &self.0
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A file's (device, inode).
pub(crate) fn ident(f: &File) -> io::Result<(u64, u64)> {
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// A nonce for an owner record: distinct across processes, sessions and
/// set-ups (it needs no secrecy, only to differ from another's).
pub(crate) fn nonce() -> [u8; 32] {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.update(&now.to_le_bytes());
    *h.finalize().as_bytes()
}

fn busy(part: &[u8]) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "another process is receiving this file (its part file {} is locked); run one transfer into a destination at a time",
            String::from_utf8_lossy(part)
        ),
    )
}

fn changed(part: &[u8]) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "the part file {} changed while this session was not writing it (another process received the same file meanwhile); run one transfer into a destination at a time",
            String::from_utf8_lossy(part)
        ),
    )
}

pub(crate) fn taken_over() -> io::Error {
    io::Error::other(
        "a newer session took this file over (this one had received nothing for a while)",
    )
}

/// Opens the part `part` for reading and writing (for reading only when its
/// mode, left by an earlier run, denies writing), never through a link.
fn open_part(dir: &Dir, part: &[u8], create: bool) -> io::Result<File> {
    use cap_std::fs::OpenOptionsExt;
    let mut opts = OpenOptions::new();
    opts.read(true)
        .write(true)
        .create(create)
        .follow(FollowSymlinks::No)
        .mode(0o600);
    match dir.open_with(os(part), &opts) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(dir
            .open_with(
                os(part),
                OpenOptions::new().read(true).follow(FollowSymlinks::No),
            )?
            .into_std()),
        r => Ok(r?.into_std()),
    }
}

/// Open the part `part` (created if absent, never truncated here) and lock
/// it against other processes, without waiting.
pub(crate) fn lock_part(dir: &Dir, part: &[u8]) -> io::Result<Locked> {
    let f = open_part(dir, part, true)?;
    match f.try_lock() {
        Ok(()) => Ok(Locked::new(f)),
        Err(std::fs::TryLockError::WouldBlock) => Err(busy(part)),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// What a part and its journal were when their receiver last held the lock:
/// checked when it takes the lock again.
pub(crate) struct Seal {
    /// The part's (device, inode).
    pub part: (u64, u64),
    /// The journal's (device, inode).
    pub journal: (u64, u64),
    /// The journal's length after this receiver's last append.
    pub journal_len: u64,
    /// Where this receiver's owner record stands in the journal.
    pub owner_at: u64,
    /// That record.
    pub owner: [u8; journal::RECORD_LEN as usize],
}

/// A file's [`Guarded`] state under its mutex, shared by its `Incoming`, its
/// checkpoints and its claim: every use of the part but a chunk's write holds
/// the mutex, and a write is counted in `writers` (signalled on `quiet` when
/// the last one is done).
pub(crate) struct Guard {
    state: Mutex<Guarded>,
    quiet: Condvar,
    /// Held over a chunk's write: one write into the part at a time. The
    /// kernel serialises writes of one file on its inode lock anyway, and
    /// there its waiters spin: four threads writing one tmpfs file spent 50 %
    /// more CPU than one (3.0 against 2.0 s per 4 GB); here they sleep.
    one_write: Mutex<()>,
}

impl Guard {
    /// The guard of a file received as `part` beside its journal `journal`
    /// in `dir`, not set up yet.
    pub(crate) fn new(dir: Arc<Dir>, part: Vec<u8>, journal: Vec<u8>) -> Arc<Guard> {
        Arc::new(Guard {
            state: Mutex::new(Guarded::new(dir, part, journal)),
            quiet: Condvar::new(),
            one_write: Mutex::new(()),
        })
    }

    /// The state, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Guarded> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, locked, if nobody else has it now.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Guarded>> {
        self.state.try_lock().ok()
    }

    /// The state, locked once no write is in flight: for closing the file
    /// or handing its lock on, so that no write lands after the lock is gone
    /// (another receiver may have the part by then).
    pub(crate) fn quiet(&self) -> MutexGuard<'_, Guarded> {
        let mut g = self.lock();
        while g.writers > 0 {
            g = self.quiet.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g
    }
}

/// A file's lock and descriptors (see [`Guard`]).
pub(crate) struct Guarded {
    /// Placed, discarded, given up or taken over by another session: nothing
    /// more is written, journaled or placed.
    pub closed: bool,
    dir: Arc<Dir>,
    part: Vec<u8>,
    journal: Vec<u8>,
    /// The part, locked; `None` while given back.
    lock: Option<Locked>,
    /// The part opened for its data: a second descriptor, as writers hold
    /// clones of it while they write, and the lock must go when this says.
    data: Option<Arc<File>>,
    /// Writes in flight through `data`: the lock is not given back under them.
    writers: usize,
    /// Set once the part is set up (a file of several chunks).
    seal: Option<Seal>,
    /// Complete and waiting for its commit: a checkpoint that had to lock
    /// the part again gives the lock back after it.
    pub parked: bool,
    /// When a chunk was last written through it (`None`: never since set-up):
    /// past the budget, parts are given back in this order.
    pub used: Option<std::time::Instant>,
}

impl Guarded {
    fn new(dir: Arc<Dir>, part: Vec<u8>, journal: Vec<u8>) -> Guarded {
        Guarded {
            closed: false,
            dir,
            part,
            journal,
            lock: None,
            data: None,
            writers: 0,
            seal: None,
            parked: false,
            used: None,
        }
    }

    /// The part is set up as `seal` says, locked by `lock` (kept until the
    /// file is done, or until the process's budget gives it back).
    pub(crate) fn set_up(&mut self, seal: Seal, lock: Locked) {
        self.seal = Some(seal);
        self.lock = Some(lock);
        self.data = None;
    }

    /// Does it hold the part's lock now?
    pub(crate) fn holds(&self) -> bool {
        self.lock.is_some()
    }

    /// Could [`Guarded::release`] give the lock back now?
    pub(crate) fn releasable(&self) -> bool {
        self.writers == 0 && self.lock.is_some() && self.seal.is_some()
    }

    /// This receiver's appends to the journal end at this many bytes.
    pub(crate) fn journal_len(&self) -> Option<u64> {
        self.seal.as_ref().map(|s| s.journal_len)
    }

    /// The part locked, as this receiver left it (see the module's text).
    pub(crate) fn hold(&mut self) -> io::Result<()> {
        if self.closed {
            return Err(taken_over());
        }
        if self.lock.is_some() {
            return Ok(());
        }
        let Some(seal) = &self.seal else {
            return Err(io::Error::other("the part file is not set up"));
        };
        let f = match open_part(&self.dir, &self.part, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(changed(&self.part)),
            r => r?,
        };
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(busy(&self.part)),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let locked = Locked::new(f);
        if locked.ident()? != seal.part {
            return Err(changed(&self.part));
        }
        let j = match crate::open::open_read(&self.dir, os(&self.journal)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(changed(&self.part)),
            r => r?,
        };
        let m = j.metadata()?;
        let mut owner = [0u8; journal::RECORD_LEN as usize];
        if (m.dev(), m.ino()) != seal.journal
            || m.len() != seal.journal_len
            || j.read_exact_at(&mut owner, seal.owner_at).is_err()
            || owner != seal.owner
        {
            return Err(changed(&self.part));
        }
        self.lock = Some(locked);
        Ok(())
    }

    /// The part's data descriptor, the part locked ([`Guarded::hold`]).
    pub(crate) fn data(&mut self) -> io::Result<Arc<File>> {
        self.hold()?;
        if let Some(d) = &self.data {
            return Ok(d.clone());
        }
        let f = open_part(&self.dir, &self.part, false)?;
        if Some(ident(&f)?) != self.seal.as_ref().map(|s| s.part) {
            return Err(changed(&self.part));
        }
        let f = Arc::new(f);
        self.data = Some(f.clone());
        Ok(f)
    }

    /// This receiver appended to the journal, which now has `len` bytes.
    pub(crate) fn appended(&mut self, len: u64) {
        if let Some(s) = &mut self.seal {
            s.journal_len = len;
        }
    }

    /// Give back the lock and the descriptors, unless a write is in flight
    /// or the part is not set up. True if given back now.
    pub(crate) fn release(&mut self) -> bool {
        if !self.releasable() {
            return false;
        }
        self.data = None;
        self.lock = None;
        true
    }

    /// Nothing more is done with this part here: the lock and descriptors go
    /// (taken through [`Guard::quiet`]: no write in flight).
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.data = None;
        self.lock = None;
    }

    /// Another session of this process takes the file over: this one is
    /// closed, and its lock (if it holds it) passes to the new one (taken
    /// through [`Guard::quiet`]: no write in flight).
    pub(crate) fn take_over(&mut self) -> Option<Locked> {
        self.closed = true;
        self.data = None;
        self.lock.take()
    }
}

/// The data descriptor of a part, for one chunk's write: the lock is not
/// given back while it lives.
pub struct Writer {
    file: Arc<File>,
    guard: Option<Arc<Guard>>,
}

impl Writer {
    /// For a file that has no lock to keep (one chunk).
    pub(crate) fn plain(file: Arc<File>) -> Writer {
        Writer { file, guard: None }
    }

    /// For a file of several chunks: its part locked, counted as written.
    pub(crate) fn locked(guard: &Arc<Guard>) -> io::Result<Writer> {
        let mut g = guard.lock();
        let file = g.data()?;
        g.writers += 1;
        g.used = Some(std::time::Instant::now());
        Ok(Writer {
            file,
            guard: Some(guard.clone()),
        })
    }

    /// Writes `buf` at `off`, one write into the part at a time (see
    /// the part's guard's `one_write`); a file of one chunk has no other writer.
    pub fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let _one = self
            .guard
            .as_ref()
            .map(|g| g.one_write.lock().unwrap_or_else(|e| e.into_inner()));
        self.file.write_all_at(buf, off)
    }
}

impl std::ops::Deref for Writer {
    type Target = File;
    fn deref(&self) -> &File {
        &self.file
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(guard) = &self.guard {
            let mut g = guard.lock();
            g.writers -= 1;
            if g.writers == 0 {
                guard.quiet.notify_all();
            }
        }
    }
}
