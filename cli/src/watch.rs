//! `ncclbpf status --watch`: a live terminal view of what [`crate::status`] prints, refreshed
//! every `--interval` seconds.
//!
//! A reader thread reads the connection tables from shared memory each refresh and sends the
//! [`Sample`] to the UI thread; control sockets are asked by one short-lived thread per process
//! (at most one in flight each, [`SOCKET_TIMEOUT`]), whose latest answer the next sample
//! carries. So a stopped process, whose socket never answers, holds up neither the tables of the
//! others nor the keyboard: the UI thread only draws and reads keys. Throughput is the bytes a
//! connection moved between two samples over the time between them on the table's clock.
//!
//! The terminal is restored however the view ends: q, Esc, Ctrl-C, SIGTERM, SIGHUP (a flag the
//! loop looks at), an error (a guard's `Drop`) or a panic (ratatui's panic hook, then the guard
//! while unwinding).

use crate::reload::{self, Targets};
use crate::status::{self, Proc, SOCKET_TIMEOUT, Stall};
use ncclbpf_control::{ClientError, Reply, Request};
use ratatui::Frame;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use shared_maps::ConnSnapshot;
use shared_maps::conn_table;
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One refresh: what was read of every process.
#[derive(Default)]
pub(crate) struct Sample {
    /// `answer` is the latest answer of the control socket (`Err` also while the first is
    /// awaited: then the pid is in `asking`).
    pub procs: Vec<Proc>,
    /// Processes whose socket was asked and has not answered yet, the first time.
    pub asking: HashSet<u32>,
    /// Ranks read from the processes' environments, where set.
    pub ranks: HashMap<u32, u32>,
    /// The process list could not be made (`--all` found none): shown instead.
    pub error: Option<String>,
}

/// A connection across samples: (pid, connection id, direction).
pub(crate) type Key = (u32, u64, &'static str);

fn key(pid: u32, c: &ConnSnapshot) -> Key {
    (pid, c.conn_id, c.direction.name())
}

/// Bytes per second each connection moved from `prev` to `cur` (over the tables' clock). A
/// connection new in `cur`, one whose count went down (its slot was reused) or a table whose
/// clock did not move has none.
pub(crate) fn rates(prev: Option<&Sample>, cur: &Sample) -> HashMap<Key, f64> {
    let mut out = HashMap::new();
    let Some(prev) = prev else { return out };
    let before: HashMap<u32, &conn_table::ProcessConns> = prev
        .procs
        .iter()
        .filter_map(|p| match &p.table {
            Ok(Some(t)) => Some((p.pid, t)),
            _ => None,
        })
        .collect();
    for p in &cur.procs {
        let (Ok(Some(t)), Some(b)) = (&p.table, before.get(&p.pid)) else {
            continue;
        };
        let dt = t.now_ns.saturating_sub(b.now_ns);
        if dt == 0 {
            continue;
        }
        let old: HashMap<Key, u64> = b.conns.iter().map(|c| (key(p.pid, c), c.bytes)).collect();
        for c in &t.conns {
            if let Some(&was) = old.get(&key(p.pid, c))
                && c.bytes >= was
            {
                out.insert(key(p.pid, c), (c.bytes - was) as f64 * 1e9 / dt as f64);
            }
        }
    }
    out
}

/// `1.5 MB/s` (powers of 1000).
pub(crate) fn rate_text(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(v) if v < 1e3 => format!("{v:.0} B/s"),
        Some(v) if v < 1e6 => format!("{:.1} kB/s", v / 1e3),
        Some(v) if v < 1e9 => format!("{:.1} MB/s", v / 1e6),
        Some(v) => format!("{:.2} GB/s", v / 1e9),
    }
}

/// What one frame shows.
pub(crate) struct View<'a> {
    pub sample: &'a Sample,
    pub rates: &'a HashMap<Key, f64>,
    pub stall_after_s: f64,
    pub interval_s: f64,
    /// Lines of the process list scrolled off the top.
    pub scroll: u16,
}

fn red() -> Style {
    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
}

