//! One module per subcommand.

pub mod board;
pub mod conformance;
