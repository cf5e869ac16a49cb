//! The request/reply session (Catalyst's `TransportSession`): a controller offloads
//! requests to a coprocessor and lives by the round-trip time.
//!
//! Both roles walk Catalyst's lifecycle, in this order:
//!
//! 1. `connect` — the out-of-band TCP connection (the controller dials, the coprocessor
//!    listens), a versioned hello, the queue pairs' endpoints, and the queue pair to RTS;
//! 2. `alloc_memory` — host memory, registered with the session's NIC; or device memory
//!    (CUDA with the `cuda` feature, or any [`DeviceMemory`] through `alloc_device_memory`),
//!    staged in registered host memory and kept in step with it;
//! 3. `exchange_keys` — each side advertises its region and learns the peer's;
//! 4. `establish_channel` — the slots, request and reply sizes (both sides must agree);
//! 5. on the coprocessor, `set_coprocessor_fn` (on copies of the messages in host memory), or
//!    for a region with device memory `set_device_coprocessor_fn`, whose function works on the
//!    request where it lies in the device memory and leaves its reply there ([`DeviceCall`]);
//! 6. `start`, then `submit`/`collect` as often as needed, then `stop`.
//!
//! Requests and replies are RDMA WRITEs with immediate: the controller writes a request into a
//! request slot of the coprocessor's region, the coprocessor's serving thread runs the function
//! on it and writes the reply into the same-numbered reply slot of the controller's region;
//! the immediate names the slot. Up to [`ChannelDesc::slots`] requests are in flight at once.
//!
//! A controller, with its coprocessor on another host (or thread):
//!
//! ```no_run
//! use ferroce::session::{ChannelDesc, ConnectInfo, Controller, MemoryKind};
//! # fn main() -> Result<(), ferroce::session::SessionError> {
//! let info = ConnectInfo::new("10.0.0.1".parse().unwrap(), "10.0.0.2:19500".parse().unwrap());
//! let desc = ChannelDesc::new(8, 4096, 4096);
//! let s = Controller::new().connect(&info)?;
//! let (s, mem) = s.alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)?;
//! let (s, peer) = s.exchange_keys(&mem)?;
//! let mut s = s.establish_channel(&desc, &mem, &peer)?.start()?;
//! let id = s.submit(b"work")?;
//! let mut reply = [0u8; 4096];
//! let got = s.collect(&mut [&mut reply[..]])?;
//! assert_eq!(got.request, id);
//! println!("{} bytes back in {} ns", got.bytes, s.last_rtt_ns());
//! s.stop();
//! # Ok(()) }
//! ```
//!
//! and its coprocessor:
//!
//! ```no_run
//! use ferroce::session::{ChannelDesc, ConnectInfo, Coprocessor, MemoryKind};
//! # fn main() -> Result<(), ferroce::session::SessionError> {
//! let info = ConnectInfo::new("10.0.0.2".parse().unwrap(), "10.0.0.2:19500".parse().unwrap());
//! let desc = ChannelDesc::new(8, 4096, 4096);
//! let s = Coprocessor::new().connect(&info)?;
//! let (s, mem) = s.alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)?;
//! let (s, peer) = s.exchange_keys(&mem)?;
//! let mut s = s
//!     .establish_channel(&desc, &mem, &peer)?
//!     .set_coprocessor_fn(|request: &[u8], reply: &mut [u8]| {
//!         reply[..request.len()].copy_from_slice(request);
//!         Ok(request.len())
//!     })?
//!     .start()?;
//! // The session serves on a thread of its own; `collect` here reports what it served, until
//! // the controller stops.
//! let mut seen = [0u8; 4096];
//! while s.collect(&mut [&mut seen[..]]).is_ok() {}
//! s.stop();
//! # Ok(()) }
//! ```
//!
//! The order is enforced twice. Rust callers use [`Controller`] and [`Coprocessor`], whose
//! every step consumes the session and returns it in its next state, so a call out of order
//! does not compile:
//!
//! ```compile_fail
//! use ferroce::session::Controller;
//! // `start` before `connect`: a `Controller<New>` has no `start`.
//! let running = Controller::new().start();
//! ```
//!
//! ```compile_fail
//! use ferroce::session::{ChannelDesc, Coprocessor, ConnectInfo};
//! # fn f(info: ConnectInfo) -> Result<(), ferroce::session::SessionError> {
//! let c = Coprocessor::new().connect(&info)?;
//! let (c, mem) = c.alloc_memory(4096, Default::default())?;
//! let (c, peer) = c.exchange_keys(&mem)?;
//! let c = c.establish_channel(&ChannelDesc::new(1, 64, 64), &mem, &peer)?;
//! // `start` before `set_coprocessor_fn`: an established coprocessor has no `start`.
//! let c = c.start()?;
//! # Ok(()) }
//! ```
//!
//! Dynamic callers (a trait object, a future C API) use [`AnySession`] through the [`Session`]
//! trait: every call checks the order at run time and answers
//! [`SessionError::OutOfOrder`], which names the step that is missing.
//!
//! A coprocessor function that returns an error or panics (the panic is caught) answers its
//! request with an error reply: the controller's `collect` returns
//! [`SessionError::CoprocessorFailed`] or [`SessionError::CoprocessorPanicked`], and the
//! serving thread goes on. A peer that goes away — says bye, closes its connection, or falls
//! silent for [`ConnectInfo::peer_timeout`] — turns waiting calls into
//! [`SessionError::PeerGone`]; nothing waits forever.

