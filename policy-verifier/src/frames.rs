//! Copy-on-write call frames and stacks: what makes a stored state cheap.
//!
//! Exploration stores a copy of the state at every pruning point it does not prune. Most of a
//! state does not change between two pruning points: the callers' frames not at all, the
//! current frame's 64 stack slots in a few places. So a state's frames are shared
//! ([`Frames`]: each frame behind an [`Rc`]), and so is each frame's stack, in pieces of 8
//! slots ([`Stack`]); storing a state copies a few pointers, and the path that goes on copies
//! a frame (its registers), or a piece of a stack, only when it first writes it
//! ([`Rc::make_mut`]). Reads and writes look as they did on plain values:
//! `st.frames[k].stack[j]`, `st.frames.iter_mut()`, `f.stack.iter()`.
//!
//! Writing through `iter_mut` or `IndexMut` counts as writing (it unshares) even when nothing
//! changes; code on a hot path that may leave a frame as it was reads first.

use crate::state::{Frame, SLOTS, Slot};
use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::ops::{Index, IndexMut};
use std::rc::Rc;

/// A value states share, with the number of held states ([`crate::budget::Ledger`]) that
/// refer to it: the ledger counts its bytes while that number is not 0. A copy (what
/// [`Rc::make_mut`] makes for the writer) is a new value that no held state refers to.
#[derive(Debug)]
pub struct Held<T> {
    value: T,
    held: Cell<u32>,
}

impl<T> Held<T> {
    fn new(value: T) -> Held<T> {
        Held {
            value,
            held: Cell::new(0),
        }
    }

    /// One more held state refers to it: whether it is the first.
    pub fn hold(&self) -> bool {
        let n = self.held.get() + 1;
        self.held.set(n);
        n == 1
    }

    /// One held state fewer refers to it: whether it was the last.
    pub fn release(&self) -> bool {
        let n = self.held.get().saturating_sub(1);
        self.held.set(n);
        n == 0
    }
}

impl<T: Clone> Clone for Held<T> {
    fn clone(&self) -> Held<T> {
        Held::new(self.value.clone())
    }
}

impl<T> Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Held<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: PartialEq> PartialEq for Held<T> {
    fn eq(&self, o: &Held<T>) -> bool {
        self.value == o.value
    }
}

impl<T: Eq> Eq for Held<T> {}

impl<T: Hash> Hash for Held<T> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.value.hash(h)
    }
}

/// Slots per shared piece of a stack: a write copies its piece, 8 slots, not the stack.
pub const CHUNK: usize = 4;
type Chunk = [Slot; CHUNK];

/// A frame's stack slots, in pieces of [`CHUNK`] slots each shared until written. Indexed like
/// the array of [`SLOTS`] slots it stands for: `stack[k]`, `stack.get(k)`,
/// `stack.get(lo..=hi)`, `stack.iter()`, `stack.iter_mut()`.
#[derive(Clone, Debug)]
pub struct Stack([Rc<Held<Chunk>>; SLOTS / CHUNK]);

impl Stack {
    pub fn new() -> Stack {
        let empty = Rc::new(Held::new([Slot::EMPTY; CHUNK]));
        Stack(std::array::from_fn(|_| empty.clone()))
    }

    pub fn len(&self) -> usize {
        SLOTS
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Slot> {
        self.0.iter().flat_map(|c| c.iter())
    }

    /// Every slot, writable (every piece unshared: [`Stack::update`] unshares only the
    /// pieces it changes).
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Slot> {
        self.0
            .iter_mut()
            .flat_map(|c| Rc::make_mut(c).value.iter_mut())
    }

    /// Runs `f` on the slots `which` selects (by index and value), unsharing only the pieces
    /// that hold one.
    pub fn update_where(
        &mut self,
        which: impl Fn(usize, &Slot) -> bool,
        mut f: impl FnMut(&mut Slot),
    ) {
        for (p, piece) in self.0.iter_mut().enumerate() {
            if piece
                .iter()
                .enumerate()
                .any(|(k, s)| which(p * CHUNK + k, s))
            {
                for (k, s) in Rc::make_mut(piece).iter_mut().enumerate() {
                    if which(p * CHUNK + k, s) {
                        f(s);
                    }
                }
            }
        }
    }

    /// Runs `f` on every slot (with its index), writing back only the slots it changed.
    pub fn update(&mut self, mut f: impl FnMut(usize, &mut Slot)) {
        for (p, piece) in self.0.iter_mut().enumerate() {
            if let Some(slots) = Rc::get_mut(piece) {
                for (k, s) in slots.iter_mut().enumerate() {
                    f(p * CHUNK + k, s);
                }
                continue;
            }
            for k in 0..CHUNK {
                let mut s = piece[k];
                f(p * CHUNK + k, &mut s);
                if s != piece[k] {
                    Rc::make_mut(piece)[k] = s;
                }
            }
        }
    }

    /// Slot `k` (`usize`), or the slots of a range (`lo..=hi`), if in the stack.
    pub fn get<I: SlotIndex>(&self, i: I) -> Option<I::Out<'_>> {
        i.get(self)
    }

    pub fn get_mut(&mut self, k: usize) -> Option<&mut Slot> {
        (k < SLOTS).then(|| &mut self[k])
    }

    /// Its pieces, as [`crate::budget`] counts them.
    pub fn pieces(&self) -> impl Iterator<Item = &Held<Chunk>> {
        self.0.iter().map(|c| &**c)
    }
}

/// What [`Stack::get`] takes: a slot's index, or a range of them.
pub trait SlotIndex {
    type Out<'a>;
    fn get(self, s: &Stack) -> Option<Self::Out<'_>>;
}

