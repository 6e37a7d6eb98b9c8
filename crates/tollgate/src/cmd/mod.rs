//! One module per subcommand.

pub mod audit;
pub mod bench;
pub mod board;
pub mod canonical;
pub mod certs;
pub mod conformance;
pub mod demo;
pub mod hitl;
pub mod keygen;
pub mod mcp;
pub mod migrate;
pub mod operator_token;
pub mod policy;
pub mod replay;
pub mod serve;
pub mod soak;
