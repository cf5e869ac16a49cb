//! The panic fence, the result codes and the thread's last error.
//!
//! Every exported function runs its body through `fence` (or `fence_result`, which also
//! turns a failure into a code and records its text). A panic inside is caught there: it
//! never unwinds into C, which would abort the process (Rust 1.81 on) or worse. The caller
//! gets `FERROCE_RESULT_PANIC` ([`ferroce_result::Panic`]), a null pointer, 0 or `false`,
//! whichever the function returns, and the panic's message as its last error. This needs
//! the library built with `panic = "unwind"`, Cargo's default.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::fmt;
use std::mem::size_of;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call returns (rustls-ffi's `rustls_result`, libgit2's error codes). `OK` is 0, so
/// `if (ferroce_x(...))` tests for failure; [`ferroce_last_error`] says what went wrong.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
pub enum ferroce_result {
    /// The call did what it says.
    Ok = 0,
    /// Nothing came in time (a frame, a completion, a reply, a peer).
    Timeout = 1,
    /// The object has not been started: a receiver before `start` (Hololink's receiver throws
    /// `std::runtime_error` here).
    NotStarted = 2,
    /// A pointer argument was NULL.
    NullParameter = 3,
    /// An argument is out of range, a struct too small, a call out of order; the last error
    /// names which and says what would do.
    Invalid = 4,
    /// The address and port are held by another socket (another NIC, kernel rxe, another
    /// program).
    AddressInUse = 5,
    /// A device failed: memory registration (the locked-memory limit), device memory, or
    /// a verbs device.
    Device = 6,
    /// Any other failure: the network, the peer, the transport; the text says which.
    Failed = 7,
    /// The library panicked inside the call. The panic was caught; the objects the call
    /// touched may be unusable, but the process is intact and other objects work.
    Panic = 8,
    /// The peer went away or the object was closed (a session after `stop`, a cache context
    /// after a failure).
    Closed = 9,
    /// What was asked is not supported in this build or on this host (GPU memory without
    /// the `cuda` feature, say).
    Unsupported = 10,
    /// The peer refused: a connection request answered with a REJ (`RDMA_CM_EVENT_REJECTED`),
    /// or a SIDR request with a status other than success; the reason and the peer's
    /// private data come back where the call says.
    Rejected = 11,
    /// The peer never answered a connection-management message through all its retries
    /// (`RDMA_CM_EVENT_UNREACHABLE`): no NIC at that address, or its CM is gone.
    Unreachable = 12,
}

/// A failed call's code and text, on its way to the caller.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: ferroce_result,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: ferroce_result, message: impl fmt::Display) -> Self {
        Self {
            code,
            message: message.to_string(),
        }
    }

    pub(crate) fn invalid(message: impl fmt::Display) -> Self {
        Self::new(ferroce_result::Invalid, message)
    }

    pub(crate) fn failed(message: impl fmt::Display) -> Self {
        Self::new(ferroce_result::Failed, message)
    }

    pub(crate) fn null(name: &str) -> Self {
        Self::new(
            ferroce_result::NullParameter,
            format_args!("{name} is NULL"),
        )
    }
}

/// What the bodies of result-returning calls return.
pub(crate) type Outcome = Result<(), Failure>;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: String) {
    // A thread being torn down has no slot left; the text is then lost, never a panic.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = message;
        }
    });
}

/// The value a function returns when its body panicked.
pub(crate) trait OnPanic {
    fn on_panic() -> Self;
}

impl OnPanic for ferroce_result {
    fn on_panic() -> Self {
        Self::Panic
    }
}

impl<T> OnPanic for *mut T {
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
}

impl<T> OnPanic for *const T {
    fn on_panic() -> Self {
        std::ptr::null()
    }
}

impl OnPanic for () {
    fn on_panic() -> Self {}
}

impl OnPanic for bool {
    fn on_panic() -> Self {
        false
    }
}

/// A descriptor: -1, no descriptor.
impl OnPanic for i32 {
    fn on_panic() -> Self {
        -1
    }
}

macro_rules! zero_on_panic {
    ($($t:ty),*) => {$(
        impl OnPanic for $t {
            fn on_panic() -> Self {
                0
            }
        }
    )*};
}
zero_on_panic!(u16, u32, u64, usize, i64);

fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned())
}

/// Runs `body`, catching a panic: then records it as the last error and returns
/// [`OnPanic::on_panic`]. The one place a panic stops.
pub(crate) fn fence<R: OnPanic>(function: &'static str, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let text = panic_text(payload.as_ref());
            // Dropping the payload could panic in turn (a payload whose Drop panics); keep
            // that inside the fence too.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            set_last_error(format!(
                "{function} panicked inside ferroce: {text} (a bug in ferroce; the objects this \
                 call used may be unusable)"
            ));
            R::on_panic()
        }
    }
}

/// [`fence`] for a call that returns a code: a [`Failure`] becomes its code, and its text
/// the last error.
pub(crate) fn fence_result(
    function: &'static str,
    body: impl FnOnce() -> Outcome,
) -> ferroce_result {
    fence(function, || match body() {
        Ok(()) => ferroce_result::Ok,
        Err(failure) => {
            set_last_error(format!("{function}: {}", failure.message));
            failure.code
        }
    })
}

/// The NUL-terminated text at `text`, as UTF-8.
///
/// # Safety
///
/// `text` is NULL or points to a NUL-terminated string that stays valid for `'a`.
pub(crate) unsafe fn text_arg<'a>(text: *const c_char, name: &str) -> Result<&'a str, Failure> {
    if text.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: not NULL, and the caller promises a NUL-terminated string valid for 'a.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str()
        .map_err(|_| Failure::invalid(format_args!("{name} is not UTF-8")))
}

