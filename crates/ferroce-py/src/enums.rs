//! The enumerations, as Python's own `enum` classes made when the module is imported, so that
//! each member has its own docstring and `RegionAccess` is an `enum.Flag`: its members OR as
//! verbs access flags do (`RegionAccess.RemoteWrite | RegionAccess.RemoteRead`), each set of
//! rights converting exactly to `ferroce::RegionAccess`. Where one is taken as an argument, a
//! member's name will do too (`"Remote"`, `"RemoteWrite|RemoteRead"`): that is what
//! signatures show as defaults, since `inspect` reads only literals there.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyString, PyType};

use ferroce::frames as rf;

const SOURCE: &std::ffi::CStr = cr#"
import enum


class RegionAccess(enum.Flag):
    """What peers may do to a region, and through a queue pair: bit flags, ORed as verbs
    access flags are. `RegionAccess.RemoteWrite | RegionAccess.RemoteRead` grants exactly
    WRITE and READ; `Local` (no flag) grants peers nothing; `Remote` is all three rights.
    Where an access is taken, a member's name ("Remote", "RemoteWrite|RemoteRead") will do."""

    Local = 0
    RemoteWrite = 1
    RemoteRead = 2
    RemoteAtomic = 4
    Remote = 7


class WriteOrder(enum.Enum):
    """The order in which the NIC's writes land in a region (Rig_mlx5's `Region.order`)."""

    InOrder = 0
    AnyOrder = 1


class QpType(enum.Enum):
    """A queue pair's transport service."""

    Rc = 0
    Uc = 1
    Ud = 2


class Pattern(enum.Enum):
    """Test patterns: each frame's bytes are a function of its frame number."""

    Counter = 0
    Zeros = 1

    def fill(self, frame_number, length):
        """Frame `frame_number`'s first `length` bytes."""
        return _fill_pattern(self.value, frame_number, length)


_DOCS = {
    RegionAccess: {
        "Local": "Peers neither read nor write; the region has no remote key.",
        "RemoteWrite": "Peers may RDMA WRITE.",
        "RemoteRead": "Peers may RDMA READ.",
        "RemoteAtomic": "Peers may run atomics (compare-and-swap, fetch-and-add).",
        "Remote": "Peers may write, read and run atomics (the default).",
    },
    WriteOrder: {
        "InOrder": "Writes land in the order they were sent (the default).",
        "AnyOrder": "Writes may land in any order (relaxed ordering); faster on some devices.",
    },
    QpType: {
        "Rc": "Reliable connected: acknowledged, retried, in order; every verb.",
        "Uc": "Unreliable connected: SEND and WRITE, no acknowledgements, no READ or atomics.",
        "Ud": "Unreliable datagram: SENDs of one MTU to any peer, by address handle.",
    },
    Pattern: {
        "Counter": "Each byte a function of its offset and the frame number.",
        "Zeros": "Every byte zero.",
    },
}
for _cls, _docs in _DOCS.items():
    for _name, _doc in _docs.items():
        _cls[_name].__doc__ = _doc
    _cls.__module__ = "ferroce"
Pattern.__module__ = "ferroce.frames"
"#;

/// The classes, in this order.
#[derive(Clone, Copy)]
enum Which {
    RegionAccess,
    WriteOrder,
    QpType,
    Pattern,
}

const NAMES: [&str; 4] = ["RegionAccess", "WriteOrder", "QpType", "Pattern"];

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn class(py: Python<'_>, which: Which) -> PyResult<&Bound<'_, PyType>> {
    let classes = CLASSES.get_or_try_init(py, || {
        let module = PyModule::from_code(py, SOURCE, c"ferroce/enums.py", c"ferroce._enums")?;
        module.add_function(wrap_pyfunction!(fill_pattern, &module)?)?;
        NAMES
            .iter()
            .map(|n| Ok(module.getattr(*n)?.cast_into::<PyType>()?.unbind()))
            .collect::<PyResult<Vec<_>>>()
    })?;
    Ok(classes[which as usize].bind(py))
}

/// `Pattern.fill`: frame `frame_number`'s first `length` bytes of pattern `kind`.
#[pyfunction]
#[pyo3(name = "_fill_pattern")]
fn fill_pattern(py: Python<'_>, kind: u32, frame_number: u32, length: usize) -> Bound<'_, PyBytes> {
    let pattern = if kind == 1 {
        rf::Pattern::Zeros
    } else {
        rf::Pattern::Counter
    };
    let mut out = vec![0u8; length];
    pattern.fill(frame_number, &mut out);
    PyBytes::new(py, &out)
}

/// Adds the classes to `module`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    for (which, name) in [
        Which::RegionAccess,
        Which::WriteOrder,
        Which::QpType,
        Which::Pattern,
    ]
    .into_iter()
    .zip(NAMES)
    {
        module.add(name, class(py, which)?)?;
    }
    Ok(())
}

/// The value of `obj`, a member of `which` or a member's name (for `RegionAccess`, names
/// joined by `|`); `what` names the argument in errors.
fn value_of(obj: &Borrowed<'_, '_, PyAny>, which: Which, what: &str) -> PyResult<u32> {
    let cls = class(obj.py(), which)?;
    let name = NAMES[which as usize];
    if obj.is_instance(cls)? {
        return obj.getattr("value")?.extract();
    }
    let Ok(text) = obj.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a {name} (or a member's name), not {}",
            obj.get_type().name()?
        )));
    };
    let text = text.to_str()?;
    let parts: Vec<&str> = if matches!(which, Which::RegionAccess) {
        text.split('|').collect()
    } else {
        vec![text]
    };
    let mut bits = 0u32;
    for part in parts {
        let member = cls.get_item(part.trim()).map_err(|_| {
            PyValueError::new_err(format!("{part:?} is not a member of {name} ({what})"))
        })?;
        bits |= member.getattr("value")?.extract::<u32>()?;
    }
    Ok(bits)
}

/// A `RegionAccess` taken as an argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access(pub(crate) ferroce::RegionAccess);

impl Access {
    pub(crate) const REMOTE: Self = Self(ferroce::RegionAccess::Remote);
}

impl<'a, 'py> FromPyObject<'a, 'py> for Access {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let bits = value_of(&obj, Which::RegionAccess, "access")?;
        ferroce::RegionAccess::from_flags(bits)
            .map(Self)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// A `WriteOrder` taken as an argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Order(pub(crate) ferroce::proto::memory::WriteOrder);

impl Order {
    pub(crate) const IN_ORDER: Self = Self(ferroce::proto::memory::WriteOrder::InOrder);
}

impl<'a, 'py> FromPyObject<'a, 'py> for Order {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        use ferroce::proto::memory::WriteOrder as W;
        Ok(Self(match value_of(&obj, Which::WriteOrder, "order")? {
            0 => W::InOrder,
            _ => W::AnyOrder,
        }))
    }
}

/// A `QpType` taken as an argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpType(pub(crate) ferroce::qp::QpType);

impl<'a, 'py> FromPyObject<'a, 'py> for QpType {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        use ferroce::qp::QpType as T;
        Ok(Self(match value_of(&obj, Which::QpType, "qp_type")? {
            0 => T::Rc,
            1 => T::Uc,
            _ => T::Ud,
        }))
    }
}
