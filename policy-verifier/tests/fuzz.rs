//! Fuzzing as properties (bounded in CI; `scripts/fuzz.sh` runs them long): hostile objects
//! never panic the loader, and hostile bytecode never panics or hangs the verifier.

use policy_object::{Insn, Object};
use policy_verifier::platform::{HOOKS, MapInfo};
use policy_verifier::{Limits, map_infos, verify, verify_insns};
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::OnceLock;

fn corpus() -> &'static Vec<Vec<u8>> {
    static C: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    C.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies");
        let mut v = vec![];
        for dir in ["src", "safe", "unsafe"] {
            let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
                .expect("run policies/build.sh")
                .flatten()
                .map(|e| e.path())
                .collect();
            files.sort();
            for f in files {
                v.push(std::fs::read(f).unwrap());
            }
        }
        v
    })
}

fn limits() -> Limits {
    // A smaller budget keeps each case quick; exhaustion is itself a verdict.
    Limits {
        max_processed: 50_000,
        ..Limits::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn mutated_objects_never_panic_the_loader(pick in any::<usize>(), muts in proptest::collection::vec((any::<u32>(), any::<u8>()), 0..12), cut in any::<u32>(), do_cut in any::<bool>()) {
        let c = corpus();
        let mut bytes = c[pick % c.len()].clone();
        for (pos, b) in muts {
            let n = bytes.len();
            bytes[pos as usize % n] = b;
        }
        if do_cut {
            bytes.truncate(cut as usize % (bytes.len() + 1));
        }
        if let Ok(o) = Object::parse(&bytes) {
            let maps = map_infos(&o.maps);
            for p in &o.programs {
                let _ = verify(p, &maps, limits());
            }
        }
    }

    #[test]
    fn random_bytecode_never_panics_the_verifier(words in proptest::collection::vec(any::<u64>(), 1..64), hook in 0usize..7) {
        let insns: Vec<Insn> = words.iter().map(|w| {
            let mut i = Insn::decode(&w.to_le_bytes());
            // Bias towards valid registers and small offsets so the checks get deep.
            i.dst %= 11;
            i.src %= 11;
            if w >> 63 == 1 { i.off %= 8; }
            i
        }).collect();
        let maps = vec![MapInfo { name: "m".into(), key_size: 4, value_size: 16, max_entries: 4, read_only: false, global_data: false }];
        let _ = verify_insns(&insns, &HOOKS[hook], &maps, limits());
    }
}