mod checked;
mod handshake;
mod types;
mod watchdog;

use std::time::Duration;

use self::checked::{CheckedSession, Function};
pub use self::handshake::{hello_line, parse_hello, SESSION_VERSION};
pub use self::types::{
    ChannelDesc, Collected, ConnectInfo, CoprocessorFn, DeviceCall, DeviceCoprocessorFn, MemRegion,
    MemoryKind, PeerRef, RequestId, Role, SessionError, Step, MAX_MESSAGE, MAX_SLOTS,
};
use crate::device::DeviceMemory;

/// The lifecycle as one object-safe trait, every call checked at run time: for trait objects
/// and foreign callers. [`AnySession`] implements it.
pub trait Session: Send {
    /// This session's role.
    fn role(&self) -> Role;

    /// Catalyst's `connect`: opens the NIC on `info.nic`, the out-of-band connection, and
    /// takes the queue pair to RTS.
    ///
    /// # Errors
    ///
    /// [`SessionError::AlreadyDone`] the second time; [`SessionError::Nic`],
    /// [`SessionError::Timeout`] (no peer), [`SessionError::Version`],
    /// [`SessionError::RoleMismatch`] and the I/O errors otherwise.
    fn connect(&mut self, info: &ConnectInfo) -> Result<(), SessionError>;

    /// Catalyst's `alloc_memory`: `size` bytes of `kind`, registered.
    ///
    /// # Errors
    ///
    /// [`SessionError::OutOfOrder`] before `connect`, [`SessionError::Unsupported`] for CUDA
    /// memory, [`SessionError::Allocation`] and [`SessionError::Region`] (the memlock limit)
    /// when the memory cannot be had.
    fn alloc_memory(&mut self, size: usize, kind: MemoryKind) -> Result<MemRegion, SessionError>;

    /// Instead of `alloc_memory`: registers host staging for `memory`, device memory the
    /// application allocated, and keeps the two in step as for [`MemoryKind::Cuda`].
    ///
    /// # Errors
    ///
    /// As `alloc_memory`.
    fn alloc_device_memory(
        &mut self,
        memory: std::sync::Arc<dyn DeviceMemory>,
    ) -> Result<MemRegion, SessionError>;

    /// Catalyst's `exchange_keys`: advertises `local`, returns the peer's region.
    ///
    /// # Errors
    ///
    /// [`SessionError::OutOfOrder`] before `connect`, [`SessionError::ForeignRegion`],
    /// [`SessionError::TooLate`] after `establish_channel`, and the exchange's errors.
    fn exchange_keys(&mut self, local: &MemRegion) -> Result<PeerRef, SessionError>;

