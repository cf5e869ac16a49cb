//! The exception hierarchy, and how every typed Rust error becomes one of its classes.
//!
//! Every class derives from `FerroceError`; a few derive from a builtin too, so that code
//! that knows nothing of ferroce still catches them (`Timeout` is a `TimeoutError`,
//! `InvalidArgument` a `ValueError`). Each instance carries the Rust error's message as its
//! only argument, `kind` (the Rust type and variant, such as `"NicError::AddressInUse"`),
//! `errno` (the operating system's error number, where the cause is one) and `seed_code`
//! (neuray's `IRDMA_context` return code, -1 or -2, else `None`).
//!
//! The classes are built at module initialisation with `type(name, bases, dict)`: pyo3's
//! `create_exception!` takes a single base, and a timeout must be both a `FerroceError` and a
//! `TimeoutError`.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use ferroce::frames::{
    control::ControlError, FrameReadError, MonitorError, NotStarted as RustNotStarted, SendError,
    StartError,
};

/// The exception classes, by what they mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The base: anything without a more precise class.
    Base,
    Timeout,
    AddressInUse,
    AddressNotAvailable,
    NotStarted,
    DeviceError,
    InvalidArgument,
    NotSupported,
    RegionError,
    PostError,
    ModifyError,
    TransportError,
    FrameOverwritten,
    ReceivePathFailed,
    Closed,
    SessionError,
    OutOfOrder,
    PeerGone,
    CoprocessorFailed,
    CacheError,
    CmError,
    Rejected,
    Unreachable,
}

/// A class: what it means, its name, its parent (`None`: `FerroceError` itself), a builtin
/// second base, and its doc.
type ClassRow = (
    Class,
    &'static str,
    Option<Class>,
    Option<&'static str>,
    &'static str,
);

const CLASSES: &[ClassRow] = &[
    (Class::Base, "FerroceError", None, None, "Any error of ferroce. `kind` names the Rust error, `errno` the OS error number where there is one."),
    (Class::Timeout, "Timeout", Some(Class::Base), Some("TimeoutError"), "Nothing came in time (also a builtin TimeoutError)."),
    (Class::AddressInUse, "AddressInUse", Some(Class::Base), None, "Another socket holds the address and port."),
    (Class::AddressNotAvailable, "AddressNotAvailable", Some(Class::Base), None, "The address is not one of this host's."),
    (Class::NotStarted, "NotStarted", Some(Class::Base), None, "The call needs start() first."),
    (Class::DeviceError, "DeviceError", Some(Class::Base), None, "A verbs device or device memory refused."),
    (Class::InvalidArgument, "InvalidArgument", Some(Class::Base), Some("ValueError"), "An argument is out of range (also a builtin ValueError)."),
    (Class::NotSupported, "NotSupported", Some(Class::Base), None, "Not supported by this build, backend or host."),
    (Class::RegionError, "RegionError", Some(Class::Base), None, "Memory could not be registered (the locked-memory limit, say)."),
    (Class::PostError, "PostError", Some(Class::Base), None, "A work request could not be posted."),
    (Class::ModifyError, "ModifyError", Some(Class::Base), None, "A queue pair could not be connected or modified."),
    (Class::TransportError, "TransportError", Some(Class::Base), None, "A transfer completed in error (the peer did not answer or refused)."),
    (Class::FrameOverwritten, "FrameOverwritten", Some(Class::Base), None, "The device began writing the frame's page again: the frame is gone."),
    (Class::ReceivePathFailed, "ReceivePathFailed", Some(Class::Base), None, "A fatal event stopped the receive path; start() again to recover."),
    (Class::Closed, "Closed", Some(Class::Base), None, "The object was closed, deregistered or given back."),
    (Class::SessionError, "SessionError", Some(Class::Base), None, "A session call failed."),
    (Class::OutOfOrder, "OutOfOrder", Some(Class::SessionError), None, "A session call came out of the lifecycle's order."),
    (Class::PeerGone, "PeerGone", Some(Class::SessionError), None, "The session's peer stopped, closed its connection or fell silent."),
    (Class::CoprocessorFailed, "CoprocessorFailed", Some(Class::SessionError), None, "The coprocessor function raised, returned an error or panicked."),
    (Class::CacheError, "CacheError", Some(Class::Base), None, "A cache context call failed."),
    (Class::CmError, "CmError", Some(Class::Base), None, "A connection-management call (Listener, ConnectRequest, Connection, resolve_ud) failed."),
    (Class::Rejected, "Rejected", Some(Class::CmError), Some("ConnectionRefusedError"), "The peer refused (a REJ, or a SIDR reply with a failure status); `reason` names why, `reason_code` is its number and `private_data` the bytes the peer sent with it (also a builtin ConnectionRefusedError)."),
    (Class::Unreachable, "Unreachable", Some(Class::CmError), Some("ConnectionError"), "The peer did not answer through every retry (also a builtin ConnectionError)."),
];

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn build(py: Python<'_>) -> PyResult<Vec<Py<PyType>>> {
    let builtins = py.import("builtins")?;
    let make = builtins.getattr("type")?;
    let mut made: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
    for (i, (class, name, parent, builtin, doc)) in CLASSES.iter().enumerate() {
        debug_assert_eq!(*class as usize, i);
        let mut bases: Vec<Bound<'_, PyAny>> = Vec::new();
        match parent {
            Some(p) => bases.push(made[*p as usize].bind(py).clone().into_any()),
            None => bases.push(py.get_type::<PyException>().into_any()),
        }
        if let Some(b) = builtin {
            bases.push(builtins.getattr(*b)?);
        }
        let dict = PyDict::new(py);
        dict.set_item("__doc__", *doc)?;
        dict.set_item("__module__", "ferroce")?;
        dict.set_item("kind", py.None())?;
        dict.set_item("errno", py.None())?;
        dict.set_item("seed_code", py.None())?;
        let ty = make.call1((*name, PyTuple::new(py, bases)?, dict))?;
        made.push(ty.cast_into::<PyType>()?.unbind());
    }
    Ok(made)
}

