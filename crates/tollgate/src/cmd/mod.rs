//! One module per subcommand.

pub mod audit;
pub mod canonical;
pub mod conformance;
pub mod keygen;