    /// Catalyst's `establish_channel`: posts the receives, agrees on `desc` with the peer and
    /// starts the heartbeats.
    ///
    /// # Errors
    ///
    /// [`SessionError::OutOfOrder`] before `exchange_keys`, [`SessionError::InvalidArgument`]
    /// for a bad description, [`SessionError::RegionTooSmall`],
    /// [`SessionError::ChannelMismatch`].
    fn establish_channel(
        &mut self,
        desc: &ChannelDesc,
        local: &MemRegion,
        peer: &PeerRef,
    ) -> Result<(), SessionError>;

    /// Catalyst's `set_coprocessor_fn`, before `start`.
    ///
    /// # Errors
    ///
    /// [`SessionError::WrongRole`] on a controller, [`SessionError::OutOfOrder`] before
    /// `establish_channel`, [`SessionError::TooLate`] after `start`.
    fn set_coprocessor_fn(&mut self, function: Box<CoprocessorFn>) -> Result<(), SessionError>;

    /// Instead of `set_coprocessor_fn`, for a region with device memory: a function that
    /// works on the request where it lies in the device memory and leaves its reply there.
    ///
    /// # Errors
    ///
    /// Those of `set_coprocessor_fn`, and [`SessionError::InvalidArgument`] when the
    /// channel's region has no device memory.
    fn set_device_coprocessor_fn(
        &mut self,
        function: Box<DeviceCoprocessorFn>,
    ) -> Result<(), SessionError>;

    /// Catalyst's `start`: returns at once; the coprocessor's serving thread serves until
    /// `stop`.
    ///
    /// # Errors
    ///
    /// [`SessionError::OutOfOrder`] naming the first missing step, [`SessionError::AlreadyDone`].
    fn start(&mut self) -> Result<(), SessionError>;

    /// Submits a request (controller only): copies it into a free slot and WRITEs it to the
    /// coprocessor; returns its number.
    ///
    /// # Errors
    ///
    /// [`SessionError::OutOfOrder`] before `start`, [`SessionError::WrongRole`],
    /// [`SessionError::RequestTooLarge`], [`SessionError::NoFreeSlot`],
    /// [`SessionError::PeerGone`], [`SessionError::Transport`].
    fn submit(&mut self, request: &[u8]) -> Result<RequestId, SessionError>;

    /// Catalyst's `collect`: waits for a result and scatters it over `replies`, in order;
    /// returns the bytes written. On the controller, the oldest reply that has arrived; on
    /// the coprocessor, the next request served, with the reply it sent (the last 64 are
    /// kept).
    ///
    /// # Errors
    ///
    /// [`SessionError::ReplyTooLarge`] when the buffers are too small (the reply stays);
    /// [`SessionError::CoprocessorFailed`] and [`SessionError::CoprocessorPanicked`] for an
    /// error reply; [`SessionError::NothingInFlight`] on a controller with no request out;
    /// [`SessionError::PeerGone`]; [`SessionError::OutOfOrder`] before `start`.
    fn collect(&mut self, replies: &mut [&mut [u8]]) -> Result<Collected, SessionError>;

    /// Catalyst's `stop`: stops the serving thread, says bye to the peer and joins.
    /// Idempotent.
    fn stop(&mut self);

    /// Catalyst's `last_rtt_ns`: on the controller, from posting the last collected request
    /// to its reply's arrival; on the coprocessor, from posting the last reply to its
    /// acknowledgement. 0 before the first.
    fn last_rtt_ns(&self) -> u64;
}

/// A session of either role for dynamic use: every call of [`Session`] checks the order at
/// run time.
#[derive(Debug)]
pub struct AnySession {
    session: CheckedSession,
}

impl AnySession {
    /// A controller that has taken no step.
    #[must_use]
    pub fn controller() -> Self {
        Self {
            session: CheckedSession::new(Role::Controller),
        }
    }

    /// A coprocessor that has taken no step.
    #[must_use]
    pub fn coprocessor() -> Self {
        Self {
            session: CheckedSession::new(Role::Coprocessor),
        }
    }

    /// Like `collect`, giving up after `timeout` with [`SessionError::Timeout`].
    ///
    /// # Errors
    ///
    /// Those of [`Session::collect`], and the timeout.
    pub fn collect_timeout(
        &mut self,
        replies: &mut [&mut [u8]],
        timeout: Duration,
    ) -> Result<Collected, SessionError> {
        self.session.collect(replies, Some(timeout))
    }

