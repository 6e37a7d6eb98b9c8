//! One module per subcommand.

pub mod audit;
pub mod board;
pub mod canonical;
pub mod conformance;
pub mod keygen;
