//! Integration tests live in `it/`; this library is empty.