/// ` rank R`, where known.
fn rank(s: &Sample, pid: u32) -> String {
    s.ranks
        .get(&pid)
        .map_or(String::new(), |r| format!(" rank {r}"))
}

/// ` (pid N rank R)` naming the other end of `c`, where it is among the processes read.
fn peer_label(s: &Sample, ends: &status::Ends, c: &ConnSnapshot, sep: &str) -> String {
    match status::peer_pid(ends, c) {
        Some(pp) => match s.ranks.get(&pp) {
            Some(r) => format!(" (pid {pp}{sep}rank {r})"),
            None => format!(" (pid {pp})"),
        },
        None => String::new(),
    }
}

/// The line naming a process and what its socket said.
fn header(s: &Sample, p: &Proc) -> Line<'static> {
    let who = format!("pid {}{}", p.pid, rank(s, p.pid));
    let (text, style) = match &p.answer {
        Ok(_) => {
            // status's own first line: "pid N: net generation G, P program(s) alive".
            let first = reload::status_text(p.pid, &p.answer);
            let first = first.lines().next().unwrap_or_default();
            let rest = first
                .strip_prefix(&format!("pid {}:", p.pid))
                .unwrap_or(first);
            (
                format!("{who}:{rest}"),
                Style::new().add_modifier(Modifier::BOLD),
            )
        }
        Err(_) if s.asking.contains(&p.pid) => (
            format!("{who}: asking its control socket…"),
            Style::new().fg(Color::DarkGray),
        ),
        Err(e) if p.unread() => (
            format!("{who}: unreadable: not answering ({e}), and no connection table"),
            red(),
        ),
        Err(e) => (
            format!("{who}: not answering: {e}"),
            Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ),
    };
    let mut spans = vec![Span::styled(text, style)];
    if let Some(a) = &p.metrics {
        spans.push(Span::raw(format!("  metrics http://{a}/metrics")));
    }
    Line::from(spans)
}

const HEAD: [&str; 10] = [
    "DIR", "PEER", "COMM", "CONN", "BYTES", "RATE", "PENDING", "IDLE_S", "WAIT_S", "",
];

