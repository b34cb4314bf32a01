#!/usr/bin/env python3
"""Render dashboards/ncclbpf.json's panels as a PNG from saved scrapes, without Grafana.

The scrapes (`ncclbpf exporter`'s /metrics, text format 0.0.4) are backfilled into a fresh
Prometheus TSDB (`promtool tsdb create-blocks-from openmetrics`), a private `prometheus` is
started on it (loopback, a free port, no scrape targets), every panel's queries are evaluated
with /api/v1/query_range over the scrapes' time span, and the panels are drawn in the
dashboard's grid layout with matplotlib. Prometheus is stopped and the temporary directory
removed at the end, also on error or Ctrl-C.

Input: a directory of NNNNN.prom scrapes, each with NNNNN.prom.time holding
"UNIX_START_SECONDS DURATION_SECONDS STATUS" (bench/gpu/metrics.sh's scrape function), or a
.tar.gz of such a directory (e.g. scrapes/ inside it). Scrapes whose STATUS is not 200 are
skipped (listed). Each sample gets its scrape's start time as its timestamp, as Prometheus
would give it.

Needs: `prometheus` and `promtool` (Debian: apt-get install prometheus; 2.42 tested) and
matplotlib (installed with pip if missing).

Example:
  python3 scripts/render-dashboard.py OUT/scrapes -o dashboard.png
  python3 scripts/render-dashboard.py results/scrapes.tar.gz -o d.png --var stall=2
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRAPE_RE = re.compile(r"^(\d+)\.prom$")
NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
NUM_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def log(msg):
    print(f"render-dashboard: {msg}", flush=True)


class Failure(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Input: scrapes


def find_scrape_dir(path, tmp):
    """The directory holding NNNNN.prom files: `path`, or one inside it, or inside a tarball."""
    if os.path.isfile(path):
        if not tarfile.is_tarfile(path):
            raise Failure(f"{path}: neither a directory nor a tar archive")
        dest = os.path.join(tmp, "input")
        os.makedirs(dest)
        with tarfile.open(path, "r:*") as tf:
            members = [
                m
                for m in tf.getmembers()
                if m.isfile() and re.match(r"^\d+\.prom(\.time)?$", os.path.basename(m.name))
            ]
            if not members:
                raise Failure(f"{path}: no NNNNN.prom files in the archive")
            try:
                tf.extractall(dest, members=members, filter="data")
            except TypeError:  # Python without extraction filters
                for m in members:
                    if m.name.startswith("/") or ".." in m.name.split("/"):
                        raise Failure(f"{path}: unsafe member {m.name!r}")
                tf.extractall(dest, members=members)
        path = dest
    if not os.path.isdir(path):
        raise Failure(f"{path}: no such directory or file")
    found = {}
    for d, _, files in os.walk(path):
        n = sum(1 for f in files if SCRAPE_RE.match(f))
        if n:
            found[d] = n
    if not found:
        raise Failure(f"{path}: no NNNNN.prom files")
    named = [d for d in found if os.path.basename(d) == "scrapes"]
    best = max(named or found, key=lambda d: found[d])
    if len(found) > 1:
        log(f"several directories with scrapes; using {os.path.relpath(best, path)} ({found[best]})")
    return best


def read_scrapes(d):
    """[(index, start, duration, path)] of the good scrapes in time order, and the bad ones."""
    good, bad = [], []
    for f in sorted(os.listdir(d)):
        m = SCRAPE_RE.match(f)
        if not m:
            continue
        p = os.path.join(d, f)
        try:
            with open(p + ".time") as fh:
                fields = fh.read().split()
            start, dur, status = float(fields[0]), float(fields[1]), fields[2]
        except (OSError, ValueError, IndexError) as e:
            bad.append((f, f"no usable {f}.time ({e})"))
            continue
        if status != "200":
            bad.append((f, f"status {status}"))
            continue
        good.append((int(m.group(1)), start, dur, p))
    good.sort(key=lambda s: s[1])
    return good, bad


def split_sample(line):
    """(name, '{labels}' or '', value text) of a text-format sample line, or None."""
    m = NAME_RE.match(line)
    if not m:
        return None
    name, i = m.group(0), m.end()
    labels = ""
    if i < len(line) and line[i] == "{":
        j, quoted = i + 1, False
        while j < len(line):
            c = line[j]
            if quoted:
                if c == "\\":
                    j += 1
                elif c == '"':
                    quoted = False
            elif c == '"':
                quoted = True
            elif c == "}":
                break
            j += 1
        else:
            return None
        labels, i = line[i : j + 1], j + 1
    rest = line[i:].split()
    if not rest or len(rest) > 2:  # value [timestamp]; the scrape's own time is used instead
        return None
    v = rest[0]
    if not NUM_RE.match(v):
        try:
            x = float(v)
        except ValueError:
            return None
        v = "NaN" if math.isnan(x) else ("+Inf" if x > 0 else "-Inf") if math.isinf(x) else repr(x)
    return name, labels, v


def to_openmetrics(scrapes, out):
    """Writes every good scrape's samples, timestamped, as OpenMetrics without metadata.

    `# TYPE`/`# HELP` are dropped: OpenMetrics wants a counter's family named without `_total`
    and histograms' metadata grouped, and the TSDB stores no types anyway."""
    samples, bad_lines, names = 0, 0, set()
    with open(out, "w") as o:
        for _, start, _, path in scrapes:
            ts = f"{start:.3f}"
            seen = set()
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    s = split_sample(line)
                    if s is None:
                        bad_lines += 1
                        continue
                    name, labels, v = s
                    if (name, labels) in seen:
                        bad_lines += 1
                        continue
                    seen.add((name, labels))
                    names.add(name)
                    o.write(f"{name}{labels} {v} {ts}\n")
                    samples += 1
        o.write("# EOF\n")
    return samples, bad_lines, names


