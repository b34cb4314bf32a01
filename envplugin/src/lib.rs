//! NCCL env plugin (being written).
