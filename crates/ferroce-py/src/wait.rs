//! Waiting without holding the GIL, and without deafening Ctrl-C.
//!
//! Every wait runs detached from the interpreter (`Python::detach`) in slices of at most
//! [`SLICE`]; between slices the thread attaches again and runs `check_signals`, so a
//! `KeyboardInterrupt` (or any signal handler's exception) ends the wait within 100 ms.
//!
//! A Rust call that cannot be cut into slices (a handshake that waits for its peer, say) runs
//! on a helper thread of its own ([`off_thread`]) while the caller waits for it in slices. On
//! an interrupt the caller raises at once; the helper finishes on its own, bounded by the
//! call's own timeout, and its result is dropped.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// The longest the interpreter goes without looking at its signals during a wait.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// A timeout in seconds from Python: `None` waits for ever; negative and NaN are refused.
pub(crate) fn timeout(seconds: Option<f64>) -> Result<Option<Duration>, crate::errors::Error> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s.min(1e9)))),
        Some(s) => Err(crate::errors::Error::invalid(format!(
            "timeout {s} is not a number of seconds from 0 up (None waits for ever)"
        ))),
    }
}

/// Runs `step(slice)` detached until it returns `Some`, or `timeout` passes (`None`), each
/// time with the slice of the wait that is left (at most [`SLICE`]); checks signals between
/// steps. `step` must return within about its slice.
pub(crate) fn sliced<T: Send>(
    py: Python<'_>,
    timeout: Option<Duration>,
    mut step: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = deadline.map_or(SLICE, |d| d.saturating_duration_since(Instant::now()));
        let slice = left.min(SLICE);
        if let Some(v) = py.detach(|| step(slice)) {
            return Ok(Some(v));
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

/// Runs `call` on a helper thread and waits for its result in slices (see the module doc).
pub(crate) fn off_thread<T: Send + 'static>(
    py: Python<'_>,
    name: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("ferroce-{name}"))
        .spawn(move || {
            let _ = tx.send(call());
        })
        .map_err(crate::errors::Error::from)?;
    let mut rx = rx;
    loop {
        let (got, back) = py.detach(move || (rx.recv_timeout(SLICE), rx));
        rx = back;
        match got {
            Ok(v) => return Ok(v),
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(crate::errors::Error::new(
                    crate::errors::Class::Base,
                    "Panic",
                    format!("{name} panicked inside ferroce"),
                )
                .into())
            }
        }
    }
}