# ---------------------------------------------------------------------------------------------
# Prometheus


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=30):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Prometheus:
    def __init__(self, binary, db, tmp, lookback):
        self.binary, self.db, self.tmp, self.lookback = binary, db, tmp, lookback
        self.proc, self.base, self.logf = None, None, None

    def start(self):
        cfg = os.path.join(self.tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global: {}\nscrape_configs: []\n")
        for _ in range(3):
            port = free_port()
            self.base = f"http://127.0.0.1:{port}"
            logpath = os.path.join(self.tmp, "prometheus.log")
            self.logf = open(logpath, "w")
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={cfg}",
                    f"--storage.tsdb.path={self.db}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=100y",
                    f"--query.lookback-delta={ms(self.lookback)}",
                    "--log.level=warn",
                ],
                stdout=self.logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            deadline = time.time() + 60
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    code, _ = http_get(self.base + "/-/ready", timeout=2)
                    if code == 200:
                        return port
                except OSError:
                    pass
                time.sleep(0.2)
            self.stop()
            with open(logpath) as f:
                text = f.read()
            if "address already in use" not in text:
                raise Failure(f"prometheus did not become ready:\n{text[-3000:]}")
        raise Failure("prometheus could not get a port")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.logf:
            self.logf.close()
            self.logf = None

    def query(self, path, **params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params)
        code, body = http_get(url)
        try:
            j = json.loads(body)
        except ValueError:
            raise Failure(f"HTTP {code}: {body[:200]!r}")
        if j.get("status") != "success":
            raise Failure(f"{j.get('errorType', code)}: {j.get('error', body[:200])}")
        return j["data"]


# ---------------------------------------------------------------------------------------------
# Dashboard variables and queries


def ms(seconds):
    return f"{max(1, int(round(seconds * 1000)))}ms"


