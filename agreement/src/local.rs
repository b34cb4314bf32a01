//! Records between the processes of one node, through files in the per-user registry directory.
//!
//! With several ranks per host, NCCL connects them through P2P or SHM, which the net plugin never
//! sees, so records cannot travel between them over our connections. Every process that runs the
//! agreement therefore also appends each record it sends (its own, and each one it received for
//! the first time) to a file of its own in `<registry>/agree/`, and reads the other relays'
//! files: a record reaches every process of the node, and from there, over the node-boundary
//! ranks' connections, every other node.
//!
//! **Names.** A relay draws a random token (128 bits, 32 hex digits) when it opens and names its
//! files after it: `<token>.<generation>` for its records, and `<token>.lock`, on which it holds
//! an exclusive `flock` for as long as it lives. Process ids are not used: ranks in containers
//! that share `/dev/shm` but not a PID namespace may have the same pid, and a pid says nothing
//! about a process of another namespace. A reader skips its own token and reads the files of
//! every token whose lock is held; a token whose lock it can take (`LOCK_SH | LOCK_NB`), or that
//! has no lock file, belongs to a relay that is gone, and the reader removes its files. (A
//! writer locks its lock file just after creating it; should a reader have taken and removed it
//! in between, the writer finds it unlinked once locked, and draws another token.)
//!
//! **Files.** A file is a sequence of `[length u32 LE][record]`, each appended with one `write`
//! (so a reader sees a whole entry or, at the file's end, part of one, which it reads again
//! later). A writer starts a new generation past [`ROTATE_BYTES`] (and after a failed write, so
//! that a torn entry can only end a file) and removes its generation before the previous one, so
//! a reader that keeps up never misses an entry and the files stay small. A reader reads at most
//! [`READ_BYTES`] of a file per [`Local::collect`] and goes on from there at the next call, so
//! the size a file claims never decides an allocation; an entry of length 0 or of more than
//! 64 KiB means the file is not one we wrote, and the rest of it is ignored.
//!
//! **Trust.** The registry directory must be this user's and not writable by group or others
//! (whoever may write it could swap `agree/` for a directory of theirs), and `agree/` this
//! user's with no permission for group or others (created 0700); [`Local::open`] refuses
//! anything else, and the caller goes on without the relay. Neither is opened through a
//! symbolic link, and everything afterwards is relative to the open `agree/` (`openat`,
//! `unlinkat`), so later renames of the paths change nothing. Every file is opened with
//! `O_NOFOLLOW` (reads also with `O_NONBLOCK`, so a FIFO cannot block them) and checked once
//! open (`fstat`) to be a regular file of this user; anything else is skipped, and an entry with
//! one of our names that is not a regular file (a FIFO, a link, a socket) is removed. A relay
//! creates its files with `O_CREAT | O_EXCL | O_NOFOLLOW` (a record file after removing whatever
//! has its name; a lock file under a token no file has), so a planted link is never followed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// A writer moves to a new file past this size.
pub const ROTATE_BYTES: u64 = 1 << 20;
/// The most a reader reads of one file in one [`Local::collect`].
pub const READ_BYTES: u64 = 2 << 20;
/// The largest entry a reader takes (a record is far smaller; more means a broken file).
const MAX_ENTRY: usize = 64 * 1024;
/// The offset of a file that is not as we write them: nothing more is read of it.
const BROKEN: u64 = u64::MAX;
/// Hex digits of a token.
const TOKEN_LEN: usize = 32;

pub struct Local {
    /// `<registry>/agree`, checked when opened; every name is looked up relative to it.
    dir: OwnedFd,
    uid: u32,
    token: String,
    /// `<token>.lock`, locked `LOCK_EX` for the relay's lifetime (released when it closes).
    _lock: File,
    generation: u64,
    file: File,
    written: u64,
    /// Per file of another relay (by name): the offset of the next entry to read.
    offsets: HashMap<String, u64>,
}

fn data_name(token: &str, generation: u64) -> String {
    format!("{token}.{generation}")
}

fn lock_name(token: &str) -> String {
    format!("{token}.lock")
}

#[derive(Debug, PartialEq)]
enum Kind {
    Lock,
    Data(u64),
}

