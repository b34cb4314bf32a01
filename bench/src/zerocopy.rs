//! `ncclbpf-bench zerocopy`: does `send` with `MSG_ZEROCOPY` beat a plain `send` over this
//! machine's TCP loopback? Issue 11 asks for zero-copy send "where it measures faster"; this
//! is the measurement.
//!
//! Each measurement opens `--streams` fresh TCP connections over 127.0.0.1 (blocking sockets,
//! `TCP_NODELAY`, `NCCL_BPF_TCP_CONGESTION` if set, as the raw TCP arms of `loopback`), with one
//! sender and one receiver thread per connection. A sender sends whole messages of one size
//! from one buffer; a receiver reads into one reused buffer of the message's size. After an
//! untimed warm-up every thread waits for the others, then each stream moves its share of the
//! total; the time runs from the first thread's start to the last thread's end.
//!
//! The zero-copy arm sets `SO_ZEROCOPY` on the senders and passes `MSG_ZEROCOPY` to `send`. The
//! kernel then reports each send's completion on the socket's error queue; a sender reads those
//! (`recvmsg(MSG_ERRQUEUE)`) whenever a few are outstanding, when `send` says `ENOBUFS` (the
//! notifications are charged to the socket's option memory, `net.core.optmem_max`), and before
//! it finishes, as a real user must before it may reuse its buffer: that waiting is part of the
//! arm's time. A notification with `SO_EE_CODE_ZEROCOPY_COPIED` says the kernel copied the data
//! anyway (it does when it delivers the pages to a local socket); the table gives the share.

use crate::common::{self, cell, human};
use crate::loopback::ratio;
use std::io::{self, Read};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// `SO_ZEROCOPY` of `asm-generic/socket.h` (x86-64, arm64); the `libc` crate does not export it.
const SO_ZEROCOPY: libc::c_int = 60;
/// `linux/errqueue.h`.
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `linux/errqueue.h`: the kernel copied the data instead of sending the pages.
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// A sender reads the error queue once this many of its sends are not yet completed.
const REAP_AT: u64 = 8;

const SIZES: [usize; 5] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
const QUICK_SIZES: [usize; 2] = [64 << 10, 1 << 20];

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Message sizes, comma-separated: bytes, or with a K/KiB or M/MiB suffix. Default
    /// 64K,256K,1M,4M,16M, or 64K,1M with --quick.
    #[arg(long, value_delimiter = ',', value_parser = crate::common::parse_size)]
    pub sizes: Option<Vec<usize>>,
    /// TCP connections over loopback, each with one sender and one receiver thread.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub streams: u32,
    /// MiB moved per measurement, shared evenly by the streams (whole messages, at least one
    /// per stream). Default 512, or 8 with --quick.
    #[arg(long)]
    pub total_mib: Option<usize>,
    /// Rounds: each round measures every size with both arms, one after the other, the first
    /// arm alternating from size to size and round to round. The table shows the median and
    /// the min–max over rounds. Default 3, or 1 with --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// A smoke run of about a second: two sizes, 8 MiB per measurement, one round.
    #[arg(long)]
    pub quick: bool,
}

/// What a sender's error queue said, in the timed part of one measurement.
#[derive(Clone, Copy, Debug, Default)]
struct Notes {
    /// Notifications read (each covers a range of sends).
    notes: u64,
    /// Of those, the ones with `SO_EE_CODE_ZEROCOPY_COPIED`.
    copied: u64,
    /// Sends completed (the sum of the ranges).
    sends: u64,
}

impl Notes {
    fn add(&mut self, o: Notes) {
        self.notes += o.notes;
        self.copied += o.copied;
        self.sends += o.sends;
    }
}

/// The completion side of one zero-copy sender: counts the sends the kernel took and the ones
/// its notifications completed.
struct Reaper {
    fd: RawFd,
    /// Sends that returned > 0 (each takes one notification id).
    sent: u64,
    /// Sends completed by the notifications read so far.
    done: u64,
    notes: Notes,
}

impl Reaper {
    fn new(fd: RawFd) -> Reaper {
        Reaper {
            fd,
            sent: 0,
            done: 0,
            notes: Notes::default(),
        }
    }

