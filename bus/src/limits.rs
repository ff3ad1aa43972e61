//! How large one D-Bus message may be on the buses drover meets.
//!
//! A method reply is one message; nothing in D-Bus splits it. The spec caps a
//! message at 128 MiB (and zbus refuses to build a larger one), but the bus
//! daemon enforces its own cap and treats a larger message as corrupt: it
//! drops the connection that sent it. dbus-daemon's system bus uses its
//! built-in default of 32 MiB (`max_message_size`; its session bus
//! configuration raises it). A reply drover builds on its own (a fleet-wide
//! list) stays within [`MAX_REPLY_BODY`], so it reaches the caller on any of
//! them.

/// The most bytes one message may carry on every bus drover is served on:
/// dbus-daemon's default `max_message_size` (the system bus), 32 MiB.
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// Room left for a reply's header: reply serial, destination, signature, and
/// the sender the bus daemon adds (a few hundred bytes in all).
pub const HEADER_ROOM: usize = 4096;

/// The most bytes the body of a reply drover builds may take.
pub const MAX_REPLY_BODY: usize = MAX_MESSAGE_BYTES - HEADER_ROOM;
