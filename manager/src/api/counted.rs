//! [`Counted`]: a served D-Bus object whose method calls are counted by
//! method and result (`crate::metrics::dbus_calls`). It forwards everything
//! to the object it wraps; a method call's future runs in
//! [`crate::error::noting_answer`], which tells the error an
//! [`ApiError`](crate::error::ApiError) reply made, if any, when the call ends.
//!
//! What each call counts as:
//! * a name the interface does not have: `unknown`, `UnknownMethod`;
//! * arguments whose signature is not the method's: `InvalidArgs` (zbus
//!   answers it before the method runs);
//! * an error answered through `ApiError`: its class;
//! * anything else: `ok`.

use crate::metrics::dbus_calls::{DbusCalls, InterfaceCalls, RESULTS, result_index};
use std::collections::HashMap;
use std::sync::Arc;
use zbus::message::Header;
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::{DispatchResult, Interface, ObjectServer, SignalEmitter};
use zbus::zvariant::{OwnedVariant, Variant};
use zbus::{Connection, Message};

/// An object served with its calls counted (see the module docs).
pub struct Counted<I> {
    inner: I,
    calls: Arc<InterfaceCalls>,
}

impl<I: Interface> Counted<I> {
    pub fn new(inner: I, calls: &DbusCalls) -> Self {
        let name = I::name();
        let calls = calls.interface(name.as_str(), || {
            let mut xml = String::new();
            inner.introspect_to_writer(&mut xml, 0);
            xml
        });
        Self { inner, calls }
    }

    pub fn inner(&self) -> &I {
        &self.inner
    }

    /// Wraps one dispatch of `name` (see the module docs).
    fn counted<'call>(
        &'call self,
        msg: &'call Message,
        name: &MemberName<'_>,
        dispatch: DispatchResult<'call>,
    ) -> DispatchResult<'call> {
        let method = self.calls.method(name.as_str());
        match dispatch {
            DispatchResult::NotFound => {
                self.calls.count(
                    None,
                    result_index(Some(drover_protocol::error_names::UNKNOWN_METHOD)),
                );
                DispatchResult::NotFound
            }
            DispatchResult::RequiresMut => DispatchResult::RequiresMut,
            DispatchResult::Async(call) => {
                let row = method.map(|m| m.0);
                let bad_args = method
                    .is_some_and(|(_, want)| msg.body().signature().to_string_no_parens() != want);
                let calls = self.calls.clone();
                DispatchResult::Async(Box::pin(async move {
                    let (done, answered) = crate::error::noting_answer(call).await;
                    let result = if bad_args {
                        result_index(Some(drover_protocol::error_names::INVALID_ARGS))
                    } else {
                        answered.map_or(0, |name| result_index(Some(name.as_str())))
                    };
                    debug_assert!(result < RESULTS.len());
                    calls.count(row, result);
                    done
                }))
            }
        }
    }
}

#[async_trait::async_trait]
impl<I: Interface> Interface for Counted<I> {
    fn name() -> InterfaceName<'static> {
        I::name()
    }

    fn spawn_tasks_for_methods(&self) -> bool {
        self.inner.spawn_tasks_for_methods()
    }

    async fn get(
        &self,
        property_name: &str,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<Result<OwnedVariant, zbus::BoxDBusError>> {
        self.inner
            .get(property_name, server, connection, header, emitter)
            .await
    }

    async fn get_all(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> zbus::fdo::Result<HashMap<String, OwnedVariant>> {
        self.inner
            .get_all(server, connection, header, emitter)
            .await
    }

    fn set<'call>(
        &'call self,
        property_name: &'call str,
        value: &'call Variant<'_>,
        server: &'call ObjectServer,
        connection: &'call Connection,
        header: Option<&'call Header<'_>>,
        emitter: &'call SignalEmitter<'_>,
    ) -> DispatchResult<'call> {
        self.inner
            .set(property_name, value, server, connection, header, emitter)
    }

    async fn set_mut(
        &mut self,
        property_name: &str,
        value: &Variant<'_>,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<Result<(), zbus::BoxDBusError>> {
        self.inner
            .set_mut(property_name, value, server, connection, header, emitter)
            .await
    }

    fn call<'call>(
        &'call self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        let dispatch = self.inner.call(server, connection, msg, name.clone());
        self.counted(msg, &name, dispatch)
    }

    fn call_mut<'call>(
        &'call mut self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        // Never reached: drover's objects have `&self` methods only, and
        // `call` passes `RequiresMut` through uncounted.
        self.inner.call_mut(server, connection, msg, name)
    }

    fn introspect_to_writer(&self, writer: &mut dyn std::fmt::Write, level: usize) {
        self.inner.introspect_to_writer(writer, level)
    }
}
