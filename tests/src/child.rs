//! Running one test of the current test binary in a child process with its own environment:
//! the plugin reads its settings once per process, so a case that needs other settings runs
//! alone in a child.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set in a child to the name of the test it runs.
pub const CHILD_VAR: &str = "NCCLBPF_TEST_CHILD";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-child-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// In the parent: runs test `name` of this binary in a child with `env` added and `cleared`
/// removed, fails with its output if it fails or hangs (60 s), and returns its output.
/// In the child: runs `body`, and returns `None`.
pub fn in_child(
    name: &str,
    env: &[(&str, &OsStr)],
    cleared: &[&str],
    body: fn(),
) -> Option<String> {
    if std::env::var(CHILD_VAR).as_deref() == Ok(name) {
        body();
        return None;
    }
    let dir = scratch(name);
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // `--include-ignored`: an ignored test run by hand (`-- --ignored`) runs in its child too.
    cmd.args([
        name,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_VAR, name)
    .env("NCCLBPF_PLUGIN", crate::plugin_path())
    .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
    .stderr(Stdio::from(std::fs::File::create(&err).unwrap()));
    for k in cleared {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut kid = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = kid.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = kid.kill();
            let _ = kid.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = format!(
        "{}{}",
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
    let Some(status) = status else {
        panic!("child {name} hung:\n{text}");
    };
    assert!(status.success(), "child {name} failed ({status}):\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
    Some(text)
}