    fn outstanding(&self) -> u64 {
        self.sent - self.done
    }

    /// Reads every notification queued now, without waiting.
    fn reap(&mut self) -> io::Result<()> {
        loop {
            // Room for a few control messages; u64 for cmsghdr's alignment.
            let mut ctrl = [0u64; 32];
            // SAFETY: msghdr is plain data, for which all zeroes is a valid value (no name, no
            // iovec, no control buffer yet).
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_control = ctrl.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&ctrl) as _;
            // SAFETY: `msg` points at `ctrl` with its length, both alive for the call; no data
            // buffers (an error-queue read of a TCP socket carries no payload).
            let r = unsafe {
                libc::recvmsg(self.fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT)
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(()),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(io::Error::other("error queue: control message truncated"));
            }
            // SAFETY: `msg` is the header recvmsg just filled; its control pointer and length
            // are within `ctrl`.
            let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            while !c.is_null() {
                // SAFETY: `c` is a non-null header that CMSG_FIRSTHDR/CMSG_NXTHDR found inside
                // the control data recvmsg wrote.
                let (level, ty) = unsafe { ((*c).cmsg_level, (*c).cmsg_type) };
                if (level == libc::SOL_IP && ty == libc::IP_RECVERR)
                    || (level == libc::SOL_IPV6 && ty == libc::IPV6_RECVERR)
                {
                    // SAFETY: a (SOL_IP, IP_RECVERR) or (SOL_IPV6, IPV6_RECVERR) control message
                    // carries a sock_extended_err (plain data); read unaligned, as CMSG_DATA
                    // promises no alignment for it.
                    let ee: libc::sock_extended_err =
                        unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
                    if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY && ee.ee_errno == 0 {
                        // Sends ee_info ..= ee_data (ids wrap at 2^32).
                        let n = u64::from(ee.ee_data.wrapping_sub(ee.ee_info)) + 1;
                        self.done += n;
                        self.notes.notes += 1;
                        self.notes.sends += n;
                        if ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0 {
                            self.notes.copied += 1;
                        }
                    } else if ee.ee_errno != 0 {
                        return Err(io::Error::from_raw_os_error(ee.ee_errno as i32));
                    }
                }
                // SAFETY: as for CMSG_FIRSTHDR; `c` is a header inside that control data.
                c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
            }
        }
    }

    /// Waits up to `timeout` for the error queue to have something, then reads it.
    fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let mut p = libc::pollfd {
            fd: self.fd,
            // POLLERR (a non-empty error queue) is reported whatever `events` asks for.
            events: 0,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd, alive for the call.
        let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        self.reap()
    }

    /// Waits until every send is completed (then its buffer may be reused or freed).
    fn drain(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.reap()?;
            if self.outstanding() == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} send(s) not completed after 30 s",
                    self.outstanding()
                )));
            }
            self.wait(Duration::from_millis(100))?;
        }
    }
}