/// Adds every class to `module`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let types = TYPES.get_or_try_init(py, || build(py))?;
    for ((_, name, ..), ty) in CLASSES.iter().zip(types) {
        module.add(*name, ty.bind(py))?;
    }
    Ok(())
}

/// An error on its way to Python: its class, the Rust error's name and message, and the
/// numbers that go with it.
#[derive(Debug)]
pub(crate) struct Error {
    class: Class,
    kind: &'static str,
    message: String,
    errno: Option<i32>,
    seed_code: Option<i32>,
    /// Further attributes of the instance, by name (a rejection's reason and private data).
    extra: Vec<(&'static str, Extra)>,
}

/// The value of an extra attribute, made into a Python object when the exception is.
#[derive(Debug)]
pub(crate) enum Extra {
    Bytes(Vec<u8>),
    Int(i64),
    Str(String),
}

impl Error {
    pub(crate) fn new(class: Class, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            class,
            kind,
            message: message.into(),
            errno: None,
            seed_code: None,
            extra: Vec::new(),
        }
    }

    /// The error with attribute `name` set to `value` on the exception.
    pub(crate) fn with(mut self, name: &'static str, value: Extra) -> Self {
        self.extra.push((name, value));
        self
    }

    fn with_errno(mut self, source: Option<&std::io::Error>) -> Self {
        self.errno = source.and_then(std::io::Error::raw_os_error);
        self
    }

    /// An argument the binding itself refuses.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Class::InvalidArgument, "InvalidArgument", message)
    }

    /// A use after close, deregister or give-back.
    pub(crate) fn closed(message: impl Into<String>) -> Self {
        Self::new(Class::Closed, "Closed", message)
    }

    /// Something this build or host cannot do.
    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Class::NotSupported, "NotSupported", message)
    }

    fn to_pyerr(&self, py: Python<'_>) -> PyErr {
        let Some(types) = TYPES.get(py) else {
            return PyException::new_err(self.message.clone());
        };
        let ty = types[self.class as usize].bind(py);
        let made = ty.call1((self.message.as_str(),)).and_then(|e| {
            e.setattr("kind", self.kind)?;
            e.setattr("errno", self.errno)?;
            e.setattr("seed_code", self.seed_code)?;
            for (name, value) in &self.extra {
                match value {
                    Extra::Bytes(b) => e.setattr(*name, pyo3::types::PyBytes::new(py, b))?,
                    Extra::Int(i) => e.setattr(*name, *i)?,
                    Extra::Str(t) => e.setattr(*name, t.as_str())?,
                }
            }
            Ok(e)
        });
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        Python::attach(|py| e.to_pyerr(py))
    }
}