/// The token of a file name of ours, and which of its files it is.
fn parse_name(name: &str) -> Option<(&str, Kind)> {
    let (token, rest) = name.split_once('.')?;
    if token.len() != TOKEN_LEN
        || !token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    if rest == "lock" {
        return Some((token, Kind::Lock));
    }
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((token, Kind::Data(rest.parse().ok()?)))
}

fn random_token() -> io::Result<String> {
    let mut b = [0u8; TOKEN_LEN / 2];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writes at most the `b.len() - got` bytes left of `b`.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)`, mode 0600 if it creates the file.
fn open_at(dir: BorrowedFd<'_>, name: &str, flags: libc::c_int) -> io::Result<File> {
    let c = c_name(name)?;
    // SAFETY: an open directory descriptor and a NUL-terminated name; the mode is only read
    // with O_CREAT.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn unlink_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mkdir_at(dir: BorrowedFd<'_>, name: &str, mode: libc::mode_t) -> io::Result<()> {
    let c = c_name(name)?;
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn flock(f: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: an open descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), op) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The names in `dir`, each with its `d_type`.
fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<(String, u8)>> {
    // A descriptor of its own, so that every listing starts at the beginning.
    let fd = open_at(dir, ".", libc::O_RDONLY | libc::O_DIRECTORY)?.into_raw_fd();
    // SAFETY: an open directory descriptor; the stream owns it from here (closedir closes it).
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so the descriptor is still ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: an open stream; the entry is valid until the next readdir on it.
        let e = unsafe { libc::readdir(stream) };
        if e.is_null() {
            break;
        }
        // SAFETY: `e` points to an entry whose d_name is NUL-terminated.
        let (name, kind) = unsafe { (CStr::from_ptr((*e).d_name.as_ptr()), (*e).d_type) };
        if let Ok(name) = name.to_str() {
            names.push((name.to_owned(), kind));
        }
    }
    // SAFETY: an open stream, not used again.
    unsafe { libc::closedir(stream) };
    Ok(names)
}

/// What an open file is, by `fstat`.
enum Checked {
    /// A regular file of this user, this long.
    Ours(u64),
    NotRegular,
    OtherOwner,
}

fn check_file(f: &File, uid: u32) -> io::Result<Checked> {
    let m = f.metadata()?;
    Ok(if !m.file_type().is_file() {
        Checked::NotRegular
    } else if m.uid() != uid {
        Checked::OtherOwner
    } else {
        Checked::Ours(m.len())
    })
}

/// Whether opening failed because the entry is not a regular file (a symbolic link under
/// `O_NOFOLLOW`, a socket).
fn not_a_file(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO))
}

/// Checks that open directory `f` (at `path`) is this user's, with none of the `forbidden` mode
/// bits (`need` says what that means).
fn check_dir(f: &File, path: &Path, uid: u32, forbidden: u32, need: &str) -> io::Result<()> {
    let m = f.metadata()?;
    if m.is_dir() && m.uid() == uid && m.mode() & forbidden == 0 {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is not this user's own directory (owner {}, mode {:o}; the relay needs owner \
             {uid}, {need}): records are not shared through it",
            path.display(),
            m.uid(),
            m.mode() & 0o7777
        ),
    ))
}

/// Why a directory could not be opened (without following a link: then a link is refused,
/// and says so).
fn dir_error(path: &Path, e: io::Error) -> io::Error {
    if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
        && fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
    {
        return io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link: records are not shared through it (name the directory \
                 itself)",
                path.display()
            ),
        );
    }
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Creates `dir/name` anew (`O_CREAT | O_EXCL | O_NOFOLLOW`), `flags` besides.
fn create_excl(dir: BorrowedFd<'_>, name: &str, flags: libc::c_int, uid: u32) -> io::Result<File> {
    let f = open_at(dir, name, flags | libc::O_CREAT | libc::O_EXCL)?;
    match check_file(&f, uid)? {
        Checked::Ours(_) => Ok(f),
        _ => Err(io::Error::other(format!(
            "{name}: a file just created is not a regular file of this user"
        ))),
    }
}

/// Creates data file `dir/name` for writing, after removing whatever had the name.
fn create_data(dir: BorrowedFd<'_>, name: &str, uid: u32) -> io::Result<File> {
    match unlink_at(dir, name) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    create_excl(dir, name, libc::O_WRONLY, uid)
}

/// A new token and its lock file, locked.
fn take_token(dir: BorrowedFd<'_>, uid: u32) -> io::Result<(String, File)> {
    for _ in 0..8 {
        let token = random_token()?;
        let name = lock_name(&token);
        let f = match create_excl(dir, &name, libc::O_RDONLY, uid) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        match flock(&f, libc::LOCK_EX | libc::LOCK_NB) {
            // A reader that locked the new file before us took it for a gone relay's and
            // removed it: then it is no lock any more.
            Ok(()) if f.metadata()?.nlink() > 0 => return Ok((token, f)),
            Ok(()) => {}
            // A reader holds it now, and will remove it.
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                let _ = unlink_at(dir, &name);
            }
            Err(e) => {
                let _ = unlink_at(dir, &name);
                return Err(e);
            }
        }
    }
    Err(io::Error::other(
        "no lock file could be taken for the relay in 8 tries",
    ))
}

/// The state of another relay, by its lock file.
enum Peer {
    Alive,
    /// Gone: its files are to be removed (under the lock, if it has a lock file).
    Gone(Option<File>),
    /// Not to be read nor removed (a lock file of another user, or one that cannot be opened).
    Unknown,
}

fn peer(dir: BorrowedFd<'_>, token: &str, uid: u32) -> Peer {
    let name = lock_name(token);
    let f = match open_at(dir, &name, libc::O_RDONLY | libc::O_NONBLOCK) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Peer::Gone(None),
        Err(e) if not_a_file(&e) => {
            let _ = unlink_at(dir, &name);
            return Peer::Gone(None);
        }
        Err(_) => return Peer::Unknown,
    };
    match check_file(&f, uid) {
        Ok(Checked::Ours(_)) => {}
        Ok(Checked::NotRegular) => {
            let _ = unlink_at(dir, &name);
            return Peer::Gone(None);
        }
        _ => return Peer::Unknown,
    }
    match flock(&f, libc::LOCK_SH | libc::LOCK_NB) {
        Ok(()) => Peer::Gone(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Peer::Alive,
        Err(_) => Peer::Unknown,
    }
}

impl Local {
    /// Opens a relay in `<registry>/agree` (creating the directories, owner-only), after checking
    /// that the registry is this user's and not writable by others, and `agree` this user's only.
    pub fn open(registry: &Path) -> io::Result<Local> {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(registry)
            .map_err(|e| dir_error(registry, e))?;
        let reg = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(registry)
            .map_err(|e| dir_error(registry, e))?;
        check_dir(
            &reg,
            registry,
            uid,
            0o022,
            "not writable by group or others",
        )?;
        let path = registry.join("agree");
        match mkdir_at(reg.as_fd(), "agree", 0o700) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(dir_error(&path, e)),
            _ => {}
        }
        let dir = open_at(reg.as_fd(), "agree", libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| dir_error(&path, e))?;
        check_dir(&dir, &path, uid, 0o077, "mode 0700")?;
        let dir = OwnedFd::from(dir);
        let (token, lock) = take_token(dir.as_fd(), uid)?;
        let file = match create_data(dir.as_fd(), &data_name(&token, 0), uid) {
            Ok(f) => f,
            Err(e) => {
                let _ = unlink_at(dir.as_fd(), &lock_name(&token));
                return Err(e);
            }
        };
        Ok(Local {
            dir,
            uid,
            token,
            _lock: lock,
            generation: 0,
            file,
            written: 0,
            offsets: HashMap::new(),
        })
    }

    /// Appends `frames` (records) for the node's other processes. A frame that is empty or
    /// longer than a reader takes is left out.
    pub fn publish(&mut self, frames: &[Arc<[u8]>]) -> io::Result<()> {
        for f in frames {
            if f.is_empty() || f.len() > MAX_ENTRY {
                continue;
            }
            if self.written >= ROTATE_BYTES {
                self.rotate()?;
            }
            let mut entry = Vec::with_capacity(4 + f.len());
            entry.extend_from_slice(&(f.len() as u32).to_le_bytes());
            entry.extend_from_slice(f);
            if let Err(e) = self.file.write_all(&entry) {
                // Part of the entry may be in the file: nothing more goes after it.
                self.written = self.written.max(ROTATE_BYTES);
                return Err(e);
            }
            self.written += entry.len() as u64;
        }
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        let dir = self.dir.as_fd();
        let next = self.generation + 1;
        self.file = create_data(dir, &data_name(&self.token, next), self.uid)?;
        self.generation = next;
        self.written = 0;
        if next >= 2 {
            let _ = unlink_at(dir, &data_name(&self.token, next - 2));
        }
        Ok(())
    }

    /// The entries the node's other relays appended since the last call (at most
    /// [`READ_BYTES`] of each file; the rest at the next call), oldest file of each first.
    pub fn collect(&mut self) -> Vec<Vec<u8>> {
        let dir = self.dir.as_fd();
        let Ok(names) = list(dir) else {
            return vec![];
        };
        // Every other token, with the generations of its files.
        let mut peers: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (name, kind) in names {
            let Some((token, which)) = parse_name(&name) else {
                continue;
            };
            if token == self.token {
                continue;
            }
            if kind != libc::DT_REG && kind != libc::DT_UNKNOWN {
                // Not a file as we make them (a FIFO, a link, a socket...): never opened.
                let _ = unlink_at(dir, &name);
                continue;
            }
            let generations = peers.entry(token.to_owned()).or_default();
            if let Kind::Data(g) = which {
                generations.push(g);
            }
        }
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for (token, mut generations) in peers {
            match peer(dir, &token, self.uid) {
                Peer::Alive => {}
                Peer::Unknown => continue,
                Peer::Gone(lock) => {
                    for g in generations {
                        let _ = unlink_at(dir, &data_name(&token, g));
                    }
                    // The lock file last, while this reader still holds it locked.
                    let _ = unlink_at(dir, &lock_name(&token));
                    drop(lock);
                    continue;
                }
            }
            generations.sort_unstable();
            for g in generations {
                let name = data_name(&token, g);
                let at = self.offsets.get(&name).copied().unwrap_or(0);
                let next = read_file(dir, &name, at, self.uid, &mut out);
                self.offsets.insert(name.clone(), next);
                seen.insert(name);
            }
        }
        self.offsets.retain(|n, _| seen.contains(n));
        out
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let dir = self.dir.as_fd();
        for g in self.generation.saturating_sub(1)..=self.generation {
            let _ = unlink_at(dir, &data_name(&self.token, g));
        }
        // The lock is released when `_lock` closes, after this.
        let _ = unlink_at(dir, &lock_name(&self.token));
    }
}

/// Reads the whole entries of data file `dir/name` from `at` into `out`, if it is a regular
/// file of `uid`; the offset to go on from.
fn read_file(dir: BorrowedFd<'_>, name: &str, at: u64, uid: u32, out: &mut Vec<Vec<u8>>) -> u64 {
    if at == BROKEN {
        return at;
    }
    let f = match open_at(dir, name, libc::O_RDONLY | libc::O_NONBLOCK) {
        Ok(f) => f,
        Err(e) if not_a_file(&e) => {
            let _ = unlink_at(dir, name);
            return at;
        }
        Err(_) => return at,
    };
    match check_file(&f, uid) {
        Ok(Checked::Ours(len)) => read_entries(&f, len, at, out),
        Ok(Checked::NotRegular) => {
            let _ = unlink_at(dir, name);
            at
        }
        _ => at,
    }
}

/// Reads the whole entries of `f` (`len` bytes long) from `at` into `out`, looking at
/// [`READ_BYTES`] at most; the offset after the last one, or [`BROKEN`].
fn read_entries(f: &File, len: u64, at: u64, out: &mut Vec<Vec<u8>>) -> u64 {
    if len <= at {
        return at;
    }
    let want = (len - at).min(READ_BYTES) as usize;
    let mut buf = vec![0u8; want];
    let mut got = 0;
    while got < want {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let buf = &buf[..got];
    let mut off = 0usize;
    while buf.len() - off >= 4 {
        let n = u32::from_le_bytes(buf[off..off + 4].try_into().expect("4 bytes")) as usize;
        if n == 0 || n > MAX_ENTRY {
            // Not a file as we write them: nothing more of it is read.
            return BROKEN;
        }
        if buf.len() - off - 4 < n {
            break;
        }
        out.push(buf[off + 4..off + 4 + n].to_vec());
        off += 4 + n;
    }
    at + off as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ncclbpf-local-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn entry(data: &[u8]) -> Vec<u8> {
        let mut e = (data.len() as u32).to_le_bytes().to_vec();
        e.extend_from_slice(data);
        e
    }

    /// Another relay as its files look: a token whose lock file is locked while the returned
    /// lock is open (`None`: not locked, a relay that is gone).
    fn fake(agree: &Path, token: &str, locked: bool) -> Option<File> {
        let f = File::create(agree.join(lock_name(token))).unwrap();
        locked.then(|| {
            flock(&f, libc::LOCK_EX | libc::LOCK_NB).unwrap();
            f
        })
    }

    const T1: &str = "11111111111111111111111111111111";
    const T2: &str = "22222222222222222222222222222222";
    const T3: &str = "33333333333333333333333333333333";

    #[test]
    fn names() {
        assert_eq!(parse_name(&lock_name(T1)), Some((T1, Kind::Lock)));
        assert_eq!(parse_name(&data_name(T1, 7)), Some((T1, Kind::Data(7))));
        for bad in [
            "1.0",
            "123.lock",
            "1111111111111111111111111111111X.0",
            &format!("{T1}.+1"),
            &format!("{T1}."),
            &format!("{T1}.0.tmp"),
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert!(a != b && parse_name(&lock_name(&a)).is_some());
    }

    #[test]
    fn entries_of_other_relays_are_read_once_and_partial_ones_later() {
        let d = dir("read");
        let mut me = Local::open(&d).unwrap();
        let agree = d.join("agree");
        let _alive = fake(&agree, T1, true);
        let mut f = File::create(agree.join(data_name(T1, 0))).unwrap();
        f.write_all(&entry(b"abc")).unwrap();
        f.write_all(&4u32.to_le_bytes()).unwrap();
        f.write_all(b"de").unwrap(); // half an entry
        assert_eq!(me.collect(), vec![b"abc".to_vec()]);
        assert!(me.collect().is_empty(), "read once");
        f.write_all(b"fg").unwrap();
        assert_eq!(me.collect(), vec![b"defg".to_vec()]);
        // Our own file is not read back.
        me.publish(&[Arc::from(&b"mine"[..])]).unwrap();
        assert!(me.collect().is_empty());
        // A newer generation of the same relay is read after the older one.
        fs::write(agree.join(data_name(T1, 1)), entry(b"new")).unwrap();
        f.write_all(&entry(b"old")).unwrap();
        assert_eq!(me.collect(), vec![b"old".to_vec(), b"new".to_vec()]);
        drop(me);
        let _ = fs::remove_dir_all(d);
    }

    #[test]
    fn files_of_relays_that_are_gone_are_removed() {
        let d = dir("gone");
        let mut me = Local::open(&d).unwrap();
        let agree = d.join("agree");
        // T1 lives; T2's lock is free (its relay died without removing its files); T3 has
        // records but no lock file at all.
        let _alive = fake(&agree, T1, true);
        fake(&agree, T2, false);
        for t in [T1, T2, T3] {
            fs::write(agree.join(data_name(t, 4)), entry(t.as_bytes())).unwrap();
        }
        assert_eq!(me.collect(), vec![T1.as_bytes().to_vec()]);
        for t in [T2, T3] {
            assert!(!agree.join(data_name(t, 4)).exists(), "{t}");
            assert!(!agree.join(lock_name(t)).exists(), "{t}");
        }
        assert!(agree.join(data_name(T1, 4)).exists());
        assert!(agree.join(lock_name(T1)).exists());
        // Names that are not ours are left alone.
        fs::write(agree.join("notes.txt"), b"x").unwrap();
        assert!(me.collect().is_empty());
        assert!(agree.join("notes.txt").exists());
        drop(me);
        let _ = fs::remove_dir_all(d);
    }

    #[test]
    fn a_big_file_is_read_a_window_at_a_time() {
        let d = dir("window");
        let mut me = Local::open(&d).unwrap();
        let agree = d.join("agree");
        let _alive = fake(&agree, T1, true);
        let e = entry(&[5u8; 60_000]);
        let count = (3 * READ_BYTES) as usize / e.len();
        fs::write(agree.join(data_name(T1, 0)), e.repeat(count)).unwrap();
        let mut calls = vec![];
        loop {
            let got = me.collect();
            if got.is_empty() {
                break;
            }
            assert!(got.iter().all(|r| r.len() == 60_000));
            calls.push(got.len());
        }
        let per_call = READ_BYTES as usize / e.len();
        assert_eq!(calls.iter().sum::<usize>(), count, "{calls:?}");
        assert!(calls.iter().all(|&n| n <= per_call), "{calls:?}");
        assert_eq!(calls.len(), count.div_ceil(per_call), "{calls:?}");
        drop(me);
        let _ = fs::remove_dir_all(d);
    }

    #[test]
    fn a_file_not_as_we_write_them_is_left_after_its_first_bad_entry() {
        let d = dir("broken");
        let mut me = Local::open(&d).unwrap();
        let agree = d.join("agree");
        let _alive = fake(&agree, T1, true);
        let mut bytes = entry(b"good");
        bytes.extend_from_slice(&(MAX_ENTRY as u32 + 1).to_le_bytes());
        fs::write(agree.join(data_name(T1, 0)), &bytes).unwrap();
        let mut zeros = vec![0u8; 8];
        zeros.extend(entry(b"after"));
        fs::write(agree.join(data_name(T1, 1)), &zeros).unwrap();
        assert_eq!(me.collect(), vec![b"good".to_vec()]);
        let mut f = OpenOptions::new()
            .append(true)
            .open(agree.join(data_name(T1, 0)))
            .unwrap();
        f.write_all(&entry(b"more")).unwrap();
        assert!(me.collect().is_empty(), "nothing more of either file");
        // A writer leaves out what a reader would take for a broken file.
        me.publish(&[Arc::from(&[][..]), vec![1u8; MAX_ENTRY + 1].into()])
            .unwrap();
        assert_eq!(me.written, 0);
        drop(me);
        let _ = fs::remove_dir_all(d);
    }

    #[test]
    fn a_writer_rotates_and_readers_follow_it() {
        let d = dir("rotate");
        let mut w = Local::open(&d).unwrap();
        let mut r = Local::open(&d).unwrap();
        let big: Arc<[u8]> = vec![7u8; 60_000].into();
        let mut read = 0;
        for _ in 0..40 {
            w.publish(std::slice::from_ref(&big)).unwrap();
            let got = r.collect();
            assert!(got.iter().all(|e| e.len() == 60_000));
            read += got.len();
        }
        assert_eq!(read, 40, "a reader that keeps up misses nothing");
        let names: Vec<String> = fs::read_dir(d.join("agree"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&w.token))
            .collect();
        assert!(w.generation >= 2);
        assert_eq!(names.len(), 3, "two generations and the lock: {names:?}");
        let mut out = vec![];
        let cur = File::open(d.join("agree").join(data_name(&w.token, w.generation))).unwrap();
        let end = read_entries(&cur, cur.metadata().unwrap().len(), 0, &mut out);
        assert_eq!(end, w.written);
        assert!(out.iter().all(|e| e.len() == 60_000));
        drop(w);
        drop(r);
        assert_eq!(
            fs::read_dir(d.join("agree")).unwrap().count(),
            0,
            "removed at drop"
        );
        let _ = fs::remove_dir_all(d);
    }

    #[test]
    fn another_users_directory_is_refused() {
        let d = dir("perm");
        let a = d.join("agree");
        fs::create_dir_all(&a).unwrap();
        fs::set_permissions(&a, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = Local::open(&d).err().expect("refused");
        assert!(
            e.to_string().contains("not this user's own directory"),
            "{e}"
        );
        let _ = fs::remove_dir_all(d);
    }
}
