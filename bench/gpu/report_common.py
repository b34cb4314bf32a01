"""What the GPU benchmark reports share (bench/gpu/*_report.py): the `KEY=value` lines the rank
programs print, and byte counts as people write them."""


def kv(line):
    """The KEY=value fields of a result line after its first word (RESULT, DECODE, JOB ...)."""
    return dict(t.split("=", 1) for t in line.split()[1:] if "=" in t)


def fmt_bytes(b):
    """8 B, 64 KiB, 4 MiB, 8 GiB: the largest unit that divides b."""
    for unit, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {s}"
    return f"{b} B"