impl From<ferroce::NicError> for Error {
    fn from(e: ferroce::NicError) -> Self {
        use ferroce::NicError as E;
        let message = e.to_string();
        match &e {
            E::AddressInUse { .. } => {
                let mut e = Self::new(Class::AddressInUse, "NicError::AddressInUse", message);
                e.errno = Some(libc::EADDRINUSE);
                e
            }
            E::AddressNotAvailable(_) => {
                let mut e = Self::new(
                    Class::AddressNotAvailable,
                    "NicError::AddressNotAvailable",
                    message,
                );
                // What bind(2) said, as an OSError would carry it.
                e.errno = Some(libc::EADDRNOTAVAIL);
                e
            }
            E::Pcap { source, .. } => {
                Self::new(Class::Base, "NicError::Pcap", message).with_errno(Some(source))
            }
            E::Socket { source, .. } => {
                Self::new(Class::Base, "NicError::Socket", message).with_errno(Some(source))
            }
            E::Verbs(_) => Self::new(Class::DeviceError, "NicError::Verbs", message),
            E::OtherNic(_) => Self::new(Class::InvalidArgument, "NicError::OtherNic", message),
            E::SoftOnly(_) => Self::new(Class::NotSupported, "NicError::SoftOnly", message),
            _ => Self::new(Class::Base, "NicError", message),
        }
    }
}

impl From<ferroce::RegionError> for Error {
    fn from(e: ferroce::RegionError) -> Self {
        use ferroce::RegionError as E;
        let message = e.to_string();
        match &e {
            E::Empty => Self::new(Class::InvalidArgument, "RegionError::Empty", message),
            E::OutOfRange { .. } => {
                Self::new(Class::InvalidArgument, "RegionError::OutOfRange", message)
            }
            E::NotRemote => Self::new(Class::InvalidArgument, "RegionError::NotRemote", message),
            E::MemlockLimit { reason, .. } => {
                Self::new(Class::RegionError, "RegionError::MemlockLimit", message)
                    .with_errno(Some(reason))
            }
            E::DmabufUnsupported { .. } => Self::new(
                Class::NotSupported,
                "RegionError::DmabufUnsupported",
                message,
            ),
            E::Device { source, .. } => {
                Self::new(Class::DeviceError, "RegionError::Device", message)
                    .with_errno(Some(source))
            }
            E::Dmabuf { .. } => Self::new(Class::RegionError, "RegionError::Dmabuf", message),
            E::Refused(_) => Self::new(Class::RegionError, "RegionError::Refused", message),
            _ => Self::new(Class::RegionError, "RegionError", message),
        }
    }
}

impl From<ferroce::qp::PostError> for Error {
    fn from(e: ferroce::qp::PostError) -> Self {
        Self::new(Class::PostError, "PostError", e.to_string())
    }
}

impl From<ferroce::proto::qp::ModifyError> for Error {
    fn from(e: ferroce::proto::qp::ModifyError) -> Self {
        Self::new(Class::ModifyError, "ModifyError", e.to_string())
    }
}

impl From<ferroce::device::DeviceError> for Error {
    fn from(e: ferroce::device::DeviceError) -> Self {
        use ferroce::device::DeviceError as E;
        let class = match &e {
            E::OutOfRange { .. } => Class::InvalidArgument,
            _ => Class::DeviceError,
        };
        Self::new(class, "DeviceError", e.to_string())
    }
}

impl From<StartError> for Error {
    fn from(e: StartError) -> Self {
        let message = e.to_string();
        match e {
            StartError::AlreadyStarted => {
                Self::new(Class::Base, "StartError::AlreadyStarted", message)
            }
            StartError::Invalid { .. } => {
                Self::new(Class::InvalidArgument, "StartError::Invalid", message)
            }
            StartError::Region(r) => Self {
                message,
                ..Self::from(r)
            },
            StartError::Qp(_) => Self::new(Class::Base, "StartError::Qp", message),
            StartError::Device(_) => Self::new(Class::DeviceError, "StartError::Device", message),
            _ => Self::new(Class::Base, "StartError", message),
        }
    }
}

impl From<RustNotStarted> for Error {
    fn from(e: RustNotStarted) -> Self {
        Self::new(Class::NotStarted, "NotStarted", e.to_string())
    }
}

impl From<MonitorError> for Error {
    fn from(e: MonitorError) -> Self {
        let message = e.to_string();
        match e {
            MonitorError::NotStarted => {
                Self::new(Class::NotStarted, "MonitorError::NotStarted", message)
            }
            MonitorError::Failed(_) => {
                Self::new(Class::ReceivePathFailed, "MonitorError::Failed", message)
            }
            _ => Self::new(Class::Base, "MonitorError", message),
        }
    }
}

