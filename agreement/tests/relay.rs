//! The node-local relay against what others may leave in its directory (special files, links,
//! huge files), registries it must not use, and relays that share a pid.

use ncclbpf_agreement::local::Local;
use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ncclbpf-relay-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn frame(bytes: &[u8]) -> Arc<[u8]> {
    Arc::from(bytes)
}

/// The tokens with a lock file in `<registry>/agree`.
fn tokens(registry: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(registry.join("agree")) else {
        return vec![];
    };
    let mut t: Vec<String> = rd
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().into_string().ok()?;
            Some(n.strip_suffix(".lock")?.to_owned())
        })
        .collect();
    t.sort();
    t
}

/// Opens a relay in `registry` and says which token is its.
fn open(registry: &Path) -> (Local, String) {
    let before = tokens(registry);
    let l = Local::open(registry).unwrap();
    let new: Vec<String> = tokens(registry)
        .into_iter()
        .filter(|t| !before.contains(t))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    (l, new[0].clone())
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "{}", p.display());
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

/// `collect` on another thread; `None` if it has not returned within `secs`.
fn collect_within(me: Local, secs: u64) -> Option<(Local, Vec<Vec<u8>>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut me = me;
        let got = me.collect();
        let _ = tx.send((me, got));
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

#[test]
fn fifos_and_links_in_the_directory_do_not_hang_the_relay_and_are_removed() {
    let d = dir("fifo");
    let agree = d.join("agree");
    let (a, _) = open(&d);
    let (mut b, tb) = open(&d);
    b.publish(&[frame(b"first")]).unwrap();
    // b's current file becomes a FIFO; its next generation a link to a FIFO outside; a file
    // named the way an older relay named them, a FIFO too.
    let outside = d.join("outside-fifo");
    mkfifo(&outside);
    fs::remove_file(agree.join(format!("{tb}.0"))).unwrap();
    mkfifo(&agree.join(format!("{tb}.0")));
    std::os::unix::fs::symlink(&outside, agree.join(format!("{tb}.1"))).unwrap();
    mkfifo(&agree.join("1.0"));
    let Some((a, got)) = collect_within(a, 5) else {
        // Unblock a reader stuck in open() so the test process can end.
        for p in [outside, agree.join(format!("{tb}.0")), agree.join("1.0")] {
            let _ = fs::OpenOptions::new().write(true).open(p);
        }
        panic!("collect() still blocked after 5 s");
    };
    assert!(got.is_empty(), "{got:?}");
    assert!(
        !exists(&agree.join(format!("{tb}.0"))),
        "the FIFO is removed"
    );
    assert!(
        !exists(&agree.join(format!("{tb}.1"))),
        "the link is removed"
    );
    assert!(
        fs::symlink_metadata(&outside)
            .unwrap()
            .file_type()
            .is_fifo(),
        "what the link named is left alone"
    );
    assert!(
        exists(&agree.join("1.0")),
        "a name that is not ours is left alone"
    );
    // A lock file that is a FIFO: the token is taken for gone, and its files removed.
    let tc = "c".repeat(32);
    mkfifo(&agree.join(format!("{tc}.lock")));
    fs::write(agree.join(format!("{tc}.0")), [4, 0, 0, 0, 1, 2, 3, 4]).unwrap();
    let Some((a, got)) = collect_within(a, 5) else {
        let _ = fs::OpenOptions::new()
            .write(true)
            .open(agree.join(format!("{tc}.lock")));
        panic!("collect() still blocked after 5 s");
    };
    assert!(got.is_empty(), "{got:?}");
    assert!(!exists(&agree.join(format!("{tc}.lock"))));
    assert!(!exists(&agree.join(format!("{tc}.0"))));
    drop((a, b));
    let _ = fs::remove_dir_all(d);
}

#[test]
fn creating_a_file_does_not_follow_a_planted_link() {
    let d = dir("link");
    let agree = d.join("agree");
    let (mut a, _) = open(&d);
    let (mut b, tb) = open(&d);
    let target = d.join("target");
    fs::write(&target, b"keep").unwrap();
    std::os::unix::fs::symlink(&target, agree.join(format!("{tb}.1"))).unwrap();
    // Past the rotation size: b moves to generation 1.
    let big = frame(&[9u8; 60_000]);
    for _ in 0..20 {
        b.publish(std::slice::from_ref(&big)).unwrap();
    }
    assert_eq!(fs::read(&target).unwrap(), b"keep");
    assert!(
        fs::symlink_metadata(agree.join(format!("{tb}.1")))
            .unwrap()
            .file_type()
            .is_file()
    );
    let got = a.collect();
    assert_eq!(got.len(), 20, "a reads both of b's generations");
    drop((a, b));
    let _ = fs::remove_dir_all(d);
}

/// A sparse 1 TiB file costs nothing to make; a reader that allocated by its length would
/// abort the process.
#[test]
fn a_huge_file_does_not_take_the_process_down() {
    let d = dir("big");
    let agree = d.join("agree");
    let (a, _) = open(&d);
    let (mut b, tb) = open(&d);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(agree.join(format!("{tb}.0")))
        .unwrap();
    f.set_len(1 << 40).unwrap();
    let t = Instant::now();
    let (mut a, got) = collect_within(a, 20).expect("collect() returns");
    assert!(got.is_empty(), "{} entries", got.len());
    assert!(a.collect().is_empty());
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // b's records go on reaching a once b moves to its next file.
    let big = frame(&[1u8; 60_000]);
    for _ in 0..20 {
        b.publish(std::slice::from_ref(&big)).unwrap();
    }
    b.publish(&[frame(b"next")]).unwrap();
    assert!(a.collect().contains(&b"next".to_vec()));
    drop((a, b));
    let _ = fs::remove_dir_all(d);
}

fn refused(registry: &Path) -> String {
    match Local::open(registry) {
        Ok(_) => panic!("{} was used", registry.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_registry_another_user_owns_or_others_may_write_is_refused() {
    let d = dir("mode");
    for mode in [0o777, 0o775, 0o757, 0o1777] {
        fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
        let e = refused(&d);
        assert!(e.contains("not this user's own directory"), "{mode:o}: {e}");
    }
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    drop(Local::open(&d).unwrap());
    // `agree` itself: owner-only.
    for mode in [0o750, 0o701, 0o777] {
        fs::set_permissions(d.join("agree"), fs::Permissions::from_mode(mode)).unwrap();
        let e = refused(&d);
        assert!(e.contains("agree"), "{mode:o}: {e}");
    }
    fs::set_permissions(d.join("agree"), fs::Permissions::from_mode(0o700)).unwrap();
    drop(Local::open(&d).unwrap());
    // A link, to the registry or in place of `agree`.
    let link = d.with_extension("link");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&d, &link).unwrap();
    let e = refused(&link);
    assert!(e.contains("symbolic link"), "{e}");
    fs::rename(d.join("agree"), d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real"), d.join("agree")).unwrap();
    assert!(refused(&d).contains("symbolic link"));
    let _ = fs::remove_file(link);
    let _ = fs::remove_dir_all(d);
}

/// The registry as another user made it (by default `/dev/shm/ncclbpf-<uid>`, a name anyone
/// can take first): its owner could swap our `agree` for a directory of theirs.
#[test]
fn a_registry_or_directory_of_another_user_is_refused() {
    let d = dir("owner");
    if std::os::unix::fs::chown(&d, Some(65534), Some(65534)).is_err() {
        eprintln!("not root: cannot make another user's directory; skipped");
        let _ = fs::remove_dir_all(d);
        return;
    }
    let e = refused(&d);
    assert!(e.contains("not this user's own directory"), "{e}");
    assert!(!d.join("agree").exists(), "nothing made in it");
    std::os::unix::fs::chown(&d, Some(0), Some(0)).unwrap();
    fs::create_dir(d.join("agree")).unwrap();
    fs::set_permissions(d.join("agree"), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(d.join("agree"), Some(65534), Some(65534)).unwrap();
    let e = refused(&d);
    assert!(e.contains("agree") && e.contains("owner 65534"), "{e}");
    let _ = fs::remove_dir_all(d);
}

/// A file of another user in the directory is neither read nor removed (only root can put
/// one there).
#[test]
fn a_file_of_another_user_is_not_read() {
    let d = dir("foreign");
    let agree = d.join("agree");
    let (mut a, _) = open(&d);
    let (b, tb) = open(&d);
    let f = agree.join(format!("{tb}.0"));
    fs::write(&f, [3, 0, 0, 0, b'x', b'y', b'z']).unwrap();
    if std::os::unix::fs::chown(&f, Some(65534), Some(65534)).is_err() {
        eprintln!("not root: cannot make another user's file; skipped");
        drop((a, b));
        let _ = fs::remove_dir_all(d);
        return;
    }
    assert!(a.collect().is_empty());
    assert!(f.exists());
    drop((a, b));
    let _ = fs::remove_dir_all(d);
}

/// Ranks in containers that share /dev/shm but not a PID namespace may have the same pid; two
/// relays of one process stand in for them.
#[test]
fn two_relays_with_the_same_pid_see_each_others_records() {
    let d = dir("samepid");
    let (mut a, ta) = open(&d);
    a.publish(&[frame(b"from a")]).unwrap();
    let (mut b, tb) = open(&d);
    assert_ne!(ta, tb);
    let a_file = d.join("agree").join(format!("{ta}.0"));
    assert_eq!(
        fs::metadata(&a_file).unwrap().len(),
        4 + 6,
        "b left a's file alone"
    );
    b.publish(&[frame(b"from b")]).unwrap();
    assert_eq!(b.collect(), vec![b"from a".to_vec()]);
    assert_eq!(a.collect(), vec![b"from b".to_vec()]);
    assert!(a.collect().is_empty() && b.collect().is_empty());
    drop(a);
    assert!(!exists(&a_file), "a removes its files");
    assert!(b.collect().is_empty());
    drop(b);
    assert_eq!(fs::read_dir(d.join("agree")).unwrap().count(), 0);
    let _ = fs::remove_dir_all(d);
}

const CHILD_ENV: &str = "NCCLBPF_RELAY_TEST_CHILD";

/// Run by `a_relay_that_died_is_cleaned_up` in a process of its own: a relay that ends without
/// removing its files.
#[test]
fn relay_child() {
    let Some(registry) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let mut l = Local::open(Path::new(&registry)).unwrap();
    l.publish(&[frame(b"last words")]).unwrap();
    std::process::exit(0); // no Drop: the files stay, the lock goes with the process
}

#[test]
fn a_relay_that_died_is_cleaned_up() {
    let d = dir("died");
    let (mut a, ta) = open(&d);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["relay_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &d)
        .status()
        .unwrap();
    assert!(status.success());
    let left = tokens(&d);
    assert_eq!(left.len(), 2, "the child's lock file is left: {left:?}");
    let child = left.iter().find(|t| **t != ta).unwrap().clone();
    assert!(d.join("agree").join(format!("{child}.0")).exists());
    // Its lock is free: the child is gone, and a reader removes its files.
    a.collect();
    assert_eq!(tokens(&d), vec![ta]);
    assert!(!d.join("agree").join(format!("{child}.0")).exists());
    drop(a);
    let _ = fs::remove_dir_all(d);
}