def variables(dash, overrides):
    """{name: value} from the dashboard's templating defaults, then --var overrides."""
    out = {}
    for v in dash.get("templating", {}).get("list", []):
        name, kind = v.get("name"), v.get("type")
        if not name or kind == "datasource":
            continue
        cur = (v.get("current") or {}).get("value")
        opts = [o.get("value") for o in v.get("options") or [] if o.get("value") != "$__all"]
        if kind == "custom" and not opts:
            opts = [x.strip() for x in str(v.get("query", "")).split(",") if x.strip()]
        if cur in (None, "", []):
            cur = opts[0] if opts else ""
        vals = cur if isinstance(cur, list) else [cur]
        if "$__all" in vals:
            val = v.get("allValue") or ("(" + "|".join(map(re.escape, opts)) + ")" if opts else ".*")
            shown = "All"
        elif len(vals) > 1:
            val = "(" + "|".join(re.escape(str(x)) for x in vals) + ")"
            shown = ",".join(map(str, vals))
        else:
            val = shown = str(vals[0])
        out[name] = (val, shown)
    for o in overrides:
        k, _, val = o.partition("=")
        out[k] = (val, val)
    return out


def substitute(text, vals):
    def rep(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return vals[name][0] if name in vals else m.group(0)

    return re.sub(r"\$\{(\w+)(?::[\w]+)?\}|\[\[(\w+)\]\]|\$(\w+)", rep, text)


def legend(fmt, metric, expr):
    if fmt and fmt != "__auto":
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)
    name = metric.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest else (name or expr)


# ---------------------------------------------------------------------------------------------
# Units (Grafana's names, the simple ones)


def _scaled(x, base, units, digits=3):
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {units[0]}".rstrip()
    i = 0
    a = abs(x)
    while a >= base and i < len(units) - 1:
        a /= base
        i += 1
    return f"{math.copysign(a, x):.{digits}g} {units[i]}".rstrip()


def _small_seconds(x):
    a = abs(x)
    if a == 0 or not math.isfinite(x):
        return f"{x:g} s"
    for lim, div, u in ((1e-6, 1e-9, "ns"), (1e-3, 1e-6, "µs"), (1, 1e-3, "ms"), (60, 1, "s")):
        if a < lim:
            return f"{x / div:.3g} {u}"
    if a < 3600:
        return f"{x / 60:.3g} min"
    return f"{x / 3600:.3g} h"


SHORT = ["", "K", "Mil", "Bil", "Tri"]


def fmt_value(x, unit):
    if x is None:
        return "–"
    if unit in ("Bps", "decbytes", "bytes", "binBps"):
        iec = unit in ("bytes", "binBps")
        u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] if iec else ["B", "kB", "MB", "GB", "TB", "PB"]
        s = _scaled(x, 1024 if iec else 1000, u)
        return s + ("/s" if unit.endswith("ps") else "")
    if unit == "s":
        return _small_seconds(x)
    if unit == "ms":
        return _small_seconds(x / 1000)
    if unit in ("ops", "reqps", "rps", "wps"):
        return _scaled(x, 1000, SHORT) + " " + {"ops": "ops/s", "reqps": "req/s"}.get(unit, unit)
    if unit == "percent":
        return f"{x:.3g}%"
    if unit == "percentunit":
        return f"{x * 100:.3g}%"
    s = _scaled(x, 1000, SHORT)
    if unit and unit not in ("short", "none"):
        s += " " + unit
    return s


# ---------------------------------------------------------------------------------------------
# Drawing

PALETTE = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A6",
           "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C",
           "#6D1F62", "#584477"]
NAMED = {"green": "#56A64B", "red": "#E02F44", "yellow": "#F2CC0C", "orange": "#FF780A",
         "blue": "#3274D9", "purple": "#A352CC", "dark-red": "#AD0317", "dark-green": "#19730E"}
BG, PANEL, BORDER, TEXT, MUTED = "#f4f5f5", "#ffffff", "#d8d9da", "#24292e", "#6e7077"


def threshold_color(panel, v):
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps") or []
    color = "green"
    for s in steps:
        if s.get("value") is None or (v is not None and v >= s["value"]):
            color = s.get("color", color)
    return NAMED.get(color, color)


