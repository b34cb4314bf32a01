//! The tuner plugin: on every collective NCCL asks for an algorithm, a protocol and a channel
//! count; a verified BPF program (`SEC("tuner")`) answers from the message size, the
//! communicator's shape and the maps the net hooks fill.
//!
//! * [`ffi`]: `ncclTunerPlugin_v2` … `v6` (exported by the plugin library, which links this
//!   crate), panic guards; a tuner never returns an error to NCCL;
//! * [`decide`]: building the program's context and writing its answer into NCCL's cost table;
//! * [`policy`]: the process-wide policy (`NCCL_BPF_TUNER_POLICY`);
//! * [`constants`]: `tuner/init`, a policy's corrections to NCCL's cost-model constants;
//! * [`chunk`]: `tuner/chunk`, a policy's chunk size (`getChunkSize`);
//! * [`rules`]: NCCL's tuner rules files (`NCCL_TUNER_CONFIG_FILE`), parsed strictly and
//!   installed into the `tuner_rules` map of a policy that has one (`policies/src/rules.c`);
//! * [`digest`]: the running digest of a context's decisions, and [`sequence`]: their
//!   sequence numbers, published in the `ncclbpf_decisions` map for `ncclbpf decisions
//!   --compare`;
//! * [`agree`]: the agreement between the ranks of a communicator (epoch records, agreed maps,
//!   the `tuner/epoch` program), built on `ncclbpf-agreement`;
//! * [`stage`]: staged tuner swaps, a new program from a stated sequence number of every
//!   communicator (`ncclbpf reload --at-seq`);
//! * [`control`]: the tuner's part of the control socket, which the host runs
//!   (`ncclbpf_host`): staged swaps and config updates, contexts for `ncclbpf status`.
//!
//! Every context holds the host (`ncclbpf_host::acquire`) from `init` to `finalize`: a process
//! where NCCL loaded only the tuner still gets the control socket and the metrics endpoint.

pub mod agree;
pub mod chunk;
pub mod constants;
pub mod control;
pub mod decide;
pub mod digest;
pub mod ffi;
pub mod owner;
pub mod policy;
pub mod rules;
pub mod sequence;
pub mod stage;

/// `tlog!(INFO, TUNING, "format", args...)`: a line prefixed `TUNER/BPF` in NCCL's log.
#[macro_export]
macro_rules! tlog {
    ($level:ident, $subsys:ident, $($arg:tt)*) => {
        ::ncclnet_headers::log::log(
            "TUNER/BPF",
            ::ncclnet_headers::LogLevel::$level,
            ::ncclnet_headers::LogSubsys::$subsys,
            file!(),
            line!(),
            &format!($($arg)*),
        )
    };
}
