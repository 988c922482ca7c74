//! One directory per vendor: its records decoded into typed calls, and its tracker (the driver
//! objects it keeps and the events their life produces).
pub mod amd;
pub mod nvidia;
