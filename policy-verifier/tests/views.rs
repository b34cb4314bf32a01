//! Hooks without the communicator's views (`Hook::views`): agreed maps and config maps other
//! than `.rodata` are process-wide while their contents are per communicator, and the runtime
//! installs a communicator's contents only before its `tuner` and `tuner/epoch` programs
//! (tuner/src/agree.rs, `Agreement::install`). `tuner/chunk` and `tuner/init` run without them
//! and read whichever communicator's contents were installed last, so there a value read from
//! such a map is rank-local: a decision may depend on the context, constants and `.rodata`
//! only. Whether an array entry exists still depends on the key alone.

use policy_object::insn::build::{
    alu64_imm, alu64_reg, call, exit, ja, jmp_imm, ld_map, ld_map_value, ldx, mov64_imm, mov64_reg,
    st, stx,
};
use policy_object::insn::{ADD, AND, B, DW, JEQ, JGT, LSH, MUL, RSH, W};
use policy_object::{Insn, Object, Scope};
use policy_verifier::platform::{HOOKS, MapInfo, hook};
use policy_verifier::{Limits, map_infos, verify, verify_insns};
use std::path::PathBuf;

const RODATA: i32 = 0; // .rodata (64 bytes): config that comes with the object
const AGREED: i32 = 1; // an agreed array (key 4, value 8, 4 entries)
const CFG: i32 = 2; // a config array (key 4, value 8, 4 entries): what staged updates change
const CFG_HASH: i32 = 3; // a config hash map (key 4, value 8)
const BSS: i32 = 4; // .bss: rank-local

fn maps() -> Vec<MapInfo> {
    let m = |name: &str, vs, n, ro, global, scope, array| MapInfo {
        name: String::from(name),
        key_size: 4,
        value_size: vs,
        max_entries: n,
        read_only: ro,
        global_data: global,
        scope,
        array,
    };
    vec![
        m(".rodata", 64, 1, true, true, Scope::Config, true),
        m("agreed", 8, 4, false, false, Scope::Agreed, true),
        m("cfg", 8, 4, false, false, Scope::Config, true),
        m("cfg_hash", 8, 4, false, false, Scope::Config, false),
        m(".bss", 64, 1, false, true, Scope::Local, true),
    ]
}

/// The writable field each deciding hook's programs here write: (offset, size).
fn field(section: &str) -> (i16, u8) {
    match section {
        "tuner" => (48, W),        // nchannels
        "tuner/epoch" => (48, DW), // state[0]
        "tuner/chunk" => (40, DW), // chunk_size
        "tuner/init" => (32, DW),  // base_latencies[0][0]
        _ => unreachable!("{section}"),
    }
}

/// `r9 = ctx; fp-4 = key; r0 = bpf_map_lookup_elem(&map, &fp-4); if r0 == 0 goto out;`
/// (instructions 0..=7), then `body` (which may use r0 as the value, r9 as the context), then
/// `out: r0 = 0; exit`.
fn after_lookup(map: i32, key: i32, body: &[Insn]) -> Vec<Insn> {
    let mut v = vec![mov64_reg(9, 1), st(W, 10, -4, key)];
    v.extend(ld_map(1, map));
    v.push(mov64_reg(2, 10));
    v.push(alu64_imm(ADD, 2, -4));
    v.push(call(1));
    v.push(jmp_imm(JEQ, 0, 0, body.len() as i16));
    v.extend_from_slice(body);
    v.push(mov64_imm(0, 0));
    v.push(exit());
    v
}

/// The program's decision written from the first word of `map`'s entry `key` (insn 9).
fn decide_from(section: &str, map: i32, key: i32) -> Vec<Insn> {
    let (off, size) = field(section);
    after_lookup(map, key, &[ldx(DW, 1, 0, 0), stx(size, 9, off, 1)])
}

/// `r9 = ctx; r6 = &.rodata; r1 = .rodata[8..16]; the decision = r1`.
fn decide_from_rodata(section: &str) -> Vec<Insn> {
    let (off, size) = field(section);
    let mut v = vec![mov64_reg(9, 1)];
    v.extend(ld_map_value(6, RODATA, 0));
    v.extend([
        ldx(DW, 1, 6, 8),
        stx(size, 9, off, 1),
        mov64_imm(0, 0),
        exit(),
    ]);
    v
}

fn verdict(section: &str, insns: &[Insn]) -> Result<(), (String, usize, String)> {
    verify_insns(insns, hook(section).unwrap(), &maps(), Limits::default())
        .map(|_| ())
        .map_err(|e| (e.kind().to_string(), e.insn, e.to_string()))
}