    /// How many requests the serving thread has served: 0 on a controller, and before
    /// `start`.
    #[must_use]
    pub fn served(&self) -> u64 {
        self.session.served()
    }

    /// Why the peer is gone, once the watchdog has noticed; `None` before `start`.
    #[must_use]
    pub fn peer_gone(&self) -> Option<String> {
        self.session.peer_gone()
    }
}

impl Session for AnySession {
    fn role(&self) -> Role {
        self.session.role()
    }

    fn connect(&mut self, info: &ConnectInfo) -> Result<(), SessionError> {
        self.session.connect(info)
    }

    fn alloc_memory(&mut self, size: usize, kind: MemoryKind) -> Result<MemRegion, SessionError> {
        self.session.alloc_memory(size, kind)
    }

    fn alloc_device_memory(
        &mut self,
        memory: std::sync::Arc<dyn DeviceMemory>,
    ) -> Result<MemRegion, SessionError> {
        self.session.alloc_device_memory(memory)
    }

    fn exchange_keys(&mut self, local: &MemRegion) -> Result<PeerRef, SessionError> {
        self.session.exchange_keys(local)
    }

    fn establish_channel(
        &mut self,
        desc: &ChannelDesc,
        local: &MemRegion,
        peer: &PeerRef,
    ) -> Result<(), SessionError> {
        self.session.establish_channel(desc, local, peer)
    }

    fn set_coprocessor_fn(&mut self, function: Box<CoprocessorFn>) -> Result<(), SessionError> {
        self.session.set_coprocessor_fn(Function::Host(function))
    }

    fn set_device_coprocessor_fn(
        &mut self,
        function: Box<DeviceCoprocessorFn>,
    ) -> Result<(), SessionError> {
        self.session.set_coprocessor_fn(Function::Device(function))
    }

    fn start(&mut self) -> Result<(), SessionError> {
        self.session.start()
    }

    fn submit(&mut self, request: &[u8]) -> Result<RequestId, SessionError> {
        self.session.submit(request)
    }

    fn collect(&mut self, replies: &mut [&mut [u8]]) -> Result<Collected, SessionError> {
        self.session.collect(replies, None)
    }

    fn stop(&mut self) {
        self.session.stop();
    }

    fn last_rtt_ns(&self) -> u64 {
        self.session.last_rtt_ns()
    }
}

/// The typestates of [`Controller`] and [`Coprocessor`]: each step consumes the session in
/// one state and returns it in the next.
pub mod state {
    /// No step taken.
    #[derive(Debug)]
    pub struct New;
    /// `connect` done.
    #[derive(Debug)]
    pub struct Connected;
    /// `alloc_memory` done.
    #[derive(Debug)]
    pub struct Allocated;
    /// `exchange_keys` done.
    #[derive(Debug)]
    pub struct Keyed;
    /// `establish_channel` done.
    #[derive(Debug)]
    pub struct Established;
    /// The coprocessor's function is set.
    #[derive(Debug)]
    pub struct Ready;
    /// `start` done: the session runs until `stop`.
    #[derive(Debug)]
    pub struct Running;
}

use state::{Allocated, Connected, Established, Keyed, New, Ready, Running};

