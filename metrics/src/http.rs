//! A small HTTP/1.1 server for scrapes: one thread, one connection at a time, one request per
//! connection (`Connection: close`), `GET` and `HEAD` only.
//!
//! Why not a general server: the same code runs inside a training process (the plugin's
//! in-process endpoint), where it must never start threads without bound (a thread per
//! connection, as `tiny_http` does), must not hold a runtime, and must stop and be joined when
//! NCCL finalizes. Scrapes come every few seconds, so serving them in turn is enough; a client
//! gets [`READ_TIMEOUT`] in all to send its request head (at most [`MAX_HEAD`] bytes, parsed by
//! `httparse`) and [`WRITE_TIMEOUT`] in all to take the answer, so a slow or silent client delays the
//! next one by at most that. Malformed requests get 400, other methods 405, unknown paths 404,
//! a handler that panics 500; nothing here panics on input.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a client has to send its whole request head (however it trickles in).
pub const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a client has to take the whole answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head read.
pub const MAX_HEAD: usize = 8192;
/// How often the accept loop looks at the stop flag when no client comes.
const POLL: Duration = Duration::from_millis(50);

/// An answer.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Response {
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }
}

/// Answers a `GET` of `path` (the query string removed); `None` is 404.
pub type Handler = dyn Fn(&str) -> Option<Response> + Send + Sync;

/// A running server; stopped (and its thread joined) by [`Server::stop`] or on drop.
pub struct Server {
    addr: SocketAddr,
    /// The listener's descriptor (owned by the serving thread).
    fd: RawFd,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` (port 0: any free port, see [`Server::local_addr`]) and serves on a thread
    /// named `name`.
    pub fn start(addr: SocketAddr, name: &str, handler: Arc<Handler>) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let fd = listener.as_raw_fd();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || serve(listener, &flag, &*handler))?;
        Ok(Server {
            addr,
            fd,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, finishes the client being served (within the timeouts) and joins the
    /// thread.
    pub fn stop(mut self) {
        self.halt();
    }

    /// Serves until the thread ends (it ends only when stopped, so: forever).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// In a child forked while the server ran: the serving thread is not in this process, so
    /// nothing is joined; the child's copy of the listener is closed, so the port stays the
    /// parent's alone and closes when the parent stops.
    pub fn abandon_after_fork(self) {
        let fd = self.fd;
        // No join (the thread is the parent's); the flag's Arc leaks, a few bytes.
        std::mem::forget(self);
        // SAFETY: `fd` is the listener the serving thread owns in the parent; in this child no
        // thread uses it and nothing else owns this descriptor, so closing it frees only the
        // child's copy.
        unsafe { libc::close(fd) };
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.halt();
    }
}

fn serve(listener: TcpListener, stop: &AtomicBool, handler: &Handler) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, _)) => {
                // Whatever happens with one client, the loop goes on.
                let _ = catch_unwind(AssertUnwindSafe(|| serve_one(s, handler)));
            }
            // WouldBlock: nobody waiting. Other errors (EMFILE, ECONNABORTED): try later.
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

/// The time left until `deadline`, `None` when it has passed.
fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

fn serve_one(mut s: TcpStream, handler: &Handler) -> io::Result<()> {
    s.set_nonblocking(false)?;
    let read_by = Instant::now() + READ_TIMEOUT;
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    let (head_only, resp) = loop {
        if len == buf.len() {
            break (false, Response::text(431, "request head too large\n"));
        }
        // One deadline for the whole head: a client sending a byte now and then is cut off.
        let Some(t) = left(read_by) else {
            break (
                false,
                Response::text(408, "request head not received in time\n"),
            );
        };
        s.set_read_timeout(Some(t))?;
        let n = match s.read(&mut buf[len..]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break (
                    false,
                    Response::text(408, "request head not received in time\n"),
                );
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Partial) => continue,
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("");
                let path = req.path.unwrap_or("");
                let path = path.split('?').next().unwrap_or("");
                let head = method == "HEAD";
                if method != "GET" && !head {
                    break (false, Response::text(405, "only GET and HEAD\n"));
                }
                let r = match catch_unwind(AssertUnwindSafe(|| handler(path))) {
                    Ok(Some(r)) => r,
                    Ok(None) => Response::text(404, "not found; metrics are at /metrics\n"),
                    Err(_) => Response::text(500, "the handler failed\n"),
                };
                break (head, r);
            }
            Err(_) => break (false, Response::text(400, "malformed request\n")),
        }
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len()
    );
    if resp.status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if !head_only {
        bytes.extend_from_slice(resp.body.as_bytes());
    }
    // One deadline for the whole answer: a client reading slowly is cut off.
    let write_by = Instant::now() + WRITE_TIMEOUT;
    let mut sent = 0;
    while sent < bytes.len() {
        let t = left(write_by).ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))?;
        s.set_write_timeout(Some(t))?;
        match s.write(&bytes[sent..]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        let h: Arc<Handler> = Arc::new(|p: &str| match p {
            "/metrics" => Some(Response {
                status: 200,
                content_type: PROMETHEUS_TEXT,
                body: "up 1\n".into(),
            }),
            "/boom" => panic!("boom"),
            _ => None,
        });
        Server::start("127.0.0.1:0".parse().unwrap(), "test-http", h).unwrap()
    }

    fn raw(addr: SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let srv = server();
        let a = srv.local_addr();
        let url = format!("http://{a}/metrics?x=1");
        let mut r = ureq::get(&url).call().unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers().get("content-type").unwrap(),
            "text/plain; version=0.0.4; charset=utf-8"
        );
        assert_eq!(r.body_mut().read_to_string().unwrap(), "up 1\n");
        let e = ureq::get(&format!("http://{a}/other")).call().unwrap_err();
        assert!(matches!(e, ureq::Error::StatusCode(404)), "{e}");
        let e = ureq::get(&format!("http://{a}/boom")).call().unwrap_err();
        assert!(matches!(e, ureq::Error::StatusCode(500)), "{e}");
        let e = ureq::post(&format!("http://{a}/metrics"))
            .send("x")
            .unwrap_err();
        assert!(matches!(e, ureq::Error::StatusCode(405)), "{e}");
        let head = raw(a, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(head.contains("Content-Length: 5\r\n"), "{head}");
        assert!(raw(a, b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400 "));
        assert!(raw(a, &[b'a'; MAX_HEAD + 10]).starts_with("HTTP/1.1 4"));
        // A client that says nothing is answered 408 after the read timeout, and the next
        // one is served.
        let silent = TcpStream::connect(a).unwrap();
        let t = std::time::Instant::now();
        let mut r = ureq::get(&url).call().unwrap();
        assert_eq!(r.body_mut().read_to_string().unwrap(), "up 1\n");
        assert!(t.elapsed() < READ_TIMEOUT * 3);
        drop(silent);
        // One that trickles its head in, a byte at a time, is cut off at the deadline too.
        let mut slow = TcpStream::connect(a).unwrap();
        let t = std::time::Instant::now();
        let mut answer = String::new();
        let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
        for b in head.iter().chain(std::iter::repeat_n(&b'a', 400)) {
            if slow.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            if t.elapsed() > READ_TIMEOUT * 3 {
                break;
            }
        }
        let _ = slow.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408 "), "{answer:?}");
        assert!(t.elapsed() < READ_TIMEOUT * 3, "{:?}", t.elapsed());
        let t = std::time::Instant::now();
        srv.stop();
        assert!(t.elapsed() < Duration::from_secs(1), "stopped promptly");
        assert!(TcpStream::connect(a).is_err(), "nothing listens after stop");
    }
}
