//! The descriptor budget. Every connection holds a descriptor, and so does every file
//! the daemon opens: the audit log's current file, the file a rotation creates, the
//! directory it syncs, a checkpoint, the state snapshot, a compression, a recovery, the
//! fleet's Redis and PostgreSQL connections. If connections may take them all, the next
//! rotation fails with `EMFILE` and the audit log refuses entries until a descriptor is
//! free again.
//!
//! So at start the soft `RLIMIT_NOFILE` is raised to the hard one, and the connection
//! caps are fitted under it: the descriptors open now, plus [`TRANSIENT`] for the files
//! the daemon opens while it runs (and [`FLEET_RECONNECTS`] in a fleet), are reserved;
//! the control plane's fixed cap comes next; the socket's and gRPC's caps share what
//! remains, each lowered (with a warning) when it does not fit. Too little room for even
//! [`MIN_CONNECTIONS`] per binding refuses to start.

/// Descriptors reserved for what the daemon opens while it runs, beside the ones open at
/// start: a rotation (the new file, its temporary name, the directory synced: 3), the
/// compression of the file rotated out (3), a checkpoint (2), a recovery of the audit log
/// (4), the state snapshot reopened after a failure (2), one refused connection per
/// binding while it is told so (3), and room to spare.
pub const TRANSIENT: u64 = 32;

/// Descriptors reserved in a fleet for reconnections to Redis and PostgreSQL (a new
/// connection is opened before the broken one is dropped).
pub const FLEET_RECONNECTS: u64 = 16;

/// The fewest connections a binding may be given: below that the daemon refuses to start.
pub const MIN_CONNECTIONS: usize = 4;

/// What was found and decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The soft descriptor limit the daemon runs under.
    pub limit: u64,
    /// The soft limit before it was raised, if it was.
    pub raised_from: Option<u64>,
    /// Descriptors reserved for everything but connections (open at start, plus
    /// [`TRANSIENT`], plus [`FLEET_RECONNECTS`] in a fleet).
    pub reserved: u64,
    /// The Unix socket's connection cap.
    pub socket: usize,
    /// The gRPC binding's connection cap, when it is on.
    pub grpc: Option<usize>,
    /// The control plane's connection cap, when it is on (fixed).
    pub control: Option<usize>,
    /// What the operator should know: a cap lowered, a limit that could not be raised.
    pub warnings: Vec<String>,
}

impl Budget {
    /// One line for the banner.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{} socket", self.socket)];
        if let Some(g) = self.grpc {
            parts.push(format!("{g} gRPC"));
        }
        if let Some(c) = self.control {
            parts.push(format!("{c} control-plane"));
        }
        let limit = match self.raised_from {
            Some(from) => format!("limit {} (raised from {from})", self.limit),
            None => format!("limit {}", self.limit),
        };
        format!(
            "{limit}: {} connections, {} descriptors reserved for files and the rest",
            parts.join(" + "),
            self.reserved
        )
    }
}

/// Why the caps cannot be fitted at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the descriptor limit {limit} leaves room for {room} connections after {reserved} reserved for files (and {control} for the control plane), fewer than {MIN_CONNECTIONS} per binding: raise it (`ulimit -n`, or LimitNOFILE= in a systemd unit)")]
pub struct TooFew {
    /// The soft limit.
    pub limit: u64,
    /// Descriptors reserved.
    pub reserved: u64,
    /// The control plane's share.
    pub control: usize,
    /// What remained for the socket and gRPC.
    pub room: u64,
}

/// The caps asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// The socket's (`limits.max_connections`).
    pub socket: usize,
    /// gRPC's, when on (`limits.max_connections`).
    pub grpc: Option<usize>,
    /// The control plane's, when on (fixed).
    pub control: Option<usize>,
    /// Whether this is a fleet member (Redis and PostgreSQL connections).
    pub fleet: bool,
}

