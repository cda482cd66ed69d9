//! Packet I/O backends: how RoCEv2 packets (UDP payloads) leave and enter
//! the process.

pub(crate) mod udp;
