//! One module per subcommand.

pub mod audit;
pub mod conformance;
pub mod keygen;
