//! The `rules` policy (policies/src/rules.c, built by policies/build.sh) against the parser's
//! own matching ([`rules::first_match`]): the same decision for every collective, size and
//! shape, JIT-compiled, interpreted and in the checking interpreter; and the C struct the
//! policy reads, from the object's BTF, against the Rust twin that fills it.

use ncclbpf_tuner::rules::{self, MAX_RULES, Rule, RuleEntry};
use policy_runtime::{LoadedProgram, TunerCtx};
use shared_maps::{Map, Registry};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn built(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/policies")
        .join(rel);
    assert!(p.exists(), "{} missing: run policies/build.sh", p.display());
    p
}

struct Tmp(PathBuf);

impl Tmp {
    fn new(tag: &str) -> Tmp {
        let d = std::env::temp_dir().join(format!("ncclbpf-rules-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tmp(d)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load(obj: &Path, reg: &Registry) -> (LoadedProgram, Arc<Map>) {
    let p = ncclbpf_tuner::policy::load(obj.to_str().unwrap(), None, reg).unwrap();
    let map = p
        .maps()
        .iter()
        .find(|m| m.spec().name == rules::MAP_NAME)
        .expect("rules.o has a tuner_rules map")
        .clone();
    (p, map)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

const SIZES: [u64; 9] = [0, 1, 1000, 4096, 65535, 65536, 65537, 1 << 20, u64::MAX];

/// A random rules file of `n` lines, every field drawn from a small set so rules overlap.
fn random_file(r: &mut Rng, n: usize) -> String {
    let opt = |r: &mut Rng, xs: &[&str]| r.pick(xs).to_string();
    (0..n)
        .map(|_| {
            let (mut a, mut b) = (r.pick(&SIZES[..8]), r.pick(&SIZES[..8]));
            if a > b {
                std::mem::swap(&mut a, &mut b);
            }
            let max = if r.below(4) == 0 {
                "-1".to_string()
            } else {
                b.to_string()
            };
            let mut f = vec![
                rules::COLLECTIVES[r.below(5) as usize].to_string(),
                a.to_string(),
                max,
                rules::ALGORITHMS[r.below(7) as usize].to_string(),
                rules::PROTOCOLS[r.below(3) as usize].to_string(),
                opt(r, &["-1", "1", "8", "64"]),
                opt(r, &["-1", "-1", "1", "2"]), // never more nodes than ranks:
                opt(r, &["-1", "-1", "2", "8"]), // the parser refuses those
            ];
            match r.below(3) {
                0 => {}
                1 => f.push(opt(r, &["-1", "1", "2"])),
                _ => {
                    f.push(opt(r, &["-1", "1", "2"]));
                    f.push(opt(r, &["-1", "0", "1"]));
                }
            }
            f.join(",") + "\n"
        })
        .collect()
}

fn random_ctx(r: &mut Rng) -> TunerCtx {
    TunerCtx {
        msg_size: match r.below(3) {
            0 => r.pick(&SIZES),
            1 => r.pick(&SIZES).wrapping_add(r.below(3)).wrapping_sub(1),
            _ => r.next() >> r.below(64),
        },
        comm_id: r.next(),
        coll_type: r.below(7) as u32, // 5 and 6 (sendrecv, send): no rule names them
        nranks: r.pick(&[1, 2, 8, 16]),
        nnodes: r.pick(&[1, 2, 4]),
        num_pipe_ops: r.pick(&[1, 2, 3]),
        reg_buff: r.pick(&[0, 1]),
        max_channels: 0,
        algo: -1,
        proto: -1,
        nchannels: 0,
        usable: 0,
        nccl_algo: -1,
        nccl_proto: -1,
    }
}

/// What the policy must write for `ctx`: the first matching rule's choice, or nothing.
fn expected(rules: &[Rule], ctx: &TunerCtx) -> (i32, i32, u32) {
    match rules::first_match(rules, ctx) {
        Some(r) => (r.algo as i32, r.proto as i32, r.channels.unwrap_or(0)),
        None => (-1, -1, 0),
    }
}

fn decide(p: &LoadedProgram, ctx: &TunerCtx, engine: u32) -> (u64, TunerCtx) {
    let mut c = *ctx;
    let ret = match engine {
        0 => p.run(&mut c),
        1 => p.run_interpreted(&mut c),
        _ => p.run_checked(&mut c, 1 << 20).expect("no fault"),
    };
    (ret, c)
}

#[test]
fn the_policy_decides_as_the_first_matching_rule() {
    let tmp = Tmp::new("policy");
    let reg = Registry::new(tmp.0.join("shm"));
    let (prog, map) = load(&built("src/rules.o"), &reg);
    assert_eq!(map.spec().max_entries as usize, MAX_RULES);
    let file = tmp.0.join("nccl_tuner.conf");
    let mut r = Rng(0x5eed_1234_abcd_0001);
    for round in 0..40 {
        let n = [0, 1, 3, 20, 100][round % 5];
        let text = random_file(&mut r, n);
        std::fs::write(&file, &text).unwrap();
        let parsed = rules::parse(&text, "random.conf").unwrap_or_else(|e| panic!("{e:?}"));
        // Rules on regBuff are skipped (rank-local), and never match in the reference either.
        let installed = parsed.iter().filter(|r| r.skipped().is_none()).count();
        assert_eq!(rules::install_file(&map, &file), Ok(installed));
        let (mut hits, mut misses) = (0, 0);
        for k in 0..500 {
            let ctx = random_ctx(&mut r);
            let want = expected(&parsed, &ctx);
            let (ret, got) = decide(&prog, &ctx, k % 3);
            assert_eq!(
                (got.algo, got.proto, got.nchannels),
                want,
                "round {round}, {ctx:?}\n{text}"
            );
            assert_eq!(ret, u64::from(want.0 >= 0));
            let untouched = TunerCtx {
                algo: got.algo,
                proto: got.proto,
                nchannels: got.nchannels,
                ..ctx
            };
            assert_eq!(got, untouched, "only algo, proto and nchannels are written");
            if want.0 >= 0 { hits += 1 } else { misses += 1 }
        }
        if n >= 20 {
            assert!(
                hits > 0 && misses > 0,
                "round {round}: {hits} hits, {misses} misses"
            );
        }
    }
}

#[test]
fn a_full_table_is_scanned_to_its_last_rule() {
    let tmp = Tmp::new("full");
    let reg = Registry::new(tmp.0.join("shm"));
    let (prog, map) = load(&built("src/rules.o"), &reg);
    // MAX_RULES - 1 rules that never match a 4-rank all-reduce, then one that does.
    let mut text: String = (0..MAX_RULES - 1)
        .map(|i| format!("allreduce,{i},{i},tree,ll,-1,-1,2\n"))
        .collect();
    text += "allreduce,0,-1,nvls_tree,ll128,7,-1,4,-1,-1\n";
    let file = tmp.0.join("full.conf");
    std::fs::write(&file, &text).unwrap();
    assert_eq!(rules::install_file(&map, &file), Ok(MAX_RULES));
    for engine in 0..3 {
        let ctx = TunerCtx {
            msg_size: 5,
            coll_type: 4,
            nranks: 4,
            nnodes: 1,
            num_pipe_ops: 1,
            algo: -1,
            proto: -1,
            ..Default::default()
        };
        let (ret, got) = decide(&prog, &ctx, engine);
        assert_eq!((ret, got.algo, got.proto, got.nchannels), (1, 5, 1, 7));
        let (ret, got) = decide(&prog, &TunerCtx { nranks: 8, ..ctx }, engine);
        assert_eq!((ret, got.algo, got.proto, got.nchannels), (0, -1, -1, 0));
    }
}

#[test]
fn the_first_invalid_entry_ends_the_table() {
    let tmp = Tmp::new("end");
    let reg = Registry::new(tmp.0.join("shm"));
    let (prog, map) = load(&built("src/rules.o"), &reg);
    let any = RuleEntry {
        min_bytes: 0,
        max_bytes: u64::MAX,
        valid: 1,
        coll: 4,
        algo: 1,
        proto: 2,
        channels: -1,
        nnodes: -1,
        nranks: -1,
        num_pipe_ops: -1,
        reg_buff: -1,
        reserved: 0,
    };
    let put = |i: u32, e: RuleEntry| map.update(&i.to_le_bytes(), &e.to_bytes(), 0).unwrap();
    put(0, RuleEntry { coll: 0, ..any }); // a broadcast rule
    put(1, RuleEntry { valid: 0, ..any }); // the end, though it would match
    put(2, any);
    let ctx = TunerCtx {
        msg_size: 1,
        coll_type: 4,
        nranks: 2,
        nnodes: 1,
        num_pipe_ops: 1,
        algo: -1,
        proto: -1,
        ..Default::default()
    };
    for engine in 0..3 {
        let (ret, got) = decide(&prog, &ctx, engine);
        assert_eq!((ret, got.algo, got.proto), (0, -1, -1), "engine {engine}");
    }
    put(1, any);
    assert_eq!(decide(&prog, &ctx, 0).1.algo, 1);
}

/// The `.BTF` section of an ELF64 little-endian object.
fn btf_section(elf: &[u8]) -> &[u8] {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..6], b"\x7fELF\x02\x01", "ELF64 little-endian");
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let sh = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(sh(shstrndx) + 0x18);
    (0..shnum)
        .find_map(|i| {
            let name = &elf[strtab + u32_at(sh(i))..];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap()];
            (name == b".BTF").then(|| {
                let (off, size) = (u64_at(sh(i) + 0x18), u64_at(sh(i) + 0x20));
                &elf[off..off + size]
            })
        })
        .expect("a .BTF section (built with -g)")
}

#[test]
fn the_c_struct_is_the_rust_twin() {
    use std::mem::{offset_of, size_of};
    let elf = std::fs::read(built("src/rules.o")).unwrap();
    let btf = policy_object::btf::Btf::parse(btf_section(&elf)).unwrap();
    let (id, t) = btf
        .types
        .iter()
        .enumerate()
        .find(|(_, t)| t.kind == policy_object::btf::KIND_STRUCT && t.name == "ncclbpf_tuner_rule")
        .expect("struct ncclbpf_tuner_rule in rules.o's BTF");
    assert_eq!(
        btf.size_of(id as u32).unwrap(),
        size_of::<RuleEntry>() as u64
    );
    let c: Vec<(String, u32, u64)> = t
        .members
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                m.offset / 8,
                btf.size_of(m.type_id).unwrap(),
            )
        })
        .collect();
    let rust = [
        ("min_bytes", offset_of!(RuleEntry, min_bytes), 8),
        ("max_bytes", offset_of!(RuleEntry, max_bytes), 8),
        ("valid", offset_of!(RuleEntry, valid), 4),
        ("coll", offset_of!(RuleEntry, coll), 4),
        ("algo", offset_of!(RuleEntry, algo), 4),
        ("proto", offset_of!(RuleEntry, proto), 4),
        ("channels", offset_of!(RuleEntry, channels), 4),
        ("nnodes", offset_of!(RuleEntry, nnodes), 4),
        ("nranks", offset_of!(RuleEntry, nranks), 4),
        ("num_pipe_ops", offset_of!(RuleEntry, num_pipe_ops), 4),
        ("reg_buff", offset_of!(RuleEntry, reg_buff), 4),
        ("reserved", offset_of!(RuleEntry, reserved), 4),
    ]
    .map(|(n, o, s)| (n.to_string(), o as u32, s));
    assert_eq!(c, rust);
    // The map's shape, as the loader sees it.
    let obj = policy_object::Object::parse(&elf).unwrap();
    let m = obj.maps.iter().find(|m| m.name == rules::MAP_NAME).unwrap();
    assert_eq!(
        (m.key_size, m.value_size as usize, m.max_entries as usize),
        (4, RuleEntry::SIZE, MAX_RULES)
    );
}

