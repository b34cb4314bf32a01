//! NCCL's names for collectives, algorithms and protocols (the numbering of
//! `ncclnet_headers::tuner` and `ncclnet_headers::NcclFunc`, as a tuner policy sees it).

use ncclnet_headers::NcclFunc;
use ncclnet_headers::tuner::{Algo, Proto};

/// The collectives NCCL asks a tuner about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Coll {
    Broadcast,
    Reduce,
    #[value(name = "allgather", aliases = ["all_gather", "all-gather"])]
    AllGather,
    #[value(name = "reducescatter", aliases = ["reduce_scatter", "reduce-scatter"])]
    ReduceScatter,
    #[value(name = "allreduce", aliases = ["all_reduce", "all-reduce"])]
    AllReduce,
}

impl Coll {
    /// `ncclFunc_t`, what the policy reads as `ctx->coll_type`.
    pub fn func(self) -> NcclFunc {
        match self {
            Coll::Broadcast => NcclFunc::BROADCAST,
            Coll::Reduce => NcclFunc::REDUCE,
            Coll::AllGather => NcclFunc::ALL_GATHER,
            Coll::ReduceScatter => NcclFunc::REDUCE_SCATTER,
            Coll::AllReduce => NcclFunc::ALL_REDUCE,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllGather => "allgather",
            Coll::ReduceScatter => "reducescatter",
            Coll::AllReduce => "allreduce",
        }
    }
}

/// What a policy wrote into `algo` or `proto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// -1: NCCL keeps its own.
    Nccl,
    Named(&'static str),
    /// Out of range: the tuner ignores the policy's algorithm and protocol.
    Invalid(i32),
}

impl Choice {
    pub fn algo(v: i32) -> Choice {
        let names = [
            (Algo::TREE, "TREE"),
            (Algo::RING, "RING"),
            (Algo::COLLNET_DIRECT, "COLLNET_DIRECT"),
            (Algo::COLLNET_CHAIN, "COLLNET_CHAIN"),
            (Algo::NVLS, "NVLS"),
            (Algo::NVLS_TREE, "NVLS_TREE"),
            (Algo::PAT, "PAT"),
        ];
        if v == Algo::UNDEF.0 {
            return Choice::Nccl;
        }
        names
            .iter()
            .find(|(a, _)| a.0 == v)
            .map_or(Choice::Invalid(v), |(_, n)| Choice::Named(n))
    }

    pub fn proto(v: i32) -> Choice {
        let names = [
            (Proto::LL, "LL"),
            (Proto::LL128, "LL128"),
            (Proto::SIMPLE, "SIMPLE"),
        ];
        if v == Proto::UNDEF.0 {
            return Choice::Nccl;
        }
        names
            .iter()
            .find(|(p, _)| p.0 == v)
            .map_or(Choice::Invalid(v), |(_, n)| Choice::Named(n))
    }

    /// For tables.
    pub fn text(self) -> String {
        match self {
            Choice::Nccl => NCCLS_CHOICE.into(),
            Choice::Named(n) => n.into(),
            Choice::Invalid(v) => format!("invalid ({v})"),
        }
    }

    /// For JSON: the name, `null` for NCCL's choice, `"invalid"`.
    pub fn json(self) -> serde_json::Value {
        match self {
            Choice::Nccl => serde_json::Value::Null,
            Choice::Named(n) => n.into(),
            Choice::Invalid(_) => "invalid".into(),
        }
    }
}

pub const NCCLS_CHOICE: &str = "NCCL's choice";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_ncclbpf_h() {
        assert_eq!(Choice::algo(-1), Choice::Nccl);
        assert_eq!(Choice::algo(0), Choice::Named("TREE"));
        assert_eq!(Choice::algo(1), Choice::Named("RING"));
        assert_eq!(Choice::algo(6), Choice::Named("PAT"));
        assert_eq!(Choice::algo(7), Choice::Invalid(7));
        assert_eq!(Choice::proto(2), Choice::Named("SIMPLE"));
        assert_eq!(Choice::proto(-2), Choice::Invalid(-2));
        assert_eq!(Coll::AllReduce.func().0, 4);
        assert_eq!(Coll::Broadcast.func().0, 0);
    }
}