impl From<FrameReadError> for Error {
    fn from(e: FrameReadError) -> Self {
        let message = e.to_string();
        match e {
            FrameReadError::NotStarted => {
                Self::new(Class::NotStarted, "FrameReadError::NotStarted", message)
            }
            FrameReadError::OutOfPage { .. } => {
                Self::new(Class::InvalidArgument, "FrameReadError::OutOfPage", message)
            }
            FrameReadError::Overwritten { .. } => Self::new(
                Class::FrameOverwritten,
                "FrameReadError::Overwritten",
                message,
            ),
            FrameReadError::Device(_) => {
                Self::new(Class::DeviceError, "FrameReadError::Device", message)
            }
            _ => Self::new(Class::Base, "FrameReadError", message),
        }
    }
}

impl From<SendError> for Error {
    fn from(e: SendError) -> Self {
        let message = e.to_string();
        match &e {
            SendError::Target(_) => Self::new(Class::InvalidArgument, "SendError::Target", message),
            SendError::FrameTooLarge { .. } => {
                Self::new(Class::InvalidArgument, "SendError::FrameTooLarge", message)
            }
            SendError::Io { source, .. } => {
                Self::new(Class::Base, "SendError::Io", message).with_errno(Some(source))
            }
            _ => Self::new(Class::Base, "SendError", message),
        }
    }
}

impl From<ControlError> for Error {
    fn from(e: ControlError) -> Self {
        let message = e.to_string();
        match &e {
            ControlError::Io(source) => {
                Self::new(Class::Base, "ControlError::Io", message).with_errno(Some(source))
            }
            ControlError::Timeout { .. } => {
                Self::new(Class::Timeout, "ControlError::Timeout", message)
            }
            ControlError::Refused { .. } => {
                Self::new(Class::DeviceError, "ControlError::Refused", message)
            }
            ControlError::Invalid(_) => {
                Self::new(Class::InvalidArgument, "ControlError::Invalid", message)
            }
            _ => Self::new(Class::Base, "ControlError", message),
        }
    }
}

impl From<ferroce::session::SessionError> for Error {
    fn from(e: ferroce::session::SessionError) -> Self {
        use ferroce::session::SessionError as E;
        let message = e.to_string();
        let (class, kind) = match e {
            E::OutOfOrder { .. } => (Class::OutOfOrder, "SessionError::OutOfOrder"),
            E::AlreadyDone { .. } => (Class::OutOfOrder, "SessionError::AlreadyDone"),
            E::TooLate { .. } => (Class::OutOfOrder, "SessionError::TooLate"),
            E::WrongRole { .. } => (Class::OutOfOrder, "SessionError::WrongRole"),
            E::Stopped { .. } => (Class::Closed, "SessionError::Stopped"),
            E::InvalidArgument(_) => (Class::InvalidArgument, "SessionError::InvalidArgument"),
            E::Unsupported(_) => (Class::NotSupported, "SessionError::Unsupported"),
            E::Device(_) => (Class::DeviceError, "SessionError::Device"),
            E::RegionTooSmall { .. } => (Class::InvalidArgument, "SessionError::RegionTooSmall"),
            E::ChannelMismatch { .. } => (Class::SessionError, "SessionError::ChannelMismatch"),
            E::RequestTooLarge { .. } => (Class::InvalidArgument, "SessionError::RequestTooLarge"),
            E::NoFreeSlot { .. } => (Class::SessionError, "SessionError::NoFreeSlot"),
            E::NothingInFlight => (Class::SessionError, "SessionError::NothingInFlight"),
            E::ReplyTooLarge { .. } => (Class::InvalidArgument, "SessionError::ReplyTooLarge"),
            E::CoprocessorFailed { .. } => {
                (Class::CoprocessorFailed, "SessionError::CoprocessorFailed")
            }
            E::CoprocessorPanicked { .. } => (
                Class::CoprocessorFailed,
                "SessionError::CoprocessorPanicked",
            ),
            E::PeerGone { .. } => (Class::PeerGone, "SessionError::PeerGone"),
            E::Timeout { .. } => (Class::Timeout, "SessionError::Timeout"),
            E::Transport { .. } => (Class::TransportError, "SessionError::Transport"),
            E::Nic(n) => {
                return Self {
                    message,
                    ..Self::from(n)
                }
            }
            E::Region(r) => {
                return Self {
                    message,
                    ..Self::from(r)
                }
            }
            E::Post(_) => (Class::PostError, "SessionError::Post"),
            E::Modify(_) => (Class::ModifyError, "SessionError::Modify"),
            E::Io { ref source, .. } => {
                let errno = source.raw_os_error();
                return Self {
                    errno,
                    ..Self::new(Class::SessionError, "SessionError::Io", message)
                };
            }
            _ => (Class::SessionError, "SessionError"),
        };
        Self::new(class, kind, message)
    }
}

