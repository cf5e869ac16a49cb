//! `RegionAccess`: an `enum.Flag`, made when the module is imported, whose members OR as
//! verbs access flags do (`RegionAccess.RemoteWrite | RegionAccess.RemoteRead`), each set of
//! rights converting exactly to `ferroce::RegionAccess` and back.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();

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

RegionAccess.__module__ = "ferroce"
"#;

fn class(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    Ok(CLASS
        .get_or_try_init(py, || {
            let module = PyModule::from_code(py, SOURCE, c"ferroce/access.py", c"ferroce._access")?;
            Ok::<_, PyErr>(
                module
                    .getattr("RegionAccess")?
                    .cast_into::<PyType>()?
                    .unbind(),
            )
        })?
        .bind(py))
}

/// Adds `RegionAccess` to `module`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("RegionAccess", class(module.py())?)
}

/// A Python `RegionAccess` (or a member's name, or names joined by `|`), taken as an argument.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Access(pub(crate) ferroce::RegionAccess);

impl Access {
    pub(crate) const REMOTE: Self = Self(ferroce::RegionAccess::Remote);
}

impl<'a, 'py> FromPyObject<'a, 'py> for Access {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        let cls = class(py)?;
        let bits: u32 = if obj.is_instance(cls)? {
            obj.getattr("value")?.extract()?
        } else if let Ok(text) = obj.cast::<PyString>() {
            let mut bits = 0u32;
            for name in text.to_str()?.split('|') {
                let member = cls.get_item(name.trim()).map_err(|_| {
                    PyValueError::new_err(format!(
                        "{name:?} is not a RegionAccess member (Local, RemoteWrite, \
                         RemoteRead, RemoteAtomic, Remote)"
                    ))
                })?;
                bits |= member.getattr("value")?.extract::<u32>()?;
            }
            bits
        } else {
            return Err(PyTypeError::new_err(format!(
                "access must be a RegionAccess (or a member's name), not {}",
                obj.get_type().name()?
            )));
        };
        ferroce::RegionAccess::from_flags(bits)
            .map(Self)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

impl<'py> IntoPyObject<'py> for Access {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        class(py)?.call1((self.0.flags(),))
    }
}