macro_rules! common_steps {
    ($ty:ident) => {
        impl $ty<New> {
            /// Catalyst's `connect`: opens the NIC on `info.nic`, the out-of-band connection,
            /// and takes the queue pair to RTS.
            ///
            /// # Errors
            ///
            /// [`SessionError::Nic`], [`SessionError::Timeout`] (no peer),
            /// [`SessionError::Version`], [`SessionError::RoleMismatch`] and the I/O errors.
            pub fn connect(mut self, info: &ConnectInfo) -> Result<$ty<Connected>, SessionError> {
                self.session.connect(info)?;
                Ok(self.next())
            }
        }

        impl $ty<Connected> {
            /// Catalyst's `alloc_memory`: `size` bytes of `kind`, registered.
            ///
            /// # Errors
            ///
            /// [`SessionError::Unsupported`] for CUDA memory, [`SessionError::Allocation`] and
            /// [`SessionError::Region`] (the memlock limit) when the memory cannot be had.
            pub fn alloc_memory(
                mut self,
                size: usize,
                kind: MemoryKind,
            ) -> Result<($ty<Allocated>, MemRegion), SessionError> {
                let region = self.session.alloc_memory(size, kind)?;
                Ok((self.next(), region))
            }

            /// Instead of `alloc_memory`: registers host staging for `memory`, device memory
            /// the application allocated, and keeps the two in step as for
            /// [`MemoryKind::Cuda`].
            ///
            /// # Errors
            ///
            /// [`SessionError::Allocation`] and [`SessionError::Region`] when the staging
            /// memory cannot be had.
            pub fn alloc_device_memory(
                mut self,
                memory: std::sync::Arc<dyn DeviceMemory>,
            ) -> Result<($ty<Allocated>, MemRegion), SessionError> {
                let region = self.session.alloc_device_memory(memory)?;
                Ok((self.next(), region))
            }
        }

        impl $ty<Allocated> {
            /// Catalyst's `exchange_keys`: advertises `local`, returns the peer's region.
            ///
            /// # Errors
            ///
            /// [`SessionError::ForeignRegion`] and the exchange's errors.
            pub fn exchange_keys(
                mut self,
                local: &MemRegion,
            ) -> Result<($ty<Keyed>, PeerRef), SessionError> {
                let peer = self.session.exchange_keys(local)?;
                Ok((self.next(), peer))
            }
        }

        impl $ty<Keyed> {
            /// Catalyst's `establish_channel`: posts the receives, agrees on `desc` with the
            /// peer and starts the heartbeats.
            ///
            /// # Errors
            ///
            /// [`SessionError::InvalidArgument`] for a bad description,
            /// [`SessionError::RegionTooSmall`], [`SessionError::ChannelMismatch`].
            pub fn establish_channel(
                mut self,
                desc: &ChannelDesc,
                local: &MemRegion,
                peer: &PeerRef,
            ) -> Result<$ty<Established>, SessionError> {
                self.session.establish_channel(desc, local, peer)?;
                Ok(self.next())
            }
        }

        impl<S> $ty<S> {
            fn next<T>(self) -> $ty<T> {
                $ty {
                    session: self.session,
                    state: std::marker::PhantomData,
                }
            }

            /// Catalyst's `last_rtt_ns` (see [`Session::last_rtt_ns`]).
            #[must_use]
            pub fn last_rtt_ns(&self) -> u64 {
                self.session.last_rtt_ns()
            }

            /// Why the peer is gone, once the watchdog has noticed.
            #[must_use]
            pub fn peer_gone(&self) -> Option<String> {
                self.session.peer_gone()
            }

            /// The NIC the session runs on, once `connect` has opened it (not part of
            /// Catalyst's API): its counters ([`Nic::counters`](crate::Nic::counters),
            /// [`Nic::statistics_line`](crate::Nic::statistics_line)) say what the session's
            /// packets met, resends and NAKs included. `None` before `connect`.
            #[must_use]
            pub fn nic(&self) -> Option<&crate::Nic> {
                self.session.nic()
            }
        }

        impl $ty<Running> {
            /// Catalyst's `collect`: waits for a result and scatters it over `replies`;
            /// returns which request and the bytes written (see [`Session::collect`]).
            ///
            /// # Errors
            ///
            /// [`SessionError::ReplyTooLarge`] (the reply stays for a later call),
            /// [`SessionError::CoprocessorFailed`], [`SessionError::CoprocessorPanicked`],
            /// [`SessionError::NothingInFlight`], [`SessionError::PeerGone`].
            pub fn collect(
                &mut self,
                replies: &mut [&mut [u8]],
            ) -> Result<Collected, SessionError> {
                self.session.collect(replies, None)
            }

            /// `collect`, giving up after `timeout` with [`SessionError::Timeout`].
            ///
            /// # Errors
            ///
            /// Those of `collect`, and the timeout.
            pub fn collect_timeout(
                &mut self,
                replies: &mut [&mut [u8]],
                timeout: Duration,
            ) -> Result<Collected, SessionError> {
                self.session.collect(replies, Some(timeout))
            }

            /// Catalyst's `stop`: stops the serving thread, says bye to the peer and joins.
            /// Idempotent; dropping the session stops it too.
            pub fn stop(&mut self) {
                self.session.stop();
            }
        }

        impl Default for $ty<New> {
            fn default() -> Self {
                Self::new()
            }
        }
    };
}