#[track_caller]
fn accepts(section: &str, name: &str, insns: &[Insn]) {
    if let Err((_, _, text)) = verdict(section, insns) {
        panic!("{section}: {name}: rejected:\n{text}");
    }
}

/// Rejected as rank-local at `at`; returns the message.
#[track_caller]
fn rank_local(section: &str, name: &str, insns: &[Insn], at: usize) -> String {
    match verdict(section, insns) {
        Err((k, i, text)) => {
            if std::env::var_os("SHOW_REJECTIONS").is_some() {
                eprintln!("{section}: {name}: {text}\n");
            }
            assert!(
                k == "rank_local" && i == at,
                "{section}: {name}: want rank_local at {at}, got {k} at {i}:\n{text}"
            );
            text
        }
        Ok(()) => panic!("{section}: {name}: ACCEPTED, want rank_local at {at}"),
    }
}

#[test]
fn only_tuner_and_tuner_epoch_run_with_the_communicators_views() {
    for h in HOOKS {
        let want = matches!(h.section, "tuner" | "tuner/epoch");
        assert_eq!(h.views, want, "{}", h.section);
    }
    let per_comm: Vec<bool> = maps().iter().map(MapInfo::per_comm).collect();
    assert_eq!(per_comm, [false, true, true, true, false]);
}

#[test]
fn tuner_chunk_may_not_decide_from_an_agreed_map() {
    let text = rank_local(
        "tuner/chunk",
        "agreed",
        &decide_from("tuner/chunk", AGREED, 0),
        9,
    );
    for want in [
        "writes 'chunk_size' from a value of map 'agreed', which is agreed",
        "'tuner/chunk' programs run without the communicator's view of them",
        "'tuner/chunk' programs decide from the context, constants and .rodata only",
    ] {
        assert!(text.contains(want), "missing '{want}':\n{text}");
    }
}

#[test]
fn tuner_chunk_may_not_decide_from_a_config_map() {
    let text = rank_local("tuner/chunk", "cfg", &decide_from("tuner/chunk", CFG, 1), 9);
    assert!(
        text.contains("map 'cfg', which is config: its contents are per communicator (staged updates take effect at each communicator's own collective)"),
        "{text}"
    );
    // A config hash map too: there whether the entry exists is per communicator as well, so
    // the NULL check already opens a rank-local region.
    let p = after_lookup(CFG_HASH, 0, &[st(DW, 9, 40, 4096)]);
    rank_local("tuner/chunk", "cfg_hash entry", &p, 8);
}

#[test]
fn tuner_chunk_decides_from_rodata_and_the_context() {
    accepts("tuner/chunk", ".rodata", &decide_from_rodata("tuner/chunk"));
    // chunk_size = (msg_size >> 4) * nchannels, bounded below by a .rodata constant.
    let mut p = vec![mov64_reg(9, 1)];
    p.extend(ld_map_value(6, RODATA, 0));
    p.extend([
        ldx(DW, 1, 9, 0),      // msg_size
        alu64_imm(RSH, 1, 4),  //
        ldx(W, 2, 9, 28),      // nchannels
        alu64_reg(MUL, 1, 2),  //
        ldx(DW, 3, 6, 0),      // a .rodata floor
        jmp_imm(JGT, 1, 0, 1), // if r1 > 0 keep it
        mov64_reg(1, 3),       // else the floor
        stx(DW, 9, 40, 1),     // chunk_size
        mov64_imm(0, 0),
        exit(),
    ]);
    accepts("tuner/chunk", "ctx fields", &p);
    // A constant written once an agreed array's entry is found: whether it exists depends on
    // the key alone (here a constant), not on any communicator's contents.
    accepts(
        "tuner/chunk",
        "agreed entry exists",
        &after_lookup(AGREED, 3, &[st(DW, 9, 40, 1 << 20)]),
    );
}

#[test]
fn tuner_chunk_may_not_branch_on_or_index_by_a_per_communicator_value() {
    // if (agreed[0] > 100) chunk_size = 1 MiB: the write depends on the branch at insn 9.
    let p = after_lookup(
        AGREED,
        0,
        &[
            ldx(DW, 1, 0, 0),        // 8
            jmp_imm(JGT, 1, 100, 1), // 9
            ja(1),                   // 10
            st(DW, 9, 40, 1 << 20),  // 11
        ],
    );
    let text = rank_local("tuner/chunk", "branch", &p, 11);
    assert!(
        text.contains(
            "depends on the branch at insn 9 on a value of map 'agreed', which is agreed"
        ),
        "{text}"
    );
    // .rodata indexed by a config value: the byte read is chosen per communicator.
    let mut body = vec![ldx(DW, 1, 0, 0), alu64_imm(AND, 1, 7)];
    body.extend(ld_map_value(6, RODATA, 0));
    body.extend([
        alu64_reg(ADD, 6, 1),
        ldx(B, 2, 6, 0),
        alu64_imm(LSH, 2, 12),
        stx(DW, 9, 40, 2),
    ]);
    rank_local("tuner/chunk", "index", &after_lookup(CFG, 0, &body), 15);
}

