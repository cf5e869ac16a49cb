//! Python bindings for ferroce: the `ferroce._ferroce` extension module.

use pyo3::prelude::*;

/// The extension module.
#[pymodule(gil_used = true)]
fn _ferroce(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
