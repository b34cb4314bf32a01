//! The server side: one thread per process, blocked in `accept` on `<dir>/<pid>.ctl`, serving
//! one client at a time, one request per connection. What a request does is the
//! [`Handler`]'s business (the plugin's); this module checks who is asking, reads the request,
//! catches panics and writes the reply.
//!
//! Nothing here runs on the caller's threads after [`start`] returns: loading, verifying and
//! compiling a policy happen on the control thread, so NCCL's threads never wait for them.

use crate::protocol::{MAX_REQUEST, Reply, Request};
use crate::{socket_path_in, sys};
use std::collections::HashSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use crate::sys::Peer;

/// How long a client has to send its request, and to take the reply.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the plugin does with requests.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request from `peer` (already checked to be the owner or root).
    fn handle(&self, req: &Request, peer: Peer) -> Reply;
    /// A line for the process's log; `warn` for a warning.
    fn log(&self, warn: bool, msg: &str);
}

/// Starts the control thread on `<registry dir>/<pid>.ctl`; returns the socket's path.
pub fn start(handler: Arc<dyn Handler>) -> Result<PathBuf, String> {
    start_in(&shared_maps::registry_dir(), handler)
}

/// [`start`] in `dir`. In order: pins the library that holds this code (without that no
/// thread is started, see `sys::pin_self`), makes sure `dir` exists and only its owner, this
/// process's user, can reach it; removes sockets of processes that are gone; binds the socket
/// (mode 0600), arranges its removal at exit, and starts the thread.
pub fn start_in(dir: &Path, handler: Arc<dyn Handler>) -> Result<PathBuf, String> {
    sys::pin_self().map_err(|e| {
        format!("cannot pin the plugin library, so no control thread is started: {e}")
    })?;
    prepare_dir(dir)?;
    remove_stale(dir);
    let path = socket_path_in(dir, std::process::id());
    // A socket with our pid is a dead process's whose pid we got.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
    }
    let listener =
        UnixListener::bind(&path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    // The directory is 0700, so nobody else could reach the socket before this.
    if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(&path);
        return Err(format!("cannot chmod 0600 {}: {e}", path.display()));
    }
    if !sys::remove_at_exit_of(&path) {
        handler.log(
            true,
            &format!(
                "control socket {}: cannot arrange its removal at exit (the next process removes it)",
                path.display()
            ),
        );
    }
    let h = handler.clone();
    let spawned = std::thread::Builder::new()
        .name("ncclbpf-control".into())
        .spawn(move || serve(listener, h));
    if let Err(e) = spawned {
        let _ = std::fs::remove_file(&path);
        return Err(format!("cannot start the control thread: {e}"));
    }
    Ok(path)
}

/// Creates `dir` (0700) if needed and checks that this user owns it and nobody else has any
/// access: someone who could write there could put their own socket in our place.
fn prepare_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let md = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let me = sys::euid();
    if !md.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if md.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this process's uid {me}",
            dir.display(),
            md.uid()
        ));
    }
    if md.mode() & 0o077 != 0 {
        return Err(format!(
            "{} is mode {:o}; only its owner may have access (chmod 700 {})",
            dir.display(),
            md.mode() & 0o7777,
            dir.display()
        ));
    }
    Ok(())
}

/// Removes `<pid>.ctl` files of processes that no longer exist.
pub fn remove_stale(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".ctl"))
            .and_then(|p| p.parse::<u32>().ok())
            && !shared_maps::pid_alive(pid)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The control thread: forever, one client after another.
fn serve(listener: UnixListener, handler: Arc<dyn Handler>) {
    let owner = sys::euid();
    let mut refused = HashSet::new();
    let mut failing = false;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                failing = false;
                let r = catch_unwind(AssertUnwindSafe(|| {
                    client(stream, &*handler, owner, &mut refused)
                }));
                if let Err(p) = r {
                    handler.log(
                        true,
                        &format!(
                            "control socket: a request panicked ({}); still serving",
                            panic_text(&*p)
                        ),
                    );
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors and the like: wait, never spin, keep the socket.
                if !failing {
                    handler.log(
                        true,
                        &format!("control socket: accept failed: {e}; retrying"),
                    );
                    failing = true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn client(stream: UnixStream, handler: &dyn Handler, owner: u32, refused: &mut HashSet<u32>) {
    let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let peer = match sys::peer(stream.as_raw_fd()) {
        Ok(p) => p,
        Err(e) => {
            handler.log(
                true,
                &format!("control socket: cannot identify a client ({e}); closed"),
            );
            return;
        }
    };
    if peer.uid != owner && peer.uid != 0 {
        let _ =
            (&stream).write_all(format!("refused: uid {} is not the owner\n", peer.uid).as_bytes());
        // Logged once per uid (a bounded set: a flood of uids stays quiet after 64).
        if refused.len() < 64 && refused.insert(peer.uid) {
            handler.log(
                true,
                &format!(
                    "control socket: refused a client of uid {} (pid {}): only uid {owner} and root may control this process",
                    peer.uid, peer.pid
                ),
            );
        }
        return;
    }
    let reply = match read_request(&stream) {
        Ok(line) => match Request::parse(&line) {
            Ok(req) => catch_unwind(AssertUnwindSafe(|| handler.handle(&req, peer)))
                .unwrap_or_else(|p| {
                    let msg = panic_text(&*p);
                    handler.log(
                        true,
                        &format!("control socket: request {req:?} panicked ({msg}); still serving"),
                    );
                    Reply::error(vec![], format!("internal error: {msg}"))
                }),
            Err(e) => Reply::error(vec![], e),
        },
        Err(e) => Reply::error(vec![], e),
    };
    let _ = (&stream).write_all(reply.to_text().as_bytes());
}

fn read_request(stream: &UnixStream) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    let mut r = BufReader::new(stream).take(MAX_REQUEST as u64 + 1);
    match r.read_until(b'\n', &mut line) {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Err(format!("no request within {} s", CLIENT_TIMEOUT.as_secs()));
        }
        Err(e) => return Err(format!("reading the request: {e}")),
    }
    if line.len() > MAX_REQUEST {
        return Err(format!("request longer than {MAX_REQUEST} bytes"));
    }
    if line.is_empty() {
        return Err("empty request".into());
    }
    Ok(line)
}