class Renderer:
    def __init__(self, plt, width, row_px, header_px):
        self.plt = plt
        self.W = width
        self.col = width / 24
        self.row = row_px
        self.header = header_px

    def layout(self, panels):
        bottom = max((p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels), default=1)
        self.H = self.header + bottom * self.row + 8
        self.fig = self.plt.figure(figsize=(self.W / 100, self.H / 100), dpi=100, facecolor=BG)

    def rect(self, x_px, top_px, w_px, h_px):
        """Figure coordinates of a box given in pixels from the top left."""
        return [x_px / self.W, 1 - (top_px + h_px) / self.H, w_px / self.W, h_px / self.H]

    def box(self, g, gap=4):
        x, top = g["x"] * self.col + gap, self.header + g["y"] * self.row + gap
        return x, top, g["w"] * self.col - 2 * gap, g["h"] * self.row - 2 * gap

    def header_text(self, title, sub):
        f = self.fig
        f.text(8 / self.W, 1 - 10 / self.H, title, va="top", ha="left", fontsize=15,
               weight="bold", color=TEXT)
        f.text(8 / self.W, 1 - 34 / self.H, sub, va="top", ha="left", fontsize=9, color=MUTED)

    def frame(self, g, face=PANEL, title=None, title_color=TEXT):
        x, top, w, h = self.box(g)
        ax = self.fig.add_axes(self.rect(x, top, w, h))
        ax.set_xlim(0, w)
        ax.set_ylim(h, 0)  # pixel coordinates from the top left
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_facecolor(face)
        for s in ax.spines.values():
            s.set_color(BORDER)
        if title:
            fit = max(8, int((w - 16) / 7.6))  # characters of 9.5 pt bold that fit
            if len(title) > fit:  # a narrow panel: two lines, then cut
                lines = textwrap.wrap(title, fit)
                title = "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")
            ax.text(8, 6, title, va="top", ha="left", fontsize=9.5, weight="bold",
                    color=title_color, clip_on=True, linespacing=1.3)
        return ax, x, top, w, h

    def row_panel(self, p, title):
        g = p["gridPos"]
        x, top, w, h = self.box(g, gap=2)
        ax = self.fig.add_axes(self.rect(x, top, w, h))
        ax.axis("off")
        ax.text(0.0, 0.5, title, va="center", ha="left", fontsize=12, weight="bold",
                color=TEXT, transform=ax.transAxes)
        ax.axhline(0.02, color=BORDER, lw=1)

    def message(self, ax, w, h, text, color=MUTED, size=11):
        ax.text(w / 2, h / 2, text, ha="center", va="center", fontsize=size, color=color, wrap=True)

    def timeseries(self, p, title, series, unit, t_end, errors):
        """series: [(label, [t], [v])] with t in seconds since the first scrape."""
        fr, x, top, w, h = self.frame(p["gridPos"], title=title)
        lg = (p.get("options") or {}).get("legend") or {}
        calcs = [c for c in lg.get("calcs") or [] if c in ("lastNotNull", "last", "max", "min", "mean")]
        right = lg.get("placement", "bottom") == "right"
        lh = 13  # px per legend line
        if not series:
            self.message(fr, w, h, "\n".join(["No data"] + errors), MUTED if not errors else "#C4162A", 10)
            return
        # Legend geometry.
        def calc_value(vs, calc):
            good = [v for v in vs if v == v]
            if not good:
                return None
            return {"max": max(good), "min": min(good), "mean": sum(good) / len(good)}.get(
                calc, good[-1])

        # px per calc column: the longest formatted value, 5.2 px per character of 7 pt
        cw = max([44] + [8 + 5.2 * len(fmt_value(calc_value(vs, c), unit))
                         for _, _, vs in series for c in calcs]) if calcs else 0
        if right:
            leg_w = min(int(w * 0.42), 14 + 6 * max(len(s[0]) for s in series) + cw * len(calcs))
            leg_w = max(leg_w, min(int(w * 0.42), 120 + cw * len(calcs)))
            rows_fit = int((h - 40) / lh) - 1
            plot = (x + 62, top + 26, w - leg_w - 62 - 10, h - 26 - 24)
        else:
            rows_fit = max(1, min(len(series), int(h * 0.35 / lh)))
            leg_w = w - 16
            plot = (x + 62, top + 26, w - 62 - 12, h - 26 - 24 - (rows_fit + 1) * lh)
        ax = self.fig.add_axes(self.rect(*plot))
        ax.set_facecolor(PANEL)
        for s in ax.spines.values():
            s.set_visible(False)
        ax.grid(True, color="#e9e9ea", lw=0.8)
        ax.tick_params(labelsize=7.5, colors=MUTED, length=0)
        ax.set_xlim(-0.005 * t_end, max(t_end * 1.005, 1e-3))
        fmt = self.plt.FuncFormatter
        ax.yaxis.set_major_formatter(fmt(lambda v, _: fmt_value(v, unit)))
        ax.xaxis.set_major_formatter(fmt(lambda v, _: f"{v:g}s"))
        lines = []
        for i, (lab, ts, vs) in enumerate(series):
            c = PALETTE[i % len(PALETTE)]
            ax.plot(ts, vs, color=c, lw=1.3)
            if sum(1 for v in vs if v == v) == 1:  # a lone point: visible as a dot
                ax.plot(ts, vs, "o", color=c, ms=3)
            lines.append((c, lab, vs))
        lo, hi = ax.get_ylim()
        finite = [v for _, _, vs in lines for v in vs if v == v and math.isfinite(v)]
        top = max([hi] + [1.06 * v for v in finite if v > 0])
        if lo >= 0 or min(finite, default=0) >= 0:
            ax.set_ylim(0, top if top > 0 else 1)
        # Legend: a table, as Grafana's "table" mode.
        lx, ly = (w - leg_w - 4, 28) if right else (8, h - (rows_fit + 1) * lh - 4)
        name_w = leg_w - 18 - cw * len(calcs)
        maxch = max(6, int(name_w / 5.3))
        heads = {"lastNotNull": "Last *", "last": "Last", "max": "Max", "min": "Min", "mean": "Mean"}
        for j, c in enumerate(calcs):
            fr.text(lx + leg_w - cw * (len(calcs) - j - 1) - 4, ly, heads[c], ha="right",
                    va="top", fontsize=7, color=MUTED, weight="bold")
        show = lines if len(lines) <= rows_fit else lines[: rows_fit - 1]
        for k, (c, lab, vs) in enumerate(show):
            yy = ly + (k + 1) * lh
            fr.plot([lx, lx + 12], [yy + 5, yy + 5], color=c, lw=2.5)
            if len(lab) > maxch:
                lab = lab[: maxch - 1] + "…"
            fr.text(lx + 16, yy, lab, ha="left", va="top", fontsize=7, color=TEXT)
            for j, calc in enumerate(calcs):
                val = calc_value(vs, calc)
                fr.text(lx + leg_w - cw * (len(calcs) - j - 1) - 4, yy, fmt_value(val, unit),
                        ha="right", va="top", fontsize=7, color=TEXT)
        if len(show) < len(lines):
            fr.text(lx + 16, ly + (len(show) + 1) * lh, f"… {len(lines) - len(show)} more series",
                    ha="left", va="top", fontsize=7, color=MUTED)
        if errors:
            fr.text(w - 8, 6, "; ".join(errors)[:120], ha="right", va="top", fontsize=7,
                    color="#C4162A")

    def stat(self, p, title, results, unit, errors):
        """results: [(label, last, max, t_of_max)]."""
        vals = [r for r in results if r[1] is not None]
        face = threshold_color(p, vals[0][1]) if vals and len(vals) == 1 else PANEL
        bg = (p.get("options") or {}).get("colorMode") == "background" and len(vals) == 1
        fr, x, top, w, h = self.frame(p["gridPos"], face=face if bg else PANEL, title=title,
                                      title_color="white" if bg else TEXT)
        if not vals:
            self.message(fr, w, h, "\n".join(["No data"] + errors), MUTED if not errors else "#C4162A")
            return
        n = len(vals)
        for i, (lab, last, mx, tmx) in enumerate(vals):
            cx = w * (i + 0.5) / n
            col = "white" if bg else threshold_color(p, last)
            fr.text(cx, h * 0.5, fmt_value(last, unit), ha="center", va="center",
                    fontsize=min(40, 200 / max(1, n * len(fmt_value(last, unit)) ** 0.5)),
                    weight="bold", color=col)
            sub = f"{lab} (last value)" if lab else "last value"
            if mx is not None and mx != last:
                sub += f"\nmax {fmt_value(mx, unit)} at {tmx:.0f} s"
            fr.text(cx, h * 0.5 + 34, sub, ha="center", va="top", fontsize=8,
                    color="white" if bg else MUTED)

    def table(self, p, title, columns, rows, note, errors):
        fr, x, top, w, h = self.frame(p["gridPos"], title=title)
        fr.text(w - 8, 7, note, ha="right", va="top", fontsize=7, color=MUTED)
        if not rows:
            self.message(fr, w, h, "\n".join(["No data"] + errors), MUTED if not errors else "#C4162A")
            return
        lh = 15
        fit = int((h - 34) / lh) - 1
        shown = rows if len(rows) <= fit else rows[: fit - 1]
        widths = [max(len(c), *(len(str(r[i])) for r in shown)) + 2 for i, c in enumerate(columns)]
        scale = (w - 16) / max(1, sum(widths))
        xs, acc = [], 8
        for cw in widths:
            xs.append(acc)
            acc += cw * scale
        fs = min(8, 9 * scale / 6.2)
        y0 = 28
        for i, c in enumerate(columns):
            fr.text(xs[i], y0, c, ha="left", va="top", fontsize=fs, weight="bold", color=MUTED)
        fr.plot([6, w - 6], [y0 + lh - 2, y0 + lh - 2], color=BORDER, lw=0.8)
        for k, r in enumerate(shown):
            for i, v in enumerate(r):
                fr.text(xs[i], y0 + (k + 1) * lh, str(v), ha="left", va="top", fontsize=fs,
                        color=TEXT)
        if len(shown) < len(rows):
            fr.text(8, y0 + (len(shown) + 1) * lh, f"… {len(rows) - len(shown)} more rows",
                    ha="left", va="top", fontsize=fs, color=MUTED)


