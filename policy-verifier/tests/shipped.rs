use policy_object::Object;
use policy_verifier::{Limits, map_infos, verify};
use std::path::PathBuf;

pub fn load(path: &str) -> Object {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(path);
    let bytes = std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", p.display()));
    Object::parse(&bytes).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn size_aware_is_accepted() {
    let o = load("src/size_aware.o");
    let maps = map_infos(&o.maps);
    for p in &o.programs {
        match verify(p, &maps, Limits::default()) {
            Ok(s) => eprintln!("{}: {s:?}", p.name),
            Err(e) => panic!("{}: {e}", p.name),
        }
    }
}
