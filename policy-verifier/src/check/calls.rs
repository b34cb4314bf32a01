//! Calls: helpers (arguments checked against their prototypes, the map's rights, and the
//! bytes a helper reads), BPF-to-BPF calls (a new frame; r1-r5 passed, r6-r9 kept), and exit.

use super::{Checker, Next, R};
use crate::error::Reject;
use crate::platform::{self, Arg, Ret};
use crate::scalar::Scalar;
use crate::state::{Frame, Reg, RegType, State};
use policy_object::insn::Insn;

impl Checker<'_> {
    pub(super) fn helper_call(&mut self, st: &mut State, id: i32) -> R<()> {
        let h = platform::helper(id).ok_or(Reject::UnknownHelper { id })?;
        if !self.hook.helpers.contains(&id) {
            return Err(Reject::HelperNotAllowed {
                id,
                name: h.name,
                hook: self.hook.section.into(),
                note: self.hook.helper_note,
            });
        }
        let mut map: Option<u16> = None;
        for (k, arg) in h.args.iter().enumerate() {
            let r = (k + 1) as u8;
            let v = self.reg(st, r)?;
            let bad = |expected: &str| Reject::BadHelperArg {
                reg: r,
                helper: h.name,
                expected: expected.into(),
                got: v.type_name().into(),
            };
            match arg {
                Arg::Scalar => {
                    if v.ty != RegType::Scalar {
                        return Err(bad("scalar"));
                    }
                }
                Arg::MapPtr => match v.ty {
                    RegType::MapPtr { map: m } => {
                        let mi = &self.maps[m as usize];
                        if h.writes_map && !mi.writable() {
                            return Err(Reject::MapReadOnly {
                                reg: r,
                                map: mi.name.clone(),
                                scope: mi.scope,
                            });
                        }
                        map = Some(m);
                    }
                    _ => return Err(bad("map_ptr")),
                },
                Arg::MapKey | Arg::MapValue => {
                    let Some(m) = map else {
                        return Err(bad("map_ptr first"));
                    };
                    let m = &self.maps[m as usize];
                    let need = if *arg == Arg::MapKey {
                        m.key_size
                    } else {
                        m.value_size
                    };
                    match v.ty {
                        RegType::Stack { .. } => self.stack_buffer(st, r, v, need)?,
                        RegType::MapValue { map: vm } => {
                            let vmi = &self.maps[vm as usize];
                            self.value_bounds(r, vmi, v, 0, need)?;
                        }
                        RegType::MapValueOrNull { .. } => return Err(Reject::NullDeref { reg: r }),
                        _ => return Err(bad("fp or map_value")),
                    }
                }
            }
        }
        let ret = match h.ret {
            Ret::Scalar => Reg::scalar(Scalar::UNKNOWN),
            Ret::MapValueOrNull => {
                let Some(m) = map else {
                    return Err(Reject::BadInsn {
                        what: format!("helper {} returns a map value but takes no map", h.name),
                    });
                };
                Reg {
                    ty: RegType::MapValueOrNull { map: m },
                    off: 0,
                    v: Scalar::konst(0),
                    id: self.fresh_id(),
                    taint: None,
                }
            }
        };
        let f = st.cur_mut();
        for r in 1..=5 {
            f.regs[r] = Reg::NOT_INIT;
        }
        f.regs[0] = ret;
        Ok(())
    }

    pub(super) fn call(&mut self, pc: usize, st: &mut State, i: &Insn) -> R<Next> {
        if st.frames.len() >= self.limits.max_call_depth {
            return Err(Reject::CallTooDeep {
                depth: self.limits.max_call_depth,
            });
        }
        let mut f = Frame::new(pc + 1);
        let frame_no = st.frames.len() as u8;
        f.regs[10] = Reg::pointer(RegType::Stack { frame: frame_no }, 0);
        for r in 1..=5 {
            f.regs[r] = st.cur().regs[r];
        }
        st.frames.push(f);
        Ok(Next::Go((pc as i64 + 1 + i64::from(i.imm)) as usize))
    }

    pub(super) fn exit(&mut self, st: &mut State) -> R<Next> {
        if st.frames.len() == 1 {
            // The program's return value: a number the hook reads, never a pointer.
            let r0 = self.reg(st, 0)?;
            if r0.ty.is_pointer() {
                return Err(Reject::PointerLeak {
                    reg: 0,
                    what: format!("returning {}", r0.type_name()),
                });
            }
            return Ok(Next::Done);
        }
        // A subprogram's r0 goes back to its caller whatever it holds: a void function leaves
        // in it whatever it last computed there (clang leaves a lookup's map value). Map
        // values, the context and the caller's stack outlive the callee, so those pointers
        // stay usable; a pointer into the callee's own stack dies with its frame: r0 becomes
        // unreadable, and a caller that reads it is refused (`uninit_register`). Nothing else
        // can hold a callee stack pointer past its exit: r1-r5 die at the exit too, r6-r9 are
        // the caller's own, and such a pointer is never stored outside the callee's frame
        // (`stack_write`, maps, the context, helper arguments).
        let callee = st.frame_no();
        let mut r0 = st.cur().regs[0];
        if matches!(r0.ty, RegType::Stack { frame } if frame >= callee) {
            r0 = Reg::NOT_INIT;
        }
        let f = st.frames.pop().expect("callee frame");
        let caller = st.cur_mut();
        for r in 1..=5 {
            caller.regs[r] = Reg::NOT_INIT;
        }
        caller.regs[0] = r0;
        Ok(Next::Go(f.ret_pc))
    }
}