impl From<ferroce::cache::CacheError> for Error {
    fn from(e: ferroce::cache::CacheError) -> Self {
        use ferroce::cache::CacheError as E;
        let message = e.to_string();
        let seed_code = e.seed_code();
        let made = match e {
            E::InvalidParameters(_) => Self::new(
                Class::InvalidArgument,
                "CacheError::InvalidParameters",
                message,
            ),
            E::NotSupported(_) => {
                Self::new(Class::NotSupported, "CacheError::NotSupported", message)
            }
            E::Device(_) => Self::new(Class::DeviceError, "CacheError::Device", message),
            E::Allocation { .. } => {
                Self::new(Class::RegionError, "CacheError::Allocation", message)
            }
            E::TooLargeForRemote { .. } => Self::new(
                Class::InvalidArgument,
                "CacheError::TooLargeForRemote",
                message,
            ),
            E::Transport(_) => Self::new(Class::TransportError, "CacheError::Transport", message),
            E::Timeout { .. } => Self::new(Class::Timeout, "CacheError::Timeout", message),
            E::Closed(_) => Self::new(Class::Closed, "CacheError::Closed", message),
            E::Nic(n) => Self {
                message,
                ..Self::from(n)
            },
            E::Post(_) => Self::new(Class::PostError, "CacheError::Post", message),
            E::Modify(_) => Self::new(Class::ModifyError, "CacheError::Modify", message),
            E::Io { ref source, .. } => {
                Self::new(Class::CacheError, "CacheError::Io", message.clone())
                    .with_errno(Some(source))
            }
            _ => Self::new(Class::CacheError, "CacheError", message),
        };
        Self { seed_code, ..made }
    }
}

impl From<ferroce::nic::FaultsError> for Error {
    fn from(e: ferroce::nic::FaultsError) -> Self {
        Self::new(Class::InvalidArgument, "FaultsError", e.to_string())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::new(Class::Base, "io::Error", e.to_string()).with_errno(Some(&e))
    }
}

impl From<ferroce::cm::CmError> for Error {
    fn from(e: ferroce::cm::CmError) -> Self {
        use ferroce::cm::CmError as E;
        let message = e.to_string();
        match e {
            E::Nic(n) => Self {
                message,
                ..Self::from(n)
            },
            E::NotSoft(_) => Self::new(Class::NotSupported, "CmError::NotSoft", message),
            E::InUse(_) => {
                let mut e = Self::new(Class::AddressInUse, "CmError::InUse", message);
                e.errno = Some(libc::EADDRINUSE);
                e
            }
            E::Rejected {
                reason,
                private_data,
            } => Self::new(Class::Rejected, "CmError::Rejected", message)
                .with("reason", Extra::Str(format!("{reason:?}")))
                .with("reason_code", Extra::Int(i64::from(reason.code())))
                .with("private_data", Extra::Bytes(private_data)),
            E::Unreachable => Self::new(Class::Unreachable, "CmError::Unreachable", message),
            E::Sidr(status) => Self::new(Class::Rejected, "CmError::Sidr", message)
                .with("reason", Extra::Str(format!("{status:?}")))
                .with("reason_code", Extra::Int(i64::from(status.code())))
                .with("private_data", Extra::Bytes(Vec::new())),
            E::Timeout { .. } => Self::new(Class::Timeout, "CmError::Timeout", message),
            E::Modify(_) => Self::new(Class::ModifyError, "CmError::Modify", message),
            E::PrivateData { .. } => {
                Self::new(Class::InvalidArgument, "CmError::PrivateData", message)
            }
            E::Closed => Self::new(Class::Closed, "CmError::Closed", message),
            _ => Self::new(Class::CmError, "CmError", message),
        }
    }
}

impl From<ferroce::srq::SrqError> for Error {
    fn from(e: ferroce::srq::SrqError) -> Self {
        Self::new(Class::InvalidArgument, "SrqError", e.to_string())
    }
}
