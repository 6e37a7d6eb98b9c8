//! Awaitables whose work runs on the module's tokio runtime and whose result is made into
//! a Python object on the asyncio loop's own thread: no runtime thread ever attaches to
//! the interpreter.
//!
//! Why: a runtime thread that attaches to complete an asyncio future (what
//! `pyo3_async_runtimes::future_into_py` does) can lose the GIL in the middle (the future's
//! `call_soon_threadsafe` writes to the loop's self-pipe, which releases it). The loop then
//! resumes the awaiting coroutine; if that was the program's last await, the main thread
//! goes into `Py_FinalizeEx`, and the runtime thread, taking the GIL back to finish,
//! finds the interpreter finalizing: a fatal "PyGILState_Release: thread state ... must be
//! current" at exit (issue 16 §6: 11 of 40 runs).
//!
//! Here the runtime thread only stores a closure (what to build) and writes one byte to a
//! socket pair; the loop watches the other end (`loop.add_reader`), and the awaiting
//! coroutine (`tollgate._await.wait`) builds the result while it holds the GIL anyway. If
//! the task is cancelled or panics, the writer is dropped, the reader sees end of file, and
//! `result()` raises instead of returning nothing.

use std::future::Future;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;

type Produce = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// An awaitable native call (`await client.acheck(...)`): see the module's docs.
#[pyclass(module = "tollgate._native", name = "Pending")]
pub struct Pending {
    slot: Arc<Mutex<Option<Produce>>>,
    reader: UnixStream,
    abort: tokio::task::AbortHandle,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("fd", &self.reader.as_raw_fd())
            .finish_non_exhaustive()
    }
}

/// Run `fut` on `runtime`; the returned `Pending` is awaited from Python.
pub fn spawn<F, T>(runtime: &tokio::runtime::Runtime, fut: F) -> PyResult<Pending>
where
    F: Future<Output = T> + Send + 'static,
    T: for<'py> IntoPyObject<'py> + Send + 'static,
{
    let (reader, writer) = UnixStream::pair()
        .map_err(|e| PyOSError::new_err(format!("cannot start the call: {e}")))?;
    let slot: Arc<Mutex<Option<Produce>>> = Arc::new(Mutex::new(None));
    let filled = slot.clone();
    let task = runtime.spawn(async move {
        let value = fut.await;
        let produce: Produce = Box::new(move |py| value.into_py_any(py));
        *filled.lock().unwrap_or_else(PoisonError::into_inner) = Some(produce);
        // The loop wakes on this byte (or on end of file, if it cannot be written).
        let _ = (&writer).write_all(&[1]);
    });
    Ok(Pending {
        slot,
        reader,
        abort: task.abort_handle(),
    })
}

#[pymethods]
impl Pending {
    /// The descriptor that becomes readable when the call is done (or cannot complete).
    fn fileno(&self) -> i32 {
        self.reader.as_raw_fd()
    }

    /// Whether the result is ready.
    fn done(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The call's result, once `fileno()` was readable. Raises `RuntimeError` if the call
    /// was cancelled or did not complete, or if the result was already taken.
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let produce = self
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match produce {
            Some(p) => p(py),
            None => Err(PyRuntimeError::new_err(
                "the call did not complete (cancelled, or its result was already taken)",
            )),
        }
    }

    /// Stop the call (an awaiting task was cancelled).
    fn cancel(&self) {
        self.abort.abort();
    }

    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("tollgate._await")?
            .getattr("wait")?
            .call1((slf,))?
            .call_method0("__await__")
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Nobody waits any more: stop the work (a no-op once it is done).
        self.abort.abort();
    }
}
