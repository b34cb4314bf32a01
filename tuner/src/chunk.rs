//! `tuner/chunk`: a policy may change the chunk size NCCL computed for a collective (tuner ABI
//! v6 `getChunkSize`, NCCL >= 2.30), once the algorithm, protocol and channel count are fixed.
//!
//! NCCL clamps what it gets to its buffer's maximum chunk and rounds it down to the protocol's
//! grain (`ncclProtoGrainSize`: LL 16 B, LL128 1920 B, Simple 512 B); a value below the grain
//! would round to 0, so the runtime keeps NCCL's chunk for those (and for 0, "no opinion").
//! Sender and receiver walk the buffer in chunks, so every rank must compute the same chunk
//! for the same collective: the context holds only what is the same on every rank.

use policy_runtime::{LoadedProgram, TunerChunkCtx};

/// `ncclProtoGrainSize` (NCCL's `device.h`): the unit NCCL rounds a chunk down to.
pub fn grain(proto: i32) -> Option<u64> {
    match proto {
        0 => Some(16),
        1 => Some(1920),
        2 => Some(512),
        _ => None,
    }
}

/// What NCCL told us about the collective whose chunk is being sized.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkQuery {
    pub comm_id: u64,
    pub coll_type: u32,
    pub n_bytes: u64,
    pub algo: i32,
    pub proto: i32,
    pub nchannels: u32,
    pub nranks: u32,
    pub nnodes: u32,
}

/// What became of the policy's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkOutcome {
    /// The policy left NCCL's chunk (wrote nothing, the same value, or 0).
    Kept,
    /// NCCL's chunk replaced.
    Changed { from: u64, to: u64 },
    /// The policy's value was under the protocol's grain (or the protocol is unknown): NCCL's
    /// chunk kept.
    Refused { value: u64 },
}

/// Runs `prog` for `q`, updating `*chunk` when its answer is usable.
pub fn run_chunk(prog: &LoadedProgram, q: &ChunkQuery, chunk: &mut usize) -> ChunkOutcome {
    let mut ctx = TunerChunkCtx {
        msg_size: q.n_bytes,
        comm_id: q.comm_id,
        coll_type: q.coll_type,
        algo: q.algo,
        proto: q.proto,
        nchannels: q.nchannels,
        nranks: q.nranks,
        nnodes: q.nnodes,
        chunk_size: *chunk as u64,
    };
    prog.run(&mut ctx);
    let (from, to) = (*chunk as u64, ctx.chunk_size);
    if to == from || to == 0 {
        return ChunkOutcome::Kept;
    }
    match grain(q.proto) {
        Some(g) if to >= g && to <= usize::MAX as u64 => {
            *chunk = to as usize;
            ChunkOutcome::Changed { from, to }
        }
        _ => ChunkOutcome::Refused { value: to },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grains_are_nccls() {
        assert_eq!(grain(0), Some(16));
        // WARP_SIZE * NCCL_LL128_SHMEM_ELEMS_PER_THREAD / NCCL_LL128_LINEELEMS
        //   * NCCL_LL128_DATAELEMS * sizeof(uint64_t) = 32 * 8 / 16 * 15 * 8
        assert_eq!(grain(1), Some(32 * 8 / 16 * 15 * 8));
        assert_eq!(grain(2), Some(512));
        assert_eq!(grain(3), None);
        assert_eq!(grain(-1), None);
    }
}
