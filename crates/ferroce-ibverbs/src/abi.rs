//! The C layouts and constants of rdma-core's libibverbs that this library hands to programs:
//! declared once for ferroce in `ferroce-verbs-abi` (whole, every slot named, sizes and
//! offsets asserted), which the verbs backend of `ferroce` shares.

pub(crate) use ferroce_verbs_abi::*;