/// Sends all of `buf` on `fd` (with `MSG_ZEROCOPY` when `zc` is set), reading notifications as
/// `zc` needs.
fn send_msg(fd: RawFd, buf: &[u8], zc: Option<&mut Reaper>) -> io::Result<()> {
    let flags = libc::MSG_NOSIGNAL | if zc.is_some() { libc::MSG_ZEROCOPY } else { 0 };
    let mut zc = zc;
    let mut off = 0;
    let mut enobufs = 0;
    while off < buf.len() {
        let rest = &buf[off..];
        // SAFETY: pointer and length are those of `rest`, alive and not written during the
        // call. With MSG_ZEROCOPY the kernel goes on reading the pages after the call returns
        // (it pinned them); the sender never writes `buf` and frees it only after `drain`
        // (on an error path earlier, which at worst sends stale bytes: memory stays valid).
        let n = unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), flags) };
        if n >= 0 {
            off += n as usize;
            enobufs = 0;
            if let Some(z) = zc.as_deref_mut() {
                z.sent += 1;
                if z.outstanding() >= REAP_AT {
                    z.reap()?;
                }
            }
            continue;
        }
        let e = io::Error::last_os_error();
        match (e.raw_os_error(), zc.as_deref_mut()) {
            (Some(libc::EINTR), _) => {}
            // Option memory (or locked pages) full until notifications are read.
            (Some(libc::ENOBUFS), Some(z)) => {
                if z.outstanding() > 0 {
                    z.wait(Duration::from_millis(100))?;
                } else {
                    enobufs += 1;
                    if enobufs > 1000 {
                        return Err(io::Error::other(
                            "send(MSG_ZEROCOPY): ENOBUFS with no send outstanding (RLIMIT_MEMLOCK \
                             without CAP_IPC_LOCK?)",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// `setsockopt(SO_ZEROCOPY, 1)`.
fn set_zerocopy(fd: RawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: the option value is one c_int, alive for the call, with its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ZEROCOPY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of_val(&one) as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `streams` connected pairs (sender, receiver) over 127.0.0.1.
fn pairs(streams: usize, zc: bool) -> io::Result<Vec<(TcpStream, TcpStream)>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let cc = std::env::var("NCCL_BPF_TCP_CONGESTION").ok();
    let mut out = vec![];
    for _ in 0..streams {
        let tx = TcpStream::connect(l.local_addr()?)?;
        let (rx, _) = l.accept()?;
        for s in [&tx, &rx] {
            s.set_nodelay(true)?;
            if let Some(cc) = &cc {
                socket2::SockRef::from(s).set_tcp_congestion(cc.trim().as_bytes())?;
            }
        }
        if zc {
            set_zerocopy(tx.as_raw_fd())?;
        }
        out.push((tx, rx));
    }
    Ok(out)
}

/// A thread's timed part: its start, its end, and (senders of the zero-copy arm) the
/// notifications.
type Part = (Instant, Instant, Notes);

/// `n` messages of `buf` on `fd`; then, for the zero-copy arm, every notification.
fn send_n(fd: RawFd, buf: &[u8], n: usize, mut zc: Option<&mut Reaper>) -> io::Result<()> {
    for _ in 0..n {
        send_msg(fd, buf, zc.as_deref_mut())?;
    }
    match zc {
        Some(z) => z.drain(),
        None => Ok(()),
    }
}

/// One sender: `warm` untimed messages, all threads meet, `msgs` timed ones.
fn sender(
    s: &TcpStream,
    size: usize,
    warm: usize,
    msgs: usize,
    zc: bool,
    go: &Barrier,
) -> Result<Part, String> {
    let fd = s.as_raw_fd();
    let buf = vec![7u8; size];
    let mut reaper = zc.then(|| Reaper::new(fd));
    let w = send_n(fd, &buf, warm, reaper.as_mut());
    if w.is_err() {
        // The peer sees the end of the stream and stops too.
        let _ = s.shutdown(Shutdown::Both);
    }
    go.wait();
    w.map_err(|e| format!("warm-up send: {e}"))?;
    // Only the timed part's notifications count (the warm-up's were all read).
    if let Some(z) = reaper.as_mut() {
        z.notes = Notes::default();
    }
    let t0 = Instant::now();
    let r = send_n(fd, &buf, msgs, reaper.as_mut());
    let t1 = Instant::now();
    if let Err(e) = r {
        let _ = s.shutdown(Shutdown::Both);
        return Err(format!("send: {e}"));
    }
    Ok((t0, t1, reaper.map(|z| z.notes).unwrap_or_default()))
}

/// One receiver: reads `warm` then `msgs` messages' bytes into one reused buffer.
fn receiver(
    s: &TcpStream,
    size: usize,
    warm: usize,
    msgs: usize,
    go: &Barrier,
) -> Result<Part, String> {
    let mut buf = vec![0u8; size];
    let mut read = |total: usize| -> io::Result<()> {
        let mut rem = total;
        while rem > 0 {
            let k = rem.min(buf.len());
            match (&*s).read(&mut buf[..k]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed")),
                Ok(n) => rem -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    let w = read(warm * size);
    if w.is_err() {
        let _ = s.shutdown(Shutdown::Both);
    }
    go.wait();
    w.map_err(|e| format!("warm-up receive: {e}"))?;
    let t0 = Instant::now();
    let r = read(msgs * size);
    let t1 = Instant::now();
    if let Err(e) = r {
        let _ = s.shutdown(Shutdown::Both);
        return Err(format!("receive: {e}"));
    }
    Ok((t0, t1, Notes::default()))
}

/// One measurement: GB/s of `streams` streams moving `msgs` messages of `size` each (after
/// `warm` untimed ones), and the zero-copy senders' notifications.
fn measure(
    size: usize,
    streams: usize,
    warm: usize,
    msgs: usize,
    zc: bool,
) -> Result<(f64, Notes), String> {
    let socks = pairs(streams, zc).map_err(|e| format!("loopback setup: {e}"))?;
    let go = Barrier::new(2 * streams);
    let parts: Vec<Result<Part, String>> = std::thread::scope(|sc| {
        let mut hs = vec![];
        for (tx, rx) in &socks {
            let go = &go;
            hs.push(sc.spawn(move || sender(tx, size, warm, msgs, zc, go)));
            hs.push(sc.spawn(move || receiver(rx, size, warm, msgs, go)));
        }
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into())))
            .collect()
    });
    let mut notes = Notes::default();
    let (mut t0, mut t1) = (None::<Instant>, None::<Instant>);
    for p in parts {
        let (a, b, n) = p?;
        t0 = Some(t0.map_or(a, |t| t.min(a)));
        t1 = Some(t1.map_or(b, |t| t.max(b)));
        notes.add(n);
    }
    let (Some(t0), Some(t1)) = (t0, t1) else {
        return Err("no streams".into());
    };
    let bytes = (streams * msgs * size) as f64;
    Ok((bytes / (t1 - t0).as_secs_f64() / 1e9, notes))
}

/// The command line, as a shell would take it back.
fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Figures of one size and arm over rounds (`None`: that round failed).
#[derive(Default)]
struct Figures {
    gbps: Vec<Option<f64>>,
    notes: Notes,
}

pub fn run(a: &Args) -> Result<(), String> {
    let sizes: Vec<usize> = match &a.sizes {
        Some(s) => s.clone(),
        None if a.quick => QUICK_SIZES.to_vec(),
        None => SIZES.to_vec(),
    };
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let total = a.total_mib.unwrap_or(if a.quick { 8 } else { 512 }).max(1) << 20;
    let streams = a.streams as usize;
    let t0 = Instant::now();
    let load0 = common::load();
    let m = common::machine();
    let (machine, date) = m.rsplit_once(", ").unwrap_or((&m, "?"));
    println!(
        "ncclbpf-bench zerocopy: plain send against send(MSG_ZEROCOPY) over TCP loopback \
         (issue 11)"
    );
    println!("machine: {machine}");
    println!("date: {date} (UTC)");
    println!("command: {}", command_line());

    // Does this kernel take SO_ZEROCOPY at all?
    let probe = pairs(1, false).map_err(|e| format!("loopback setup: {e}"))?;
    if let Err(e) = set_zerocopy(probe[0].0.as_raw_fd()) {
        println!(
            "\nSO_ZEROCOPY refused (setsockopt(SOL_SOCKET, SO_ZEROCOPY, 1): {e}): MSG_ZEROCOPY \
             is not available here, nothing measured"
        );
        return Ok(());
    }
    drop(probe);

    // Per stream: whole messages, at least one; the warm-up an eighth of that, at least two.
    let plan = |size: usize| {
        let msgs = (total / streams / size).max(1);
        ((msgs / 8).max(2), msgs)
    };
    let mut figs: Vec<[Figures; 2]> = sizes.iter().map(|_| Default::default()).collect();
    let mut errors = vec![];
    for round in 0..rounds {
        for (i, &size) in sizes.iter().enumerate() {
            let (warm, msgs) = plan(size);
            let first_zc = (round + i) % 2 == 1;
            for zc in [first_zc, !first_zc] {
                common::progress(Some(format_args!(
                    "round {}/{rounds}: {} {}",
                    round + 1,
                    human(size),
                    if zc { "MSG_ZEROCOPY" } else { "plain" }
                )));
                let f = &mut figs[i][zc as usize];
                match measure(size, streams, warm, msgs, zc) {
                    Ok((g, n)) => {
                        f.gbps.push(Some(g));
                        f.notes.add(n);
                    }
                    Err(e) => {
                        f.gbps.push(None);
                        errors.push(format!(
                            "{} {}, round {}: {e}",
                            human(size),
                            if zc { "MSG_ZEROCOPY" } else { "plain" },
                            round + 1
                        ));
                    }
                }
            }
        }
    }
    common::progress(None);

    let optmem = std::fs::read_to_string("/proc/sys/net/core/optmem_max")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    println!(
        "run: {streams} stream(s) over 127.0.0.1, one sender and one receiver thread each \
         (blocking sockets, TCP_NODELAY; the receiver reads into one reused buffer); {} MiB \
         per measurement (whole messages per stream) after an untimed warm-up of an eighth of \
         that; {rounds} round(s), the two arms back to back, the first one alternating; \
         net.core.optmem_max {optmem}; {:.0} s, load average {load0} at start, {} at end",
        total >> 20,
        t0.elapsed().as_secs_f64(),
        common::load()
    );
    if common::cores() < 2 * streams {
        println!(
            "note: {} cores for {} sender and receiver threads: the copies of both sides share \
             the cores, so throughput is CPU-bound and figures vary between rounds",
            common::cores(),
            2 * streams
        );
    }
    println!(
        "\n#### Throughput (GB/s, median (min–max) over rounds; ratio = MSG_ZEROCOPY / plain, of \
         the medians, and in brackets the least and greatest of one round's pair)\n"
    );
    println!(
        "| size | plain send | send(MSG_ZEROCOPY) | zerocopy / plain | copied by the kernel \
         (notifications) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let ok = |v: &[Option<f64>]| v.iter().flatten().copied().collect::<Vec<f64>>();
    let (mut faster, mut slower, mut even) = (vec![], vec![], vec![]);
    for (i, &size) in sizes.iter().enumerate() {
        let [plain, zc] = &figs[i];
        let r = ratio(&zc.gbps, &plain.gbps, &|z, p| z / p);
        let rcell = match r {
            Some((m, lo, hi)) if zc.gbps.len() > 1 => format!("{m:.2}× ({lo:.2}–{hi:.2})"),
            Some((m, _, _)) => format!("{m:.2}×"),
            None => "–".into(),
        };
        match r {
            Some((_, lo, _)) if lo > 1.0 => faster.push(human(size)),
            Some((_, _, hi)) if hi < 1.0 => slower.push(human(size)),
            Some(_) => even.push(human(size)),
            None => {}
        }
        let n = zc.notes;
        let copied = if n.notes == 0 {
            "–".into()
        } else {
            format!(
                "{:.1}% ({} of {}, covering {} sends)",
                100.0 * n.copied as f64 / n.notes as f64,
                n.copied,
                n.notes,
                n.sends
            )
        };
        println!(
            "| {} | {} | {} | {rcell} | {copied} |",
            human(size),
            cell(&ok(&plain.gbps), 2),
            cell(&ok(&zc.gbps), 2),
        );
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    println!(
        "\nanswer: MSG_ZEROCOPY faster in every round at: {}; slower in every round at: {}; \
         neither (the rounds disagree) at: {}",
        list(&faster),
        list(&slower),
        list(&even)
    );
    let all: Notes = figs.iter().fold(Notes::default(), |mut acc, f| {
        acc.add(f[1].notes);
        acc
    });
    if all.notes > 0 {
        print!(
            "copied: {} of {} completion notifications ({:.1}%) carried \
             SO_EE_CODE_ZEROCOPY_COPIED (the kernel copied the data instead of sending the pages)",
            all.copied,
            all.notes,
            100.0 * all.copied as f64 / all.notes as f64
        );
        if all.copied == all.notes {
            print!(
                ": here it copied every time (it copies pages it delivers to a local socket), so \
                 MSG_ZEROCOPY saved no copy and added page pinning and notification reads"
            );
        }
        println!(
            "; the zero-copy arm's time includes reading every notification, as a sender must \
             before it reuses its buffer"
        );
    }
    common::failures(&errors)
}

#[cfg(test)]
mod tests {
    use crate::common::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256KiB"), Ok(256 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1G").is_err());
        assert!(parse_size("x").is_err());
    }
}
