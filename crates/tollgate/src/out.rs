//! Standard output and error for every command, without panics.
//!
//! `println!` panics when standard output is a pipe whose reader has gone
//! (`tollgate audit verify DIR | head -1`). Every command prints through `outln!` and
//! `out!` instead: a closed pipe (`EPIPE`) stops the command at once, silently, with
//! exit status [`CLOSED_PIPE_STATUS`] (141, what a shell reports for a program killed by
//! SIGPIPE, so a `set -o pipefail` script still sees that the output was cut). Any other
//! write error is reported once on standard error, with exit status 2. `errln!` writes
//! to standard error and ignores a failure there (there is nowhere left to report it).

use std::io::Write;

/// The exit status of a command whose standard output was closed under it.
pub const CLOSED_PIPE_STATUS: u8 = 141;

/// Write `args` to standard output and flush; on a closed pipe, exit quietly.
pub fn stdout(args: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        drop(o);
        exit_on_write_error(&e);
    }
}

/// Write `args` to standard output and flush, and say whether that worked: for the
/// daemon's banner, which must not stop the daemon when nobody reads it.
pub fn stdout_lossy(args: std::fmt::Arguments<'_>) -> bool {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args).and_then(|()| o.flush()).is_ok()
}

/// Write `args` to standard error, ignoring a failure.
pub fn stderr(args: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args).and_then(|()| e.flush());
}

/// Whether `e`, or an error it wraps, is a write into a closed pipe.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn exit_on_write_error(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(i32::from(CLOSED_PIPE_STATUS));
    }
    stderr(format_args!(
        "tollgate: error: writing to standard output: {e}\n"
    ));
    std::process::exit(2);
}

/// `println!` that does not panic: see the module documentation.
macro_rules! outln {
    () => {
        $crate::out::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that does not panic: see the module documentation.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that does not panic when standard error is closed.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}