#[test]
fn tuner_init_may_not_take_a_constant_from_a_config_or_agreed_map() {
    let text = rank_local("tuner/init", "cfg", &decide_from("tuner/init", CFG, 0), 9);
    assert!(
        text.contains("writes 'base_latencies' from a value of map 'cfg', which is config")
            && text.contains("'tuner/init' programs run without the communicator's view of them"),
        "{text}"
    );
    rank_local(
        "tuner/init",
        "agreed",
        &decide_from("tuner/init", AGREED, 0),
        9,
    );
    accepts("tuner/init", ".rodata", &decide_from_rodata("tuner/init"));
}

#[test]
fn tuner_and_tuner_epoch_still_decide_from_agreed_and_config_maps() {
    for section in ["tuner", "tuner/epoch"] {
        for (name, map) in [("agreed", AGREED), ("cfg", CFG), ("cfg_hash", CFG_HASH)] {
            accepts(section, name, &decide_from(section, map, 0));
        }
        accepts(section, ".rodata", &decide_from_rodata(section));
        // Rank-local maps stay rank-local everywhere.
        let text = rank_local(section, ".bss", &decide_from_bss(section), 4);
        assert!(
            text.contains("which is rank-local")
                && text.contains(
                    "tuner programs decide from the context and from agreed or config maps"
                ),
            "{text}"
        );
    }
    // The same rank-local read in tuner/chunk names what tuner/chunk may decide from.
    let text = rank_local("tuner/chunk", ".bss", &decide_from_bss("tuner/chunk"), 4);
    assert!(
        text.contains("which is rank-local")
            && text.contains(
                "'tuner/chunk' programs decide from the context, constants and .rodata only"
            ),
        "{text}"
    );
}

fn decide_from_bss(section: &str) -> Vec<Insn> {
    let (off, size) = field(section);
    let mut v = vec![mov64_reg(9, 1)];
    v.extend(ld_map_value(6, BSS, 0));
    v.extend([
        ldx(DW, 1, 6, 0),
        stx(size, 9, off, 1),
        mov64_imm(0, 0),
        exit(),
    ]);
    v
}

/// The corpus programs of this rule, from C (BTF map definitions): the maps are what the loader
/// makes of `NCCLBPF_AGREED` / `NCCLBPF_CONFIG` arrays and `.rodata`, and the messages name them.
#[test]
fn the_c_programs_of_the_rule() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/policies");
    let load = |name: &str| {
        let path = root.join(format!("{name}.o"));
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run policies/build.sh)", path.display()));
        Object::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    for (name, map, scope) in [
        (
            "unsafe/rank_local_chunk_agreed",
            "agreed_chunk",
            Scope::Agreed,
        ),
        (
            "unsafe/rank_local_chunk_config",
            "chunk_limits",
            Scope::Config,
        ),
        (
            "unsafe/rank_local_init_config",
            "net_latency_us",
            Scope::Config,
        ),
    ] {
        let o = load(name);
        let d = o.maps.iter().find(|m| m.name == map).unwrap();
        assert_eq!((d.scope, d.initial.is_none()), (scope, true), "{name}");
        let e = verify(&o.programs[0], &map_infos(&o.maps), Limits::default()).expect_err(name);
        let text = e.to_string();
        assert!(
            e.kind() == "rank_local"
                && text.contains(&format!("map '{map}', which is {}", scope.name()))
                && text.contains("without the communicator's view"),
            "{name}: {text}"
        );
    }
    for name in ["safe/chunk_rodata", "safe/init_rodata", "safe/tuner_agreed"] {
        let o = load(name);
        assert!(
            o.maps.iter().any(|m| m.name.starts_with(".rodata")) || name == "safe/tuner_agreed"
        );
        for p in &o.programs {
            verify(p, &map_infos(&o.maps), Limits::default())
                .unwrap_or_else(|e| panic!("{name}/{}: {e}", p.name));
        }
    }
}
