//! Helpers that several tools share, so that no tool's file imports from another's. As
//! rdma-core keeps them beside its examples: `pingpong` is what the verbs ping-pong tools
//! share (`libibverbs/examples/pingpong.c`), `cm` what the connection-manager tools share
//! (librdmacm's `examples/common.c`).

pub(crate) mod cm;
pub(crate) mod pingpong;