/// The process list: a header per process, then its connections.
fn body(v: &View, ends: &status::Ends, after: u64) -> Vec<Line<'static>> {
    let s = v.sample;
    if let Some(e) = &s.error {
        return vec![Line::styled(e.clone(), red())];
    }
    // Every row of every process first, so that the columns line up across processes.
    enum Row {
        Head(Line<'static>),
        Note(Line<'static>),
        Cells([String; 10], bool),
    }
    let mut rows = vec![];
    for p in &s.procs {
        rows.push(Row::Head(header(s, p)));
        let t = match &p.table {
            Ok(Some(t)) => t,
            Ok(None) => {
                rows.push(Row::Note(Line::raw(
                    "  connections: none registered (no connection opened yet, or no net plugin)",
                )));
                continue;
            }
            Err(e) => {
                rows.push(Row::Note(Line::styled(
                    format!("  connections: unreadable: {e}"),
                    Style::new().fg(Color::Red),
                )));
                continue;
            }
        };
        if t.conns.is_empty() {
            rows.push(Row::Note(Line::raw(format!(
                "  no connection (table of {})",
                t.capacity
            ))));
            continue;
        }
        rows.push(Row::Cells(HEAD.map(String::from), false));
        let mut conns: Vec<&ConnSnapshot> = t.conns.iter().collect();
        conns.sort_by_key(|c| (c.comm_id, c.direction.name(), c.peer_port, c.conn_id));
        for c in conns {
            let stalled = c.stalled(t.now_ns, after);
            rows.push(Row::Cells(
                [
                    c.direction.name().into(),
                    format!("{}{}", c.peer_text(), peer_label(s, ends, c, " ")),
                    status::hex(c.comm_id),
                    status::hex(c.conn_id),
                    c.bytes.to_string(),
                    rate_text(v.rates.get(&key(p.pid, c)).copied()),
                    c.inflight.to_string(),
                    format!("{:.1}", status::secs(c.since_progress_ns(t.now_ns))),
                    c.waiting_ns(t.now_ns)
                        .map_or("-".into(), |w| format!("{:.1}", status::secs(w))),
                    if stalled {
                        "STALLED".into()
                    } else {
                        String::new()
                    },
                ],
                stalled,
            ));
        }
    }
    let mut width = [0usize; 10];
    for r in &rows {
        if let Row::Cells(c, _) = r {
            for (w, cell) in width.iter_mut().zip(c) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    width[5] = width[5].max(10); // RATE: less jumping between refreshes
    rows.into_iter()
        .map(|r| match r {
            Row::Head(l) | Row::Note(l) => l,
            Row::Cells(c, stalled) => {
                let mut l = String::from("   ");
                for (k, cell) in c.iter().enumerate() {
                    let w = width[k];
                    if matches!(k, 0..=3 | 9) {
                        l.push_str(&format!(" {cell:<w$} "));
                    } else {
                        l.push_str(&format!(" {cell:>w$} "));
                    }
                }
                let l = l.trim_end().to_string();
                if stalled {
                    Line::styled(l, red())
                } else if c[0] == "DIR" {
                    Line::styled(l, Style::new().add_modifier(Modifier::UNDERLINED))
                } else {
                    Line::raw(l)
                }
            }
        })
        .collect()
}

fn stall_text(s: &Sample, ends: &status::Ends, x: &Stall) -> String {
    format!(
        "pid {}{}: {}",
        x.pid,
        rank(s, x.pid),
        status::stall_line_naming(x, peer_label(s, ends, x.conn, ", "))
    )
}

/// Draws one frame; returns how many lines the process list has (for scrolling).
pub(crate) fn draw(f: &mut Frame, v: &View) -> u16 {
    let s = v.sample;
    let ends = status::ends(&s.procs);
    let after = status::after_ns(v.stall_after_s);
    let stalls = status::stalls(&s.procs, &ends, after);
    let area = f.area();
    let stall_h = if stalls.is_empty() {
        0
    } else {
        (stalls.len() as u16 + 2).min(area.height / 3).max(3)
    };
    let [top, main, bottom] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(stall_h),
    ])
    .areas(area);
    let conns: usize = s
        .procs
        .iter()
        .map(|p| match &p.table {
            Ok(Some(t)) => t.conns.len(),
            _ => 0,
        })
        .sum();
    let not_answering = s
        .procs
        .iter()
        .filter(|p| p.answer.is_err() && !s.asking.contains(&p.pid))
        .count();
    let mut title = vec![Span::styled(
        format!(
            "ncclbpf status --watch: {} process(es), {conns} connection(s), ",
            s.procs.len()
        ),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    let stalled = format!(
        "{} stalled (pending, no progress for over {} s)",
        stalls.len(),
        v.stall_after_s
    );
    title.push(if stalls.is_empty() {
        Span::raw(stalled)
    } else {
        Span::styled(stalled, red())
    });
    if not_answering > 0 {
        title.push(Span::styled(
            format!(", {not_answering} not answering"),
            Style::new().fg(Color::Yellow),
        ));
    }
    title.push(Span::raw(format!(
        "; every {} s; q quits, arrows scroll",
        v.interval_s
    )));
    f.render_widget(Line::from(title), top);
    let lines = body(v, &ends, after);
    let n = u16::try_from(lines.len()).unwrap_or(u16::MAX);
    let scroll = v.scroll.min(n.saturating_sub(1));
    f.render_widget(Paragraph::new(lines).scroll((scroll, 0)), main);
    if !stalls.is_empty() {
        let lines: Vec<Line> = stalls
            .iter()
            .map(|x| Line::styled(stall_text(s, &ends, x), red()))
            .collect();
        let block = Block::bordered()
            .title(format!(" {} STALLED: look at the peer next ", stalls.len()))
            .border_style(Style::new().fg(Color::Red));
        f.render_widget(Paragraph::new(lines).block(block), bottom);
    }
    n
}

/// The rank in a process's environment: RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID
/// (readable for processes of this user).
fn rank_of(pid: u32) -> Option<u32> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let vars: HashMap<&[u8], &[u8]> = env
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|&b| b == b'=')?;
            Some((&kv[..eq], &kv[eq + 1..]))
        })
        .collect();
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|k| {
            std::str::from_utf8(vars.get(k.as_bytes())?)
                .ok()?
                .parse()
                .ok()
        })
}