/// The controller (Catalyst's `ControllerSession`), in typestate `S`.
#[derive(Debug)]
pub struct Controller<S = New> {
    session: CheckedSession,
    state: std::marker::PhantomData<S>,
}

/// The coprocessor (Catalyst's `CoprocessorSession`), in typestate `S`.
#[derive(Debug)]
pub struct Coprocessor<S = New> {
    session: CheckedSession,
    state: std::marker::PhantomData<S>,
}

common_steps!(Controller);
common_steps!(Coprocessor);

impl Controller<New> {
    /// A controller that has taken no step.
    #[must_use]
    pub fn new() -> Self {
        Self {
            session: CheckedSession::new(Role::Controller),
            state: std::marker::PhantomData,
        }
    }
}

impl Controller<Established> {
    /// Catalyst's `start`: returns at once. The controller needs no thread of its own: the
    /// NIC's progress thread and the caller's own polling in `collect` move its requests.
    ///
    /// # Errors
    ///
    /// None in practice; the `Result` keeps Catalyst's shape.
    pub fn start(mut self) -> Result<Controller<Running>, SessionError> {
        self.session.start()?;
        Ok(self.next())
    }
}

impl Controller<Running> {
    /// Submits a request: copies it into a free slot and WRITEs it (with immediate) to the
    /// coprocessor's slot; returns its number. Up to [`ChannelDesc::slots`] may be in flight.
    ///
    /// # Errors
    ///
    /// [`SessionError::RequestTooLarge`], [`SessionError::NoFreeSlot`],
    /// [`SessionError::PeerGone`], [`SessionError::Transport`] (an earlier request failed).
    pub fn submit(&mut self, request: &[u8]) -> Result<RequestId, SessionError> {
        self.session.submit(request)
    }
}

impl Coprocessor<New> {
    /// A coprocessor that has taken no step.
    #[must_use]
    pub fn new() -> Self {
        Self {
            session: CheckedSession::new(Role::Coprocessor),
            state: std::marker::PhantomData,
        }
    }
}

impl Coprocessor<Established> {
    /// Catalyst's `set_coprocessor_fn`: the function that turns each request into a reply.
    ///
    /// # Errors
    ///
    /// None in practice; the `Result` keeps Catalyst's shape.
    pub fn set_coprocessor_fn<F>(mut self, function: F) -> Result<Coprocessor<Ready>, SessionError>
    where
        F: FnMut(&[u8], &mut [u8]) -> Result<usize, String> + Send + 'static,
    {
        self.session
            .set_coprocessor_fn(Function::Host(Box::new(function)))?;
        Ok(self.next())
    }

    /// Instead of `set_coprocessor_fn`, for a region with device memory (CUDA, or supplied):
    /// the function gets where the request lies in the device memory and leaves its reply
    /// there, so a kernel can work in place ([`DeviceCall`]).
    ///
    /// # Errors
    ///
    /// [`SessionError::InvalidArgument`] when the channel's region has no device memory.
    pub fn set_device_coprocessor_fn<F>(
        mut self,
        function: F,
    ) -> Result<Coprocessor<Ready>, SessionError>
    where
        F: for<'a> FnMut(DeviceCall<'a>) -> Result<usize, String> + Send + 'static,
    {
        self.session
            .set_coprocessor_fn(Function::Device(Box::new(function)))?;
        Ok(self.next())
    }
}

impl Coprocessor<Ready> {
    /// Catalyst's `start`: starts the serving thread, which serves requests until `stop`.
    ///
    /// # Errors
    ///
    /// [`SessionError::Io`] when the thread cannot be started.
    pub fn start(mut self) -> Result<Coprocessor<Running>, SessionError> {
        self.session.start()?;
        Ok(self.next())
    }
}

impl Coprocessor<Running> {
    /// How many requests the serving thread has served.
    #[must_use]
    pub fn served(&self) -> u64 {
        self.session.served()
    }
}