impl SlotIndex for usize {
    type Out<'a> = &'a Slot;
    fn get(self, s: &Stack) -> Option<&Slot> {
        (self < SLOTS).then(|| &s[self])
    }
}

impl SlotIndex for std::ops::RangeInclusive<usize> {
    type Out<'a> = Slots<'a>;
    fn get(self, s: &Stack) -> Option<Slots<'_>> {
        (self.start() <= self.end() && *self.end() < SLOTS).then_some(Slots {
            stack: s,
            range: self,
        })
    }
}

/// Consecutive slots of a stack ([`Stack::get`] of a range).
pub struct Slots<'a> {
    stack: &'a Stack,
    range: std::ops::RangeInclusive<usize>,
}

impl<'a> Slots<'a> {
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &'a Slot> + use<'a> {
        let stack = self.stack;
        self.range.clone().map(move |k| &stack[k])
    }
}

impl Default for Stack {
    fn default() -> Self {
        Stack::new()
    }
}

impl Index<usize> for Stack {
    type Output = Slot;
    fn index(&self, k: usize) -> &Slot {
        &self.0[k / CHUNK][k % CHUNK]
    }
}

impl IndexMut<usize> for Stack {
    fn index_mut(&mut self, k: usize) -> &mut Slot {
        &mut Rc::make_mut(&mut self.0[k / CHUNK])[k % CHUNK]
    }
}

impl PartialEq for Stack {
    fn eq(&self, o: &Stack) -> bool {
        self.0
            .iter()
            .zip(&o.0)
            .all(|(a, b)| Rc::ptr_eq(a, b) || **a == **b)
    }
}

impl Eq for Stack {}

impl Hash for Stack {
    fn hash<H: Hasher>(&self, h: &mut H) {
        for c in &self.0 {
            c.hash(h);
        }
    }
}

/// A state's call frames, outermost first, each shared until written.
#[derive(Clone, Debug, Default)]
pub struct Frames(Vec<Rc<Held<Frame>>>);

impl Frames {
    pub fn new(f: Frame) -> Frames {
        Frames(vec![Rc::new(Held::new(f))])
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn push(&mut self, f: Frame) {
        self.0.push(Rc::new(Held::new(f)));
    }
    /// The innermost frame, removed (shared with whatever else holds it).
    pub fn pop(&mut self) -> Option<Rc<Held<Frame>>> {
        self.0.pop()
    }
    pub fn last(&self) -> Option<&Frame> {
        self.0.last().map(|f| &f.value)
    }
    pub fn last_mut(&mut self) -> Option<&mut Frame> {
        self.0.last_mut().map(|f| &mut Rc::make_mut(f).value)
    }
    pub fn get(&self, k: usize) -> Option<&Frame> {
        self.0.get(k).map(|f| &f.value)
    }
    pub fn get_mut(&mut self, k: usize) -> Option<&mut Frame> {
        self.0.get_mut(k).map(|f| &mut Rc::make_mut(f).value)
    }
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Frame> + ExactSizeIterator {
        self.0.iter().map(|f| &f.value)
    }
    /// Every frame, writable (each one unshared: [`Frames::update`] unshares only the frames
    /// it changes).
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Frame> + ExactSizeIterator {
        self.0.iter_mut().map(|f| &mut Rc::make_mut(f).value)
    }

    /// Runs `f` on the frames `which` selects (by number and value; each unshared), leaving
    /// the others shared.
    pub fn update_where(
        &mut self,
        which: impl Fn(usize, &Frame) -> bool,
        mut f: impl FnMut(usize, &mut Frame),
    ) {
        for (k, rc) in self.0.iter_mut().enumerate() {
            if which(k, rc) {
                f(k, &mut Rc::make_mut(rc).value);
            }
        }
    }

    /// Runs `f` on every frame (with its number), keeping the frames it leaves as they were
    /// shared. (Stacks: [`Stack::update`] inside `f` unshares only the pieces it changes.)
    pub fn update(&mut self, mut f: impl FnMut(usize, &mut Frame)) {
        for (k, rc) in self.0.iter_mut().enumerate() {
            if let Some(frame) = Rc::get_mut(rc) {
                f(k, frame);
                continue;
            }
            let mut copy = Frame::clone(rc);
            f(k, &mut copy);
            if copy != ***rc {
                *rc = Rc::new(Held::new(copy));
            }
        }
    }
    /// Its frames, as [`crate::budget`] counts them.
    pub fn shared(&self) -> impl Iterator<Item = &Held<Frame>> {
        self.0.iter().map(|f| &**f)
    }
    /// The bytes of the list itself (the frames are counted apart).
    pub fn list_bytes(&self) -> usize {
        self.0.capacity() * size_of::<Rc<Held<Frame>>>()
    }
}

impl Index<usize> for Frames {
    type Output = Frame;
    fn index(&self, k: usize) -> &Frame {
        &self.0[k]
    }
}

impl IndexMut<usize> for Frames {
    fn index_mut(&mut self, k: usize) -> &mut Frame {
        &mut Rc::make_mut(&mut self.0[k]).value
    }
}

impl PartialEq for Frames {
    fn eq(&self, o: &Frames) -> bool {
        self.0.len() == o.0.len()
            && self
                .0
                .iter()
                .zip(&o.0)
                .all(|(a, b)| Rc::ptr_eq(a, b) || **a == **b)
    }
}

impl Eq for Frames {}

impl<'a> IntoIterator for &'a Frames {
    type Item = &'a Frame;
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, Rc<Held<Frame>>>, fn(&Rc<Held<Frame>>) -> &Frame>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|f| &f.value)
    }
}