/// Asks control sockets in the background: one thread per process at a time, each asked at
/// most once per `every`.
struct Asker {
    dir: PathBuf,
    every: Duration,
    answers: Arc<Mutex<HashMap<u32, Result<Reply, String>>>>,
    busy: Arc<Mutex<HashSet<u32>>>,
    last: HashMap<u32, Instant>,
}

impl Asker {
    fn ask(&mut self, pid: u32) {
        if self
            .last
            .get(&pid)
            .is_some_and(|t| t.elapsed() < self.every)
        {
            return;
        }
        if !self
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid)
        {
            return;
        }
        self.last.insert(pid, Instant::now());
        let (dir, answers, busy) = (self.dir.clone(), self.answers.clone(), self.busy.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("ask-{pid}"))
            .spawn(move || {
                let r = ncclbpf_control::request_in(&dir, pid, &Request::Status, SOCKET_TIMEOUT)
                    .map_err(|e| status::silent(e).to_string());
                answers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(pid, r);
                busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid);
            });
        if spawned.is_err() {
            self.busy
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&pid);
        }
    }

    fn answer(&self, pid: u32) -> Option<Result<Reply, String>> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pid)
            .cloned()
    }
}

/// One sample: the tables read now, the sockets' latest answers.
fn sample(
    dir: &Path,
    targets: &Targets,
    asker: &mut Asker,
    ranks: &mut HashMap<u32, Option<u32>>,
) -> Sample {
    let pids = match status::pids_in(dir, targets) {
        Ok(p) => p,
        Err(e) => {
            return Sample {
                error: Some(e),
                ..Sample::default()
            };
        }
    };
    let mut s = Sample::default();
    for &pid in &pids {
        asker.ask(pid);
        if let Some(r) = *ranks.entry(pid).or_insert_with(|| rank_of(pid)) {
            s.ranks.insert(pid, r);
        }
        let answer = match asker.answer(pid) {
            Some(a) => a.map_err(ClientError::Protocol),
            None => {
                s.asking.insert(pid);
                Err(ClientError::Protocol("not answered yet".into()))
            }
        };
        s.procs.push(Proc {
            pid,
            answer,
            table: conn_table::read_process_in(dir, pid),
            metrics: status::metrics_addr(dir, pid),
        });
    }
    s
}

/// Restores the terminal when dropped (also while unwinding from a panic).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// `ncclbpf status --watch` (stdout is a terminal): 0 when quit, 2 on a terminal error.
pub fn run(dir: &Path, targets: Targets, stall_after_s: f64, interval_s: f64) -> u8 {
    let (tx, rx) = mpsc::channel();
    let every = Duration::from_secs_f64(interval_s);
    let mut asker = Asker {
        dir: dir.to_path_buf(),
        every: every.max(Duration::from_secs(1)),
        answers: Arc::default(),
        busy: Arc::default(),
        last: HashMap::new(),
    };
    let reader_dir = dir.to_path_buf();
    let reader = std::thread::Builder::new()
        .name("watch-reader".into())
        .spawn(move || {
            let mut ranks = HashMap::new();
            loop {
                let s = sample(&reader_dir, &targets, &mut asker, &mut ranks);
                if tx.send(s).is_err() {
                    return;
                }
                std::thread::sleep(every);
            }
        });
    if let Err(e) = reader {
        eprintln!("ncclbpf status --watch: cannot start the reader thread: {e}");
        return status::FAILED;
    }
    // SIGTERM, SIGHUP (the terminal went away) and SIGINT end the view like `q`, so the
    // terminal is restored: the loop below looks at the flag at every turn (50 ms).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGINT,
    ] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
            eprintln!("ncclbpf status --watch: cannot handle signal {sig}: {e}");
            return status::FAILED;
        }
    }
    let guard = Restore;
    let r = ratatui::try_init().and_then(|mut t| ui(&mut t, &rx, stall_after_s, interval_s, &stop));
    drop(guard);
    match r {
        Ok(()) => status::OK,
        Err(e) => {
            eprintln!("ncclbpf status --watch: {e}");
            status::FAILED
        }
    }
}

