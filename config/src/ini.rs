//! systemd-style INI (stub: filled in by the config work).
