//! The C layouts and constants of libibverbs that the verbs backend passes across the boundary:
//! rdma-core's `infiniband/verbs.h`, declared once for ferroce in `ferroce-verbs-abi`, which
//! the drop-in libibverbs shares.

pub(crate) use ferroce_verbs_abi::*;
