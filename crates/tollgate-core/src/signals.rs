//! Error signals for error amplification (seed §3.9): a fixed word list matched with
//! Aho-Corasick, ASCII-case-insensitively, as substrings. No regular expressions, so no
//! input can make the scan slower than linear.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

/// The seed's list, plus the rate-limit and gateway failures agents loop on most.
pub const ERROR_SIGNALS: &[&str] = &[
    "401",
    "unauthorized",
    "403",
    "forbidden",
    "500",
    "502",
    "503",
    "504",
    "timeout",
    "connection refused",
    "connection reset",
    "permission denied",
    "rate limit",
    "quota exceeded",
    "invalid api key",
    "token expired",
    "model not found",
    "resource exhausted",
    "deadline exceeded",
    "429",
    "too many requests",
    "internal server error",
    "bad gateway",
    "service unavailable",
    "gateway timeout",
];

fn matcher() -> Option<&'static AhoCorasick> {
    static MATCHER: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    MATCHER
        .get_or_init(|| {
            AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(ERROR_SIGNALS)
                .ok()
        })
        .as_ref()
}

/// Whether `text` contains any error signal. Builds the automaton once per process; after
/// that a scan does not allocate.
pub fn has_error_signal(text: &str) -> bool {
    // The pattern set is fixed and small, so building cannot fail; if it somehow did,
    // report a signal: amplification only ever makes the guard stricter.
    matcher().is_none_or(|m| m.is_match(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_signals_case_insensitively() {
        for t in [
            "HTTP 429 Too Many Requests",
            "error: Unauthorized",
            "upstream: BAD GATEWAY",
            "{\"status\":503}",
            "Deadline Exceeded while calling",
            "invalid API key",
        ] {
            assert!(has_error_signal(t), "{t}");
        }
        for t in [
            "",
            "ok",
            "{\"q\":\"weather in paris\"}",
            "status 200",
            "4 2 9",
        ] {
            assert!(!has_error_signal(t), "{t}");
        }
    }
}
