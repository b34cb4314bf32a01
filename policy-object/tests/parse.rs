use policy_object::{MapKind, Object, ObjectError};
use std::path::PathBuf;

fn policy(path: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", p.display()))
}

#[test]
fn size_aware_policy_parses() {
    let o = Object::parse(&policy("src/size_aware.o")).unwrap();
    assert_eq!(o.programs.len(), 1);
    let p = &o.programs[0];
    assert_eq!(
        (p.name.as_str(), p.section.as_str()),
        ("size_aware", "tuner")
    );
    let names: Vec<_> = o
        .maps
        .iter()
        .map(|m| {
            (
                m.name.as_str(),
                m.kind,
                m.key_size,
                m.value_size,
                m.max_entries,
            )
        })
        .collect();
    assert!(
        names.contains(&("tuner_thresholds", MapKind::Array, 4, 8, 4)),
        "{names:?}"
    );
    assert!(
        names.contains(&("tuner_decisions", MapKind::Array, 4, 16, 3)),
        "{names:?}"
    );
    let ro = o.maps.iter().find(|m| m.name == ".rodata").unwrap();
    assert!(ro.read_only);
    // default_small (16 KiB) and default_large (4 MiB), in declaration order.
    let want: Vec<u8> = [16u64 * 1024, 4 << 20]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(ro.initial.as_deref(), Some(&want[..]));
    let lddw: Vec<_> = p
        .insns
        .iter()
        .filter(|i| i.is_lddw() && i.src != 0)
        .collect();
    assert!(lddw.len() >= 4);
    assert!(!p.lines.is_empty(), "line info");
    assert!(
        p.lines
            .iter()
            .any(|l| l.text.contains("bpf_map_lookup_elem"))
    );
}

#[test]
fn hostile_inputs_are_errors() {
    let good = policy("src/size_aware.o");
    assert!(matches!(
        Object::parse(b"not an elf"),
        Err(ObjectError::NotElf(_))
    ));
    assert!(Object::parse(&[]).is_err());
    for cut in [16, 64, 200, good.len() / 2, good.len() - 1] {
        let _ = Object::parse(&good[..cut]); // must not panic
    }
    let mut x = 1u64;
    for round in 0..2000 {
        let mut bad = good.clone();
        for _ in 0..(1 + round % 8) {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pos = (x >> 33) as usize % bad.len();
            bad[pos] = (x >> 17) as u8;
        }
        let _ = Object::parse(&bad); // must not panic
    }
}
