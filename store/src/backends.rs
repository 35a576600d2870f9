//! The operations of [`crate::operations`] implemented for the real backends, PostgreSQL and
//! SQLite (each calls the backend's inherent method of the same name, where the SQL stays), and
//! for the [`Store`] façade (backend dispatch plus retry) with `Store`'s own methods. Made from
//! the one list of operations (`with_operations`), so no operation can be missed.

use std::future::Future;

use crate::operations::*;
use crate::postgres::PgStore;
use crate::sqlite::SqliteStore;
// The list names its types as the store's vocabulary: all of them, as `lib.rs` exports them.
use crate::*;
use serde_json::Value;

/// Calls an operation on a real backend: its inherent method of the same name and arguments, or
/// the call an entry spells out (when the trait takes its arguments as the façade does, owned).
macro_rules! call_backend {
    ($self:ident, $backend:ty, $name:ident, ($($arg:ident),*)) => {
        <$backend>::$name($self $(, $arg)*).await
    };
    ($self:ident, $backend:ty, $name:ident, ($($arg:ident),*), |$store:ident| $call:expr) => {{
        let $store = $self;
        $call.await
    }};
}

/// On PostgreSQL, a read's place among the pool's connections for reads, held while it runs
/// (see [`PgStore::read_place`]); nothing for any other operation.
macro_rules! pg_read_place {
    (read, $store:ident) => {
        Some($store.read_place().await?)
    };
    ($effect:ident, $store:ident) => {
        None::<tokio::sync::SemaphorePermit<'_>>
    };
}

/// Whether the façade retries an operation's transient failures (see [`retry`]): every operation
/// but the probes readiness and the clock make, which answer at once.
macro_rules! retried {
    (read) => {
        true
    };
    (write) => {
        true
    };
    (probe) => {
        false
    };
    (write_probe) => {
        false
    };
}

macro_rules! implement {
    ($(
        $(#[$trait_doc:meta])*
        trait $trait:ident {
            $(
                $(#[$doc:meta])*
                $effect:ident $variant:ident:
                fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty
                $(=> |$store:ident| $call:expr)?;
            )*
        }
    )*) => {
        $(
            impl $trait for SqliteStore {
                $(
                    fn $name(&self $(, $arg: $ty)*) -> impl Future<Output = Result<$ret>> + Send {
                        async move {
                            call_backend!(self, SqliteStore, $name, ($($arg),*)
                                $(, |$store| $call)?)
                        }
                    }
                )*
            }

            impl $trait for PgStore {
                $(
                    fn $name(&self $(, $arg: $ty)*) -> impl Future<Output = Result<$ret>> + Send {
                        async move {
                            let _read = pg_read_place!($effect, self);
                            call_backend!(self, PgStore, $name, ($($arg),*) $(, |$store| $call)?)
                        }
                    }
                )*
            }

            impl $trait for Store {
                $(
                    fn $name(&self $(, $arg: $ty)*) -> impl Future<Output = Result<$ret>> + Send {
                        Store::$name(self $(, $arg)*)
                    }
                )*
            }
        )*

        impl Store {
            $($(
                $(#[$doc])*
                pub async fn $name(&self $(, $arg: $ty)*) -> Result<$ret> {
                    let attempt = || {
                        $(let $arg = Clone::clone(&$arg);)*
                        async move {
                            match &self.backend {
                                crate::Inner::Sqlite(store) => $trait::$name(store $(, $arg)*).await,
                                crate::Inner::Postgres(store) => {
                                    $trait::$name(store $(, $arg)*).await
                                }
                            }
                        }
                    };
                    if retried!($effect) {
                        retry(attempt).await
                    } else {
                        attempt().await
                    }
                }
            )*)*
        }
    };
}

crate::with_operations!(implement);
