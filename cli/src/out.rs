//! Standard output, locked and buffered, tolerating a reader that went away.

use crate::exit::Failure;
use std::fmt;
use std::io::{self, BufWriter, StdoutLock, Write};

/// Standard output, locked and buffered. A reader that goes away (`ncclbpf inspect x.o | head`)
/// is not an error: the rest of the output is dropped and the command finishes with its usual
/// exit status. Other write errors are reported (exit status 2).
pub struct Out {
    w: BufWriter<StdoutLock<'static>>,
    closed: bool,
}

impl Out {
    pub fn new() -> Out {
        Out {
            w: BufWriter::new(io::stdout().lock()),
            closed: false,
        }
    }

    fn settle(&mut self, r: io::Result<()>) -> Result<(), Failure> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(Failure::Usage(format!("writing to standard output: {e}"))),
        }
    }

    /// One line (the newline is added).
    pub fn line(&mut self, args: fmt::Arguments) -> Result<(), Failure> {
        if self.closed {
            return Ok(());
        }
        let r = self
            .w
            .write_fmt(args)
            .and_then(|()| self.w.write_all(b"\n"));
        self.settle(r)
    }

    /// One JSON document, pretty-printed, on its own lines.
    pub fn json(&mut self, v: &serde_json::Value) -> Result<(), Failure> {
        let text = serde_json::to_string_pretty(v)
            .map_err(|e| Failure::Usage(format!("formatting JSON: {e}")))?;
        self.line(format_args!("{text}"))
    }

    pub fn finish(&mut self) -> Result<(), Failure> {
        if self.closed {
            return Ok(());
        }
        let r = self.w.flush();
        self.settle(r)
    }
}

/// `println!` through an [`Out`], returning its error from the enclosing function.
macro_rules! outln {
    ($o:expr) => { $o.line(format_args!(""))? };
    ($o:expr, $($t:tt)*) => { $o.line(format_args!($($t)*))? };
}
pub(crate) use outln;
