//! One module per subcommand.

pub mod canonical;
pub mod conformance;
