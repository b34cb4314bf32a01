//! Map declarations the loader must accept or refuse: every `policies/maps/*.c` says in its
//! `// expect:` header either `ok` or the error it must be refused with (`map '<name>': <part
//! of the reason>`). Epoch sources, agreed maps filled from them and the state map
//! (`ncclbpf_source`, `ncclbpf_reduce`) are checked here.

use policy_object::{MapDef, MapKind, Object, ObjectError, Reduce, SOURCE_STATE, Scope};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn parse(name: &str) -> Result<Object, ObjectError> {
    let p = root().join(format!("target/policies/maps/{name}.o"));
    let bytes = std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", p.display()));
    Object::parse(&bytes)
}

#[test]
fn every_fixture_is_accepted_or_refused_as_its_header_says() {
    let mut files: Vec<_> = std::fs::read_dir(root().join("policies/maps"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    files.sort();
    let mut failures = vec![];
    let (mut ok, mut refused) = (0, 0);
    for c in &files {
        let name = c.file_stem().unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(c).unwrap();
        let want = src
            .lines()
            .find_map(|l| l.strip_prefix("// expect: "))
            .unwrap_or_else(|| panic!("{name}: no '// expect:' header"))
            .trim()
            .to_string();
        match (parse(&name), want.as_str()) {
            (Ok(_), "ok") => ok += 1,
            (Ok(_), _) => failures.push(format!("{name}: accepted, want {want}")),
            (Err(e), "ok") => failures.push(format!("{name}: refused: {e}")),
            (Err(e), _) => {
                let got = e.to_string();
                if !matches!(e, ObjectError::BadMap { .. }) || !got.contains(&want) {
                    failures.push(format!("{name}: refused with\n  {got}\nwant\n  {want}"));
                }
                refused += 1;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ok >= 1 && refused >= 15, "{ok} accepted, {refused} refused");
}

fn map<'a>(o: &'a Object, name: &str) -> &'a MapDef {
    o.maps
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no map {name}"))
}

#[test]
fn sources_and_reductions_are_read() {
    let o = parse("sources_ok").unwrap();
    let got = |n: &str| {
        let m = map(&o, n);
        (m.scope, m.source, m.reduce)
    };
    assert_eq!(got("calls"), (Scope::Local, Some(1), Reduce::Sum));
    assert_eq!(got("calls_max"), (Scope::Agreed, Some(1), Reduce::Max));
    assert_eq!(got("calls_sum"), (Scope::Agreed, Some(1), Reduce::Sum));
    assert_eq!(got("calls_min"), (Scope::Agreed, Some(1), Reduce::Min));
    assert_eq!(got("spare"), (Scope::Local, Some(254), Reduce::Sum));
    assert_eq!(
        got("state"),
        (Scope::Agreed, Some(SOURCE_STATE), Reduce::Sum)
    );
    assert_eq!(got("plain_agreed"), (Scope::Agreed, None, Reduce::Sum));
    assert_eq!(got("plain_hash"), (Scope::Local, None, Reduce::Sum));
    let s = map(&o, "state");
    assert_eq!(
        (s.kind, s.value_size, s.max_entries),
        (MapKind::Array, 32, 8)
    );
    // Global data has no source.
    let bss = map(&o, ".bss");
    assert_eq!((bss.source, bss.reduce), (None, Reduce::Sum));
}

#[test]
fn the_header_macros_expand_to_sources() {
    let o = parse("macros_ok").unwrap();
    let got = |n: &str| {
        let m = map(&o, n);
        (m.scope, m.source, m.reduce)
    };
    assert_eq!(got("counts"), (Scope::Local, Some(3), Reduce::Sum));
    assert_eq!(got("counts_min"), (Scope::Agreed, Some(3), Reduce::Min));
    assert_eq!(
        got("state"),
        (Scope::Agreed, Some(SOURCE_STATE), Reduce::Sum)
    );
    assert_eq!(map(&o, "state").max_entries, 32);
    assert_eq!(o.programs[0].section, "tuner/epoch");
}

#[test]
fn shipped_policies_without_sources_are_unchanged() {
    let p = root().join("target/policies/src/size_aware.o");
    let o = Object::parse(&std::fs::read(p).unwrap()).unwrap();
    assert!(o.maps.iter().all(|m| m.source.is_none()));
}
