//! The client's clock and randomness (the edges the core leaves to its callers).

use tollgate_core::UnixNanos;

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> UnixNanos {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(0)
}

/// A random non-zero nonce. Without system randomness it is 1 every time, which the
/// daemon then refuses as a replay: failing closed, not open.
pub fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b).max(1)
}

/// A draw for the probabilistic layer. Without system randomness it is 0.0, which denies
/// whenever that layer is armed (fail closed).
pub fn random_draw() -> f64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return 0.0;
    }
    tollgate_core::draw_from_bytes(b)
}
