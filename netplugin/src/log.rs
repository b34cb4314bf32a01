//! Logging of the net plugin through NCCL's logger (see [`ncclnet_headers::log`]).

pub use ncclnet_headers::log::set_logger;

/// `nlog!(WARN, NET, "format", args...)`: a line prefixed `NET/BPF` in NCCL's log.
#[macro_export]
macro_rules! nlog {
    ($level:ident, $subsys:ident, $($arg:tt)*) => {
        ::ncclnet_headers::log::log(
            "NET/BPF",
            ::ncclnet_headers::LogLevel::$level,
            ::ncclnet_headers::LogSubsys::$subsys,
            file!(),
            line!(),
            &format!($($arg)*),
        )
    };
}
