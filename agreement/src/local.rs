//! Records between the processes of one node, through files in the per-user registry directory.
//!
//! With several ranks per host, NCCL connects them through P2P or SHM, which the net plugin never
//! sees, so records cannot travel between them over our connections. Every process that runs the
//! agreement therefore also appends each record it sends (its own, and each one it received for
//! the first time) to a file of its own, `<registry>/agree/<pid>.<generation>`, and reads the
//! other processes' files: a record reaches every process of the node, and from there, over the
//! node-boundary ranks' connections, every other node.
//!
//! A file is a sequence of `[length u32 LE][record]`, each appended with one `write` (so a
//! reader sees a whole entry or, at the file's end, part of one, which it reads again later). A
//! writer starts a new generation past [`ROTATE_BYTES`] and removes its generation before the
//! previous one, so a reader that keeps up never misses an entry and the files stay small. The
//! directory is the user's own (created 0700, refused if another user owns it); files of
//! processes that are gone are removed by whoever finds them.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A writer moves to a new file past this size.
pub const ROTATE_BYTES: u64 = 1 << 20;
/// The largest entry a reader takes (a record is far smaller; more means a broken file).
const MAX_ENTRY: usize = 64 * 1024;

pub struct Local {
    dir: PathBuf,
    pid: u32,
    generation: u64,
    file: File,
    written: u64,
    /// Per file of another process: the offset of the next entry to read.
    offsets: HashMap<PathBuf, u64>,
}

fn name_of(pid: u32, generation: u64) -> String {
    format!("{pid}.{generation}")
}

/// `(pid, generation)` of a file name of ours.
fn parse_name(name: &str) -> Option<(u32, u64)> {
    let (p, g) = name.split_once('.')?;
    Some((p.parse().ok()?, g.parse().ok()?))
}

fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Local {
    /// Opens this process's file in `<registry>/agree` (creating the directory, owner-only).
    pub fn open(registry: &Path) -> io::Result<Local> {
        let dir = registry.join("agree");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let meta = fs::metadata(&dir)?;
        if meta.uid() != uid || meta.mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not this user's own directory (owner {}, mode {:o}): records are not \
                     shared through it",
                    dir.display(),
                    meta.uid(),
                    meta.mode() & 0o777
                ),
            ));
        }
        let pid = std::process::id();
        let file = Local::create(&dir, pid, 0)?;
        Ok(Local {
            dir,
            pid,
            generation: 0,
            file,
            written: 0,
            offsets: HashMap::new(),
        })
    }

    fn create(dir: &Path, pid: u32, generation: u64) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(dir.join(name_of(pid, generation)))
    }

    /// Appends `frames` (records) for the node's other processes.
    pub fn publish(&mut self, frames: &[Arc<[u8]>]) -> io::Result<()> {
        for f in frames {
            if self.written >= ROTATE_BYTES {
                self.generation += 1;
                self.file = Local::create(&self.dir, self.pid, self.generation)?;
                self.written = 0;
                if self.generation >= 2 {
                    let _ = fs::remove_file(self.dir.join(name_of(self.pid, self.generation - 2)));
                }
            }
            let mut entry = Vec::with_capacity(4 + f.len());
            entry.extend_from_slice(&(f.len() as u32).to_le_bytes());
            entry.extend_from_slice(f);
            self.file.write_all(&entry)?;
            self.written += entry.len() as u64;
        }
        Ok(())
    }

    /// The entries the node's other processes appended since the last call, oldest file first.
    pub fn collect(&mut self) -> Vec<Vec<u8>> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return vec![];
        };
        let mut files: Vec<(u32, u64, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let (pid, generation) = parse_name(e.file_name().to_str()?)?;
                Some((pid, generation, e.path()))
            })
            .filter(|&(pid, _, _)| pid != self.pid)
            .collect();
        files.sort();
        let mut out = Vec::new();
        let mut seen = Vec::with_capacity(files.len());
        for (pid, _, path) in files {
            if !alive(pid) {
                let _ = fs::remove_file(&path);
                continue;
            }
            let at = self.offsets.get(&path).copied().unwrap_or(0);
            let next = read_entries(&path, at, &mut out).unwrap_or(at);
            self.offsets.insert(path.clone(), next);
            seen.push(path);
        }
        self.offsets.retain(|p, _| seen.contains(p));
        out
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        for g in self.generation.saturating_sub(1)..=self.generation {
            let _ = fs::remove_file(self.dir.join(name_of(self.pid, g)));
        }
    }
}

/// Reads the whole entries of `path` from `at` into `out`; the offset after the last one.
fn read_entries(path: &Path, at: u64, out: &mut Vec<Vec<u8>>) -> io::Result<u64> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    if len <= at {
        return Ok(at);
    }
    f.seek(SeekFrom::Start(at))?;
    let mut buf = Vec::with_capacity((len - at) as usize);
    f.take(len - at).read_to_end(&mut buf)?;
    let mut off = 0usize;
    while buf.len() - off >= 4 {
        let n = u32::from_le_bytes(buf[off..off + 4].try_into().expect("4 bytes")) as usize;
        if n > MAX_ENTRY {
            // Not a file of ours as we write them: skip the rest of it.
            return Ok(len);
        }
        if buf.len() - off - 4 < n {
            break;
        }
        out.push(buf[off + 4..off + 4 + n].to_vec());
        off += 4 + n;
    }
    Ok(at + off as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ncclbpf-local-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn entries_of_other_processes_are_read_once_and_partial_ones_later() {
        let d = dir("read");
        let mut me = Local::open(&d).unwrap();
        // Another (live) process's file: pid 1 is always alive.
        let other = d.join("agree").join("1.0");
        let mut f = File::create(&other).unwrap();
        f.write_all(&3u32.to_le_bytes()).unwrap();
        f.write_all(b"abc").unwrap();
        f.write_all(&4u32.to_le_bytes()).unwrap();
        f.write_all(b"de").unwrap(); // half an entry
        assert_eq!(me.collect(), vec![b"abc".to_vec()]);
        assert!(me.collect().is_empty(), "read once");
        f.write_all(b"fg").unwrap();
        assert_eq!(me.collect(), vec![b"defg".to_vec()]);
        // Our own file is not read back.
        me.publish(&[Arc::from(&b"mine"[..])]).unwrap();
        assert!(me.collect().is_empty());
        // A file of a process that is gone is removed.
        let dead = d.join("agree").join(format!("{}.0", u32::MAX - 7));
        fs::write(&dead, [1, 0, 0, 0, 9]).unwrap();
        assert!(me.collect().is_empty());
        assert!(!dead.exists());
        drop(me);
        let _ = fs::remove_dir_all(d);
    }

    #[test]
    fn a_writer_rotates_and_readers_follow_it() {
        let d = dir("rotate");
        let mut w = Local::open(&d).unwrap();
        // Pretend the writer is another process for the reader: read its files directly.
        let big: Arc<[u8]> = vec![7u8; 60_000].into();
        for _ in 0..40 {
            w.publish(std::slice::from_ref(&big)).unwrap();
        }
        let names: Vec<String> = fs::read_dir(d.join("agree"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.len() <= 2, "old generations are removed: {names:?}");
        assert!(w.generation >= 2);
        let mut out = vec![];
        let cur = d.join("agree").join(name_of(w.pid, w.generation));
        let end = read_entries(&cur, 0, &mut out).unwrap();
        assert_eq!(end, w.written);
        assert!(out.iter().all(|e| e.len() == 60_000));
        drop(w);
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