/// Fit `wanted` under `limit` with `in_use` descriptors open now. Pure.
pub fn fit(limit: u64, in_use: u64, wanted: Wanted) -> Result<Budget, TooFew> {
    let reserved = in_use
        .saturating_add(TRANSIENT)
        .saturating_add(if wanted.fleet { FLEET_RECONNECTS } else { 0 });
    let control = wanted.control.unwrap_or(0);
    let room = limit
        .saturating_sub(reserved)
        .saturating_sub(control as u64);
    let bindings = if wanted.grpc.is_some() { 2 } else { 1 };
    let too_few = || TooFew {
        limit,
        reserved,
        control,
        room,
    };
    if room < (MIN_CONNECTIONS * bindings) as u64 {
        return Err(too_few());
    }
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    let mut warnings = Vec::new();
    let (socket, grpc) = match wanted.grpc {
        None => (wanted.socket.min(room), None),
        Some(g) if wanted.socket.saturating_add(g) <= room => (wanted.socket, Some(g)),
        // The smaller request is met up to half the room; the other takes the rest.
        Some(g) if wanted.socket <= g => {
            let socket = wanted.socket.min(room / 2);
            (socket, Some(g.min(room - socket)))
        }
        Some(g) => {
            let grpc = g.min(room / 2);
            (wanted.socket.min(room - grpc), Some(grpc))
        }
    };
    if socket < wanted.socket {
        warnings.push(format!(
            "limits.max_connections for the socket lowered from {} to {socket} to fit under the descriptor limit {limit}",
            wanted.socket
        ));
    }
    if let (Some(got), Some(asked)) = (grpc, wanted.grpc) {
        if got < asked {
            warnings.push(format!(
                "limits.max_connections for gRPC lowered from {asked} to {got} to fit under the descriptor limit {limit}"
            ));
        }
    }
    Ok(Budget {
        limit,
        raised_from: None,
        reserved,
        socket,
        grpc,
        control: wanted.control,
        warnings,
    })
}

/// Raise the soft descriptor limit to the hard one. Returns the limit in force, the one
/// before when it was raised, and a warning if it could not be.
pub fn raise() -> (u64, Option<u64>, Option<String>) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    // "Unlimited" cannot be set for descriptors (Linux caps them at fs.nr_open).
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    let hard = now.maximum.unwrap_or(nr_open).min(nr_open);
    let soft = now.current.unwrap_or(hard);
    if soft >= hard {
        return (soft, None, None);
    }
    match setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: now.maximum,
        },
    ) {
        Ok(()) => (hard, Some(soft), None),
        Err(e) => (
            soft,
            None,
            Some(format!(
                "could not raise the descriptor limit from {soft} to the hard limit {hard}: {e}"
            )),
        ),
    }
}

/// Descriptors open in this process now (16 if `/proc` cannot tell).
pub fn in_use() -> u64 {
    match std::fs::read_dir("/proc/self/fd") {
        // The directory being read holds one of them.
        Ok(rd) => (rd.count() as u64).saturating_sub(1),
        Err(_) => 16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn wanted(socket: usize, grpc: Option<usize>, control: Option<usize>) -> Wanted {
        Wanted {
            socket,
            grpc,
            control,
            fleet: false,
        }
    }

    #[test]
    fn everything_fits_under_a_large_limit() {
        let b = fit(1 << 20, 20, wanted(1024, Some(1024), Some(256))).unwrap();
        assert_eq!((b.socket, b.grpc, b.control), (1024, Some(1024), Some(256)));
        assert!(b.warnings.is_empty());
    }

    #[test]
    fn the_issue_case_leaves_room_for_rotation() {
        // RLIMIT_NOFILE 64, 1,024 connections asked for on the socket.
        let b = fit(64, 12, wanted(1024, None, None)).unwrap();
        assert_eq!(b.socket, 64 - 12 - TRANSIENT as usize);
        assert_eq!(b.warnings.len(), 1, "{:?}", b.warnings);
    }

    #[test]
    fn too_little_room_refuses() {
        let e = fit(40, 12, wanted(1024, Some(1024), None)).unwrap_err();
        assert!(e.to_string().contains("raise it"), "{e}");
    }

    proptest! {
        #[test]
        fn caps_never_exceed_the_limit(
            limit in 0u64..5000,
            in_use in 0u64..200,
            socket in 1usize..3000,
            grpc in proptest::option::of(1usize..3000),
            control in proptest::option::of(0usize..300),
            fleet: bool,
        ) {
            let w = Wanted { socket, grpc, control, fleet };
            if let Ok(b) = fit(limit, in_use, w) {
                let total = b.reserved
                    + b.socket as u64
                    + b.grpc.unwrap_or(0) as u64
                    + b.control.unwrap_or(0) as u64;
                prop_assert!(total <= limit, "{b:?}");
                prop_assert!(b.socket <= socket && b.socket >= MIN_CONNECTIONS.min(socket));
                if let (Some(g), Some(asked)) = (b.grpc, grpc) {
                    prop_assert!(g <= asked && g >= MIN_CONNECTIONS.min(asked));
                }
                // Nothing is lowered that fits.
                if total - (b.socket as u64 + b.grpc.unwrap_or(0) as u64)
                    + socket as u64 + grpc.unwrap_or(0) as u64 <= limit
                {
                    prop_assert_eq!(b.socket, socket);
                    prop_assert_eq!(b.grpc, grpc);
                }
            }
        }
    }
}
