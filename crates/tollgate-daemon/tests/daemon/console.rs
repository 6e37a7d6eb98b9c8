//! The console in a real browser (placeholder).