/// A staged rules program shares the running program's table: staging does not read the rules
/// file again (here there is none, which would have emptied the table), so the running program's
/// rules do not change before the stated collective, and the staged one starts with them.
#[test]
fn a_staged_rules_program_keeps_the_running_table() {
    let tmp = Tmp::new("stage");
    let reg = Registry::new(tmp.0.join("shm"));
    let (_running, map) = load(&built("src/rules.o"), &reg);
    let file = tmp.0.join("nccl_tuner.conf");
    std::fs::write(&file, "allreduce,0,-1,ring,simple,4,-1,-1\n").unwrap();
    assert_eq!(rules::install_file(&map, &file), Ok(1));
    let before = map.get(&0u32.to_le_bytes()).unwrap();
    let bytes = std::fs::read(built("src/rules.o")).unwrap();
    let obj = policy_object::Object::parse(&bytes).unwrap();
    let history = ncclbpf_tuner::stage::History::new();
    let staged =
        ncclbpf_tuner::stage::stage_program(&obj, "rules.o", 1000, &reg, &history).unwrap();
    assert!(staged.rules_kept);
    assert_eq!(
        map.get(&0u32.to_le_bytes()).unwrap(),
        before,
        "the table is as it was"
    );
    assert_eq!(history.staged().len(), 1);
}
