//! Each limit of the verifier's budget (crate::budget) ends exploration with a rejection that
//! names it, with its figures (`too_complex`, or `unbounded_loop` when the path was in a
//! loop); what a verification held and did is reported.
// A rejection carries its diagnosis; the tests look at it whole.
#![allow(clippy::result_large_err)]

mod explode;

use explode::Shape;
use policy_verifier::platform::hook;
use policy_verifier::{Exceeded, Limits, Reject, Stats, VerifyError, verify_insns};
use std::time::Duration;

fn run(shape: &str, limits: Limits) -> Result<Stats, VerifyError> {
    let shape = Shape::parse(shape).expect("a valid shape");
    verify_insns(&shape.program(), hook(shape.hook).unwrap(), &[], limits)
}

/// Eight frames of full stacks, a loop whose every iteration stores new states.
const HEAVY: &str = "hook=net/isend,depth=8,slots=63,iters=100,items=200,mix=1.0.1.1,outer=0";

fn exceeded(r: Result<Stats, VerifyError>) -> (Exceeded, String) {
    let e = r.expect_err("rejected");
    match e.reject {
        // Outside loops the program is too complex; on a path through a loop, that loop is
        // not provably bounded within the budget.
        Reject::TooComplex { exceeded, .. }
        | Reject::UnboundedLoop {
            exceeded: Some(exceeded),
            ..
        } => (exceeded, e.to_string()),
        ref other => panic!("not a budget: {other:?}\n{e}"),
    }
}

#[test]
fn each_limit_is_named_in_the_rejection() {
    let d = Limits::default();
    let (x, msg) = exceeded(run(
        HEAVY,
        Limits {
            max_states: 500,
            ..d
        },
    ));
    assert_eq!(
        x,
        Exceeded::States {
            held: 501,
            limit: 500
        }
    );
    assert!(
        msg.contains("501 verifier states held at once (limit 500)"),
        "{msg}"
    );
    assert!(msg.contains("limit 'states'"), "{msg}");

    let (x, msg) = exceeded(run(
        HEAVY,
        Limits {
            max_state_bytes: 1 << 20,
            ..d
        },
    ));
    assert!(
        matches!(x, Exceeded::Memory { bytes, limit: 1_048_576 } if bytes > 1 << 20),
        "{x:?}"
    );
    assert!(
        msg.contains("limit 'memory'") && msg.contains("(limit 1.0 MiB)"),
        "{msg}"
    );

    let (x, msg) = exceeded(run(
        HEAVY,
        Limits {
            max_work: 1_000_000,
            ..d
        },
    ));
    assert_eq!(x, Exceeded::Work { limit: 1_000_000 });
    assert!(msg.contains("limit 'work'"), "{msg}");

    let (x, msg) = exceeded(run(
        HEAVY,
        Limits {
            max_time: Duration::ZERO,
            ..d
        },
    ));
    assert!(matches!(x, Exceeded::Time { limit_ms: 0, .. }), "{x:?}");
    assert!(msg.contains("limit 'time'"), "{msg}");

    // Paths that double at every diamond, outside any loop: the processed instructions.
    let (x, msg) = exceeded(run(
        "hook=net/isend,depth=1,slots=0,iters=0,items=300,mix=0.1.0.0",
        Limits {
            max_processed: 5_000,
            ..d
        },
    ));
    assert_eq!(x, Exceeded::Processed { limit: 5_000 });
    assert!(msg.contains("limit 'processed'"), "{msg}");
}

/// The states an accepted program held, their bytes and its work are reported, and they are
/// what the limits compare: the same program is refused one byte, one state or one unit
/// below its figures, and accepted at them.
#[test]
fn the_figures_reported_are_those_the_limits_compare() {
    let shape = "hook=tuner,depth=4,slots=20,iters=40,items=20,mix=1.1.1.1,outer=1";
    let d = Limits::default();
    let s = run(shape, d).expect("accepted");
    assert!(s.peak_states > 100 && s.peak_bytes > 100_000 && s.work > s.processed as u64);
    let at = Limits {
        max_states: s.peak_states,
        max_state_bytes: s.peak_bytes,
        max_work: s.work,
        ..d
    };
    assert_eq!(run(shape, at).expect("accepted at its figures"), s);
    for (what, below) in [
        (
            "states",
            Limits {
                max_states: s.peak_states - 1,
                ..at
            },
        ),
        (
            "memory",
            Limits {
                max_state_bytes: s.peak_bytes - 1,
                ..at
            },
        ),
        (
            "work",
            Limits {
                max_work: s.work - 1,
                ..at
            },
        ),
    ] {
        let e = run(shape, below).expect_err(what);
        assert_eq!(e.reject.limit(), Some(what), "{e}");
    }
}

/// A stored state shares the frames and stack pieces the path did not change since: eight
/// frames of full stacks cost a stored state far less than their size.
#[test]
fn stored_states_share_what_did_not_change() {
    let s = run(
        "hook=net/isend,depth=8,slots=63,iters=64,items=100,mix=1.0.0.0,outer=0",
        Limits::default(),
    )
    .expect("accepted");
    // One frame with its 64 slots takes over 12 KiB; a state of eight, over 96 KiB.
    let per_state = s.peak_bytes / s.peak_states;
    assert!(s.peak_states > 5_000, "{s:?}");
    assert!(per_state < 3_000, "{per_state} bytes per state held: {s:?}");
}
