//! Frames from a sensor bridge (Hololink's `RoceReceiverInterfaceV2`): the receiver
//! that takes frames into a ring of pages, the device side that sends them as a bridge does,
//! and the bridge's control protocol that programs one for the other.
//!
//! - [`Receiver`] answers Hololink's `RoceReceiverInterfaceV2`: `start`, `blocking_monitor`,
//!   `close`, `next_frame`,
//!   `frames_ready`, `set_frame_ready`, `receive_path_failed` and the accessors. Unlike the
//!   bridge's own software receivers it checks the ICRC, the queue pair, the key, the source
//!   address and the page of every packet, counts each refusal by name, tells several streams
//!   on one port apart by queue pair, reports per frame what was lost, and recovers from a
//!   failed receive path with a fresh `start`.
//! - [`Sender`] is the device side: UC RDMA WRITE ONLY packets with a RETH each, a WRITE ONLY
//!   WITH IMMEDIATE ending each frame with the metadata block, PSNs continuous across frames,
//!   pages in rotation, the ICRC over IP ID 0.
//! - [`control`] speaks the bridge's register protocol (UDP 8192): a client that programs a
//!   device's data channel for a receiver, and the register map a [`Sender`] serves.

pub mod control;
mod metadata;
mod receiver;
mod sender;

pub use metadata::{round_up, ImmediateLayout, Metadata, FLAG_EARLY_END, METADATA_SIZE};
pub use receiver::{
    FrameCounters, FrameInfo, FrameReadError, FrameView, MonitorError, NotStarted, Receiver,
    ReceiverConfig, StartError, ViewMemory, BRIDGE_DATA_PORT, MAX_PAGES,
};
pub use sender::{FrameSent, Pattern, PatternCrcs, SendError, Sender, Taken, Target};