# ---------------------------------------------------------------------------------------------


def load_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log(f"matplotlib is not installed: installing it ({sys.executable} -m pip install matplotlib)")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"]
        if subprocess.run(cmd).returncode != 0:
            log("pip install failed; trying pip install --user")
            if subprocess.run(cmd + ["--user"]).returncode != 0:
                raise Failure("could not install matplotlib (pip install matplotlib)")
        import importlib
        import site

        importlib.invalidate_caches()
        if site.ENABLE_USER_SITE and site.getusersitepackages() not in sys.path:
            sys.path.append(site.getusersitepackages())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plt.FuncFormatter = FuncFormatter
    return plt


def flat_panels(dash):
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        if p.get("type") == "row":
            out.extend(p.get("panels") or [])  # a collapsed row's panels: drawn anyway
    return [p for p in out if "gridPos" in p]


def main():
    ap = argparse.ArgumentParser(
        prog="render-dashboard.py",
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:3]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Needs prometheus and promtool (Debian package prometheus, 2.42 tested) and "
        "matplotlib (pip-installed if missing). Example: python3 scripts/render-dashboard.py "
        "/tmp/ncclbpf-metrics/scrapes -o dashboard.png",
    )
    ap.add_argument("input", help="directory of NNNNN.prom (+ .prom.time) scrapes, or a .tar.gz of one")
    ap.add_argument("-o", "--output", default="dashboard.png", help="PNG to write (dashboard.png)")
    ap.add_argument("--dashboard", default=os.path.join(ROOT, "dashboards", "ncclbpf.json"),
                    help="Grafana dashboard JSON (dashboards/ncclbpf.json)")
    ap.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                    help="set a dashboard variable (default: its default; host=All is .*), e.g. stall=2")
    ap.add_argument("--step", type=float, help="query step in seconds (span/200, at least 1)")
    ap.add_argument("--rate-interval", type=float, metavar="S",
                    help="$__rate_interval in seconds (max(step + scrape interval, 4 x scrape interval))")
    ap.add_argument("--lookback", type=float, metavar="S",
                    help="Prometheus --query.lookback-delta (3 x scrape interval: backfilled data "
                    "has no staleness markers, so a series that ended would otherwise linger 5 min)")
    ap.add_argument("--width", type=int, default=1800, help="image width in pixels (1800)")
    ap.add_argument("--row-height", type=int, default=40, help="pixels per grid row (40)")
    ap.add_argument("--prometheus", default="prometheus", help="prometheus binary")
    ap.add_argument("--promtool", default="promtool", help="promtool binary")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (printed)")
    a = ap.parse_args()

    for b in (a.prometheus, a.promtool):
        if not shutil.which(b):
            raise Failure(f"{b} not found (apt-get install prometheus)")
    with open(a.dashboard) as f:
        dash = json.load(f)
    plt = load_matplotlib()

    tmp = tempfile.mkdtemp(prefix="render-dashboard-")
    prom = None

    def on_signal(sig, _):
        log(f"stopped by signal {sig}: stopping prometheus, removing {tmp}")
        raise SystemExit(128 + sig)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        d = find_scrape_dir(a.input, tmp)
        scrapes, bad = read_scrapes(d)
        if not scrapes:
            raise Failure(f"{d}: no scrape with status 200 ({len(bad)} without)")
        starts = [s[1] for s in scrapes]
        t0, t1 = starts[0], starts[-1]
        span = t1 - t0
        gaps = [b - a_ for a_, b in zip(starts, starts[1:])]
        interval = statistics.median(gaps) if gaps else 1.0
        log(f"{len(scrapes)} scrapes in {a.input} ({d}), {span:.1f} s from "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))} UTC, every {interval:.2f} s "
            f"(median; {min(gaps, default=0):.2f}-{max(gaps, default=0):.2f} s)")
        for f, why in bad:
            log(f"skipped {f}: {why}")

        om = os.path.join(tmp, "scrapes.om")
        n, bad_lines, names = to_openmetrics(scrapes, om)
        log(f"{n} samples of {len(names)} metric names -> OpenMetrics"
            + (f" ({bad_lines} lines not understood, left out)" if bad_lines else ""))
        db = os.path.join(tmp, "tsdb")
        os.makedirs(db)
        r = subprocess.run([a.promtool, "tsdb", "create-blocks-from", "openmetrics", om, db],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise Failure(f"promtool tsdb create-blocks-from openmetrics failed:\n{r.stdout}{r.stderr}")
        blocks = [b for b in os.listdir(db) if os.path.isdir(os.path.join(db, b))]
        log(f"promtool tsdb create-blocks-from openmetrics: {len(blocks)} block(s)")

        step = a.step or max(1.0, span / 200)
        rate_iv = a.rate_interval or max(step + interval, 4 * interval)
        lookback = a.lookback or 3 * interval + 0.001
        prom = Prometheus(a.prometheus, db, tmp, lookback)
        port = prom.start()
        log(f"prometheus ready on 127.0.0.1:{port} (lookback {ms(lookback)})")

        vals = variables(dash, a.var)
        vals.update({
            "__rate_interval": (ms(rate_iv), ms(rate_iv)),
            "__interval": (ms(step), ms(step)),
            "__interval_ms": (str(int(step * 1000)), ""),
            "__range": (ms(span + step), ""),
            "__range_s": (str(int(span + step)), ""),
            "__range_ms": (str(int((span + step) * 1000)), ""),
        })
        shown_vars = ", ".join(f"{k}={v[1]}" for k, v in vals.items() if not k.startswith("__"))
        log(f"step {step:g} s, $__rate_interval {ms(rate_iv)}, {shown_vars}")

        rd = Renderer(plt, a.width, a.row_height, 56)
        panels = flat_panels(dash)
        rd.layout(panels)
        rd.header_text(
            dash.get("title", "dashboard"),
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))} UTC + {span:.1f} s "
            f"(x axis: seconds since the first scrape) · {len(scrapes)} scrapes every "
            f"{interval:.2f} s · step {step:g} s · $__rate_interval {ms(rate_iv)} · {shown_vars} · "
            f"rendered by scripts/render-dashboard.py from {os.path.basename(os.path.normpath(a.input))}",
        )
        empty, failed = [], []
        for p in panels:
            kind = p.get("type")
            title = substitute(p.get("title", ""), vals)
            if kind == "row":
                rd.row_panel(p, title)
                log(f"row {title!r}")
                continue
            unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
            series, errors, report = [], [], []
            for t in p.get("targets", []):
                if t.get("hide") or not t.get("expr"):
                    continue
                expr = substitute(t["expr"], vals)
                ref = t.get("refId", "?")
                try:
                    data = prom.query("query_range", query=expr, start=f"{t0:.3f}",
                                      end=f"{t1:.3f}", step=f"{step:g}")
                except (Failure, OSError) as e:
                    errors.append(f"{ref}: query failed: {e}")
                    failed.append(f"{title} {ref}: {expr}: {e}")
                    report.append(f"{ref} failed ({e})")
                    continue
                res = data.get("result", [])
                report.append(f"{ref} {len(res)} series")
                for s in res:
                    pts = [(float(ts) - t0, float(v)) for ts, v in s["values"]]
                    ts_, vs_ = [], []
                    for k, (tt, vv) in enumerate(pts):
                        if k and tt - pts[k - 1][0] > 1.5 * step:  # a gap: break the line
                            ts_.append(tt - step)
                            vs_.append(float("nan"))
                        ts_.append(tt)
                        vs_.append(vv)
                    series.append((legend(t.get("legendFormat", ""), s["metric"], expr),
                                   s["metric"], ts_, vs_, t))
            if not series:
                empty.append(title)
            log(f"{kind} {title!r}: " + (", ".join(report) or "no queries")
                + ("" if series else " -> no data"))
            if kind in ("stat", "gauge", "bargauge"):
                res = []
                for lab, _, ts, vs, t in series:
                    good = [(tt, v) for tt, v in zip(ts, vs) if v == v]
                    if good:
                        tm, vm = max(good, key=lambda q: q[1])
                        res.append((lab, good[-1][1], vm, tm))
                rd.stat(p, title, res, unit, errors)
            elif kind == "table":
                cols, rows = table_rows(p, series, unit)
                rd.table(p, title, cols, rows,
                         "every series that matched during the span (Grafana: at its end time)",
                         errors)
            else:
                if kind not in ("timeseries", "graph"):
                    log(f"  panel type {kind!r} drawn as a time series")
                rd.timeseries(p, title, [(s[0], s[2], s[3]) for s in series], unit,
                              t1 - t0, errors)
        out = os.path.abspath(a.output)
        rd.fig.savefig(out, dpi=100, facecolor=BG)
        log(f"wrote {a.output} ({a.width}x{int(rd.H)} px, {len(panels)} panels)")
        if empty:
            log("panels without data: " + "; ".join(empty))
        for f in failed:
            log(f"query failed: {f}")
        return 0
    finally:
        if prom:
            prom.stop()
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def table_rows(p, series, unit):
    """Columns and rows: one row per series, its labels (organize's excludes applied), the
    largest value (renamed as organize says), and when it matched (s since the first scrape)."""
    excl, rename = set(), {}
    for tr in p.get("transformations") or []:
        if tr.get("id") == "organize":
            o = tr.get("options") or {}
            excl = {k for k, v in (o.get("excludeByName") or {}).items() if v}
            rename = o.get("renameByName") or {}
    keys = []
    for _, m, *_ in series:
        for k in m:
            if k not in excl and k not in keys:
                keys.append(k)
    vname = rename.get("Value", "Value")
    cols = keys + [f"{vname} max", "matched (s)"]
    rows = []
    for _, m, ts, vs, _ in series:
        good = [(tt, v) for tt, v in zip(ts, vs) if v == v]
        if not good:
            continue
        mx = max(v for _, v in good)
        rows.append((mx, [m.get(k, "") for k in keys]
                     + [fmt_value(mx, unit), f"{good[0][0]:.0f}-{good[-1][0]:.0f}"]))
    rows = [r for _, r in sorted(rows, key=lambda q: -q[0])]
    return cols, rows


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as e:
        log(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