fn ui(
    term: &mut ratatui::DefaultTerminal,
    rx: &Receiver<Sample>,
    stall_after_s: f64,
    interval_s: f64,
    stop: &std::sync::atomic::AtomicBool,
) -> io::Result<()> {
    let mut cur: Option<Sample> = None;
    let mut rates = HashMap::new();
    let mut scroll: u16 = 0;
    let mut dirty = true;
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        loop {
            match rx.try_recv() {
                Ok(s) => {
                    rates = self::rates(cur.as_ref(), &s);
                    cur = Some(s);
                    dirty = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    return Err(io::Error::other("the reader thread stopped"));
                }
            }
        }
        if dirty {
            let mut lines = 0;
            term.draw(|f| match &cur {
                Some(s) => {
                    lines = draw(
                        f,
                        &View {
                            sample: s,
                            rates: &rates,
                            stall_after_s,
                            interval_s,
                            scroll,
                        },
                    )
                }
                None => f.render_widget(Line::raw("ncclbpf status --watch: reading…"), f.area()),
            })?;
            scroll = scroll.min(lines.saturating_sub(1));
            dirty = false;
        }
        if !event::poll(Duration::from_millis(50))? {
            continue;
        }
        match event::read()? {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Down | KeyCode::Char('j') => scroll = scroll.saturating_add(1),
                    KeyCode::Up | KeyCode::Char('k') => scroll = scroll.saturating_sub(1),
                    KeyCode::PageDown | KeyCode::Char(' ') => scroll = scroll.saturating_add(10),
                    KeyCode::PageUp => scroll = scroll.saturating_sub(10),
                    KeyCode::Home => scroll = 0,
                    _ => {}
                }
                dirty = true;
            }
            Event::Resize(..) => dirty = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::{S, conn, stopped, table};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use ratatui::buffer::Buffer;
    use shared_maps::ConnDirection;

    fn frame(s: &Sample, rates: &HashMap<Key, f64>, w: u16, h: u16) -> Buffer {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| {
            draw(
                f,
                &View {
                    sample: s,
                    rates,
                    stall_after_s: 10.0,
                    interval_s: 1.0,
                    scroll: 0,
                },
            );
        })
        .unwrap();
        t.backend().buffer().clone()
    }

    fn rows(b: &Buffer) -> Vec<String> {
        (0..b.area.height)
            .map(|y| {
                (0..b.area.width)
                    .map(|x| b[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    fn row_of(text: &[String], needle: &str) -> usize {
        text.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{}", text.join("\n")))
    }

    /// status's job: pid 10 receives on conn 1 (stuck 30 s) and conn 2 (moving), pid 11 sends
    /// on both; neither socket answers (the shared memory is read all the same).
    fn job(now: u64, moved: u64) -> Sample {
        let mut c2r = conn(2, ConnDirection::Recv, 1, now - S / 10, now - S / 5);
        c2r.bytes += moved;
        let mut c2s = conn(2, ConnDirection::Send, 1, now - S, now - S / 5);
        c2s.bytes += moved;
        let silent = || stopped().map_err(status::silent);
        Sample {
            procs: vec![
                Proc {
                    pid: 10,
                    answer: silent(),
                    table: table(
                        vec![conn(1, ConnDirection::Recv, 1, 70 * S, 60 * S), c2r],
                        now,
                    ),
                    metrics: None,
                },
                Proc {
                    pid: 11,
                    answer: silent(),
                    table: table(
                        vec![conn(1, ConnDirection::Send, 0, 50 * S, 60 * S), c2s],
                        now,
                    ),
                    metrics: None,
                },
            ],
            asking: HashSet::new(),
            ranks: HashMap::from([(10, 0), (11, 1)]),
            error: None,
        }
    }

    #[test]
    fn a_stalled_connection_is_highlighted_and_named() {
        let s = job(100 * S, 0);
        let b = frame(&s, &HashMap::new(), 180, 24);
        let text = rows(&b);
        let all = text.join("\n");
        assert!(
            text[0].contains("2 process(es), 4 connection(s), 1 stalled"),
            "{all}"
        );
        // The row of the stuck receive: its peer named with pid and rank, and red.
        let y = row_of(&text, "recv  127.0.0.1:40001 (pid 11 rank 1)");
        assert!(text[y].trim_end().ends_with("STALLED"), "{all}");
        let x = text[y].find("recv").unwrap() as u16;
        assert_eq!(b[(x, y as u16)].fg, Color::Red, "{all}");
        assert!(b[(x, y as u16)].modifier.contains(Modifier::BOLD));
        // The moving receive is neither.
        let y2 = row_of(&text, "recv  127.0.0.1:40002 (pid 11 rank 1)");
        assert!(!text[y2].contains("STALLED"), "{all}");
        let x2 = text[y2].find("recv").unwrap() as u16;
        assert_ne!(b[(x2, y2 as u16)].fg, Color::Red, "{all}");
        // The panel at the bottom names it as `ncclbpf status` does, with the ranks.
        let y3 = row_of(&text, "STALLED recv connection 0x0000000000000001");
        assert!(y3 > y2, "{all}");
        assert!(
            text[y3].contains(
                "pid 10 rank 0: STALLED recv connection 0x0000000000000001 from 127.0.0.1:40001 \
                 (pid 11, rank 1), comm 0x000000000000a9ee: 1 request(s) pending, no progress \
                 for 30.0 s"
            ),
            "{all}"
        );
        assert_eq!(all.matches("STALLED recv connection").count(), 1, "{all}");
        // Nothing stalls when nothing waits that long.
        let mut quiet = job(100 * S, 0);
        if let Ok(Some(t)) = &mut quiet.procs[0].table {
            t.conns[0].busy_since_ns = 95 * S;
        }
        let text = rows(&frame(&quiet, &HashMap::new(), 180, 24)).join("\n");
        assert!(
            !text.contains("STALLED") && text.contains("0 stalled"),
            "{text}"
        );
    }

    #[test]
    fn throughput_comes_from_two_samples() {
        let a = job(100 * S, 0);
        // Two seconds later conn 2 moved 4 MB both ways; conn 1 nothing.
        let mut b = job(102 * S, 4_000_000);
        assert!(rates(None, &a).is_empty(), "one sample has no rate");
        let r = rates(Some(&a), &b);
        assert_eq!(r.get(&(10, 2, "recv")), Some(&2_000_000.0));
        assert_eq!(r.get(&(11, 2, "send")), Some(&2_000_000.0));
        assert_eq!(r.get(&(10, 1, "recv")), Some(&0.0));
        let text = rows(&frame(&b, &r, 180, 24)).join("\n");
        assert_eq!(text.matches("2.0 MB/s").count(), 2, "{text}");
        assert_eq!(text.matches(" 0 B/s").count(), 2, "{text}");
        // No rate without a first sample, for a slot reused (bytes went down), or a table whose
        // clock did not move.
        let text = rows(&frame(&a, &HashMap::new(), 180, 24)).join("\n");
        assert!(!text.contains("B/s"), "{text}");
        if let Ok(Some(t)) = &mut b.procs[0].table {
            t.conns[0].bytes = 0;
        }
        let r = rates(Some(&a), &b);
        assert!(!r.contains_key(&(10, 1, "recv")));
        assert!(rates(Some(&a), &job(100 * S, 5)).is_empty());
        assert_eq!(rate_text(Some(999.0)), "999 B/s");
        assert_eq!(rate_text(Some(1500.0)), "1.5 kB/s");
        assert_eq!(rate_text(Some(12.5e9)), "12.50 GB/s");
    }

    #[test]
    fn a_process_that_does_not_answer_is_shown_as_such() {
        let mut s = job(100 * S, 0);
        s.procs.push(Proc {
            pid: 12,
            answer: Err(ClientError::Protocol("not answered yet".into())),
            table: Ok(None),
            metrics: Some("127.0.0.1:9464".into()),
        });
        s.asking.insert(12);
        s.procs.push(Proc {
            pid: 13,
            answer: Err(ClientError::NoProcess(13)),
            table: Err("no maps registered (process 13 is gone)".into()),
            metrics: None,
        });
        let b = frame(&s, &HashMap::new(), 180, 30);
        let text = rows(&b);
        let all = text.join("\n");
        let y = row_of(
            &text,
            "pid 10 rank 0: not answering: no answer within 3 s (the process is stopped",
        );
        assert_eq!(b[(0, y as u16)].fg, Color::Yellow, "{all}");
        // Its connections are shown all the same.
        assert!(
            text[y + 1].contains("DIR") && text[y + 2].contains("recv"),
            "{all}"
        );
        let y = row_of(&text, "pid 12: asking its control socket");
        assert!(
            text[y].contains("metrics http://127.0.0.1:9464/metrics"),
            "{all}"
        );
        assert!(
            text[y + 1].contains("connections: none registered"),
            "{all}"
        );
        let y = row_of(
            &text,
            "pid 13: unreadable: not answering (process 13 does not exist)",
        );
        assert_eq!(b[(0, y as u16)].fg, Color::Red, "{all}");
        assert!(
            text[y + 1].contains("connections: unreadable: no maps registered"),
            "{all}"
        );
        assert!(text[0].contains("3 not answering"), "{all}");
        // An answering process shows status's first line.
        s.procs[1].answer = Ok(Reply::ok(vec![ncclbpf_control::Item::Process {
            pid: 11,
            generation: 4,
            live_programs: 2,
        }]));
        let text = rows(&frame(&s, &HashMap::new(), 180, 30)).join("\n");
        assert!(
            text.contains("pid 11 rank 1: net generation 4, 2 program(s) alive"),
            "{text}"
        );
        assert!(text.contains(", 2 not answering"), "{text}");
        // No process at all: the reason.
        let none = Sample {
            error: Some("no process with a control socket or a connection table in /x".into()),
            ..Sample::default()
        };
        let text = rows(&frame(&none, &HashMap::new(), 100, 5)).join("\n");
        assert!(text.contains("no process with a control socket"), "{text}");
    }

    #[test]
    fn the_list_scrolls_and_fits_a_small_terminal() {
        let s = job(100 * S, 0);
        let mut t = Terminal::new(TestBackend::new(60, 8)).unwrap();
        let mut n = 0;
        for scroll in [0, 3] {
            t.draw(|f| {
                n = draw(
                    f,
                    &View {
                        sample: &s,
                        rates: &HashMap::new(),
                        stall_after_s: 10.0,
                        interval_s: 1.0,
                        scroll,
                    },
                )
            })
            .unwrap();
        }
        assert_eq!(n, 8, "2 x (header, column names, two rows)");
        let text = rows(t.backend().buffer());
        assert!(text[1].contains("pid 11"), "{}", text.join("\n"));
    }

    #[test]
    fn rank_comes_from_the_environment() {
        // This test process has no RANK of its own unless the runner set one.
        let me = std::process::id();
        let want = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
            .iter()
            .find_map(|k| std::env::var(k).ok()?.parse().ok());
        assert_eq!(rank_of(me), want);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .env("OMPI_COMM_WORLD_RANK", "3")
            .env_remove("RANK")
            .spawn()
            .unwrap();
        // Right after spawn, /proc may still show the environment from before exec.
        let t0 = Instant::now();
        let mut r = rank_of(child.id());
        while r.is_none() && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
            r = rank_of(child.id());
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(r, Some(3));
        assert_eq!(rank_of(u32::MAX), None);
    }
}