/// Refuses a versioned struct whose caller says it is smaller than this version's first
/// layout.
pub(crate) fn check_struct_size(name: &str, given: u32, known: usize) -> Outcome {
    if (given as usize) < known {
        return Err(Failure::invalid(format_args!(
            "{name}.struct_size is {given}, smaller than the {known} bytes of this version's \
             layout; set it to sizeof({name})"
        )));
    }
    Ok(())
}

/// A versioned out-struct's `struct_size`, read alone: the caller sets only that field of a
/// struct the call fills, so the rest may be uninitialised (a `bool` field holding any byte),
/// and no reference to the whole struct is made.
///
/// # Safety
///
/// `ptr` is NULL or points to a `T` whose first field is a `u32` `struct_size` that is
/// initialised.
pub(crate) unsafe fn struct_size_of<T>(ptr: *const T, name: &str) -> Result<u32, Failure> {
    if ptr.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: not NULL; the caller promises the first field is an initialised u32, and every
    // versioned struct here is #[repr(C)] with `struct_size: u32` first.
    Ok(unsafe { ptr.cast::<u32>().read_unaligned() })
}

/// The caller's versioned struct behind `ptr`, once its `struct_size` (read alone) says it is
/// at least this version's `T`: an older, smaller struct is refused before any byte past its
/// `struct_size` is read. `what` names the struct in the message.
///
/// # Safety
///
/// `ptr` is NULL or points to a struct whose first field is an initialised `u32`
/// `struct_size`, and whose first `struct_size` bytes are readable and initialised for `'a`.
pub(crate) unsafe fn versioned<'a, T>(
    ptr: *const T,
    name: &str,
    what: &str,
) -> Result<&'a T, Failure> {
    // SAFETY: the caller's promise covers the first field.
    let given = unsafe { struct_size_of(ptr, name) }?;
    check_struct_size(what, given, size_of::<T>())?;
    // SAFETY: not NULL (checked by struct_size_of), and the caller says `given` bytes, at
    // least a whole `T`, are readable and initialised.
    unsafe { handle(ptr, name) }
}

/// The caller's `&T` behind a handle pointer.
///
/// # Safety
///
/// `ptr` is NULL or points to a live `T` for `'a`.
pub(crate) unsafe fn handle<'a, T>(ptr: *const T, name: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises `ptr` is NULL or a live T; `as_ref` checks NULL.
    unsafe { ptr.as_ref() }.ok_or_else(|| Failure::null(name))
}

/// Hands a new object to C.
pub(crate) fn into_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Takes back and drops an object handed out by [`into_handle`]; NULL does nothing.
///
/// # Safety
///
/// `ptr` is NULL or came from [`into_handle`] for this `T` and was not freed since.
pub(crate) unsafe fn free_handle<T>(ptr: *mut T) {
    if !ptr.is_null() {
        // SAFETY: the caller promises `ptr` came from `Box::into_raw` and is freed once.
        drop(unsafe { Box::from_raw(ptr) });
    }
}

/// Writes `value` to the out-pointer `out`.
///
/// # Safety
///
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, name: &str) -> Outcome {
    if out.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: not NULL, and the caller promises it is valid for a write of T.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` into the caller's buffer as `snprintf` does: at most `len - 1` bytes and a
/// NUL; returns the full length.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
pub(crate) unsafe fn copy_text(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: the caller promises `len` writable bytes at `buf`; n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
            buf.add(n).write(0);
        }
    }
    text.len()
}

/// The text of the most recent call on this thread that did not return
/// `FERROCE_RESULT_OK` (libgit2's `git_error_last`): copied into `buf` as `snprintf` does,
/// NUL-terminated and cut to `len - 1` bytes. Returns the text's full length, so a call with
/// `len` 0 (and `buf` NULL) sizes the buffer. Calls that succeed leave it as it was.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_last_error(buf: *mut c_char, len: usize) -> usize {
    fence("ferroce_last_error", || {
        let text = LAST_ERROR
            .try_with(|slot| slot.try_borrow().map(|s| s.clone()).unwrap_or_default())
            .unwrap_or_default();
        // SAFETY: the caller's promise about `buf` and `len` is copy_text's.
        unsafe { copy_text(&text, buf, len) }
    })
}

/// A code's name, such as `"FERROCE_RESULT_TIMEOUT"`: a static string, never NULL (an
/// unknown value gives `"FERROCE_RESULT_UNKNOWN"`).
#[no_mangle]
pub extern "C" fn ferroce_result_name(result: u32) -> *const c_char {
    fence("ferroce_result_name", || {
        let name: &'static CStr = match result {
            0 => c"FERROCE_RESULT_OK",
            1 => c"FERROCE_RESULT_TIMEOUT",
            2 => c"FERROCE_RESULT_NOT_STARTED",
            3 => c"FERROCE_RESULT_NULL_PARAMETER",
            4 => c"FERROCE_RESULT_INVALID",
            5 => c"FERROCE_RESULT_ADDRESS_IN_USE",
            6 => c"FERROCE_RESULT_DEVICE",
            7 => c"FERROCE_RESULT_FAILED",
            8 => c"FERROCE_RESULT_PANIC",
            9 => c"FERROCE_RESULT_CLOSED",
            10 => c"FERROCE_RESULT_UNSUPPORTED",
            11 => c"FERROCE_RESULT_REJECTED",
            12 => c"FERROCE_RESULT_UNREACHABLE",
            _ => c"FERROCE_RESULT_UNKNOWN",
        };
        name.as_ptr()
    })
}
