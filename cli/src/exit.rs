//! How a command ends, and the exit status that says so.
//!
//! * 0: success (every program accepted, the policy loaded, the maps were read);
//! * 1: the thing checked is bad: a program was rejected by the verifier, the file is not a
//!   valid policy object, a tuner policy failed to load;
//! * 2: usage or I/O error: bad arguments, a file or process that cannot be read, no such
//!   program or map, output that cannot be written.

use std::process::ExitCode;

/// What a command found, when it got as far as printing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Exit 0.
    Good,
    /// Exit 1: the output says what is wrong (e.g. a program rejected by the verifier).
    Bad,
}

/// Why a command stopped; the message goes to standard error.
#[derive(Debug)]
pub enum Failure {
    /// Exit 1: the object or policy itself is bad.
    Bad(String),
    /// Exit 2: the command could not do its work (arguments, files, processes, output).
    Usage(String),
}

pub type Outcome = Result<Verdict, Failure>;

impl Failure {
    pub fn code(&self) -> ExitCode {
        match self {
            Failure::Bad(_) => ExitCode::from(1),
            Failure::Usage(_) => ExitCode::from(2),
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Failure::Bad(m) | Failure::Usage(m) => m,
        }
    }
}

impl Verdict {
    pub fn code(self) -> ExitCode {
        match self {
            Verdict::Good => ExitCode::SUCCESS,
            Verdict::Bad => ExitCode::from(1),
        }
    }
}
