//! The fatal asynchronous events of a device (`ibv_get_async_event(3)`), dispatched to the
//! links they concern (DESIGN.md 3.5, "Link life").
//!
//! One watcher per device context, not per link: a thread of its own (with a current-thread
//! runtime, so it outlives any caller's runtime) reads the context's
//! [`byteexpress_verbs::AsyncEvents`] and raises the [`Alarm`] of each link the event names:
//!
//! | event | links alarmed |
//! |---|---|
//! | `QpFatal`, `QpReqErr`, `QpAccessErr` `{ qp_num }` | the link whose QP has that number |
//! | `CqErr { cq }` | the link whose CQ has that id |
//! | `PortErr { port: 1 }` | every link of the device (QPs use port 1) |
//! | `DeviceFatal` | every link of the device |
//!
//! Other events (`CommEst`, `SqDrained`, `PortActive`, SRQ events) need no action. A link's
//! engine answers its alarm as it answers an error completion: it falls back to TCP
//! ([`super::failover`]). The watcher starts with the first link registered on the device.
//!
//! After `DeviceFatal` no flush completion ever comes: the failed QP's verbs objects, with
//! the buffers its posted WRs still own, are parked here ([`park`]) instead of being reaped,
//! and go only with the device context. Contexts are opened once per process and never
//! closed (`setup::local_devices`), so parked objects are freed at process exit.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

use byteexpress_verbs::AsyncEvent;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// The port a link's QP uses (the verbs crate drives port 1 only).
const LINK_PORT: u8 = 1;

/// What a link's engine waits on besides its CQ: a fatal event of its QP, CQ or device.
#[derive(Debug, Default)]
pub(crate) struct Alarm {
    /// Set with `event`: one load per round of the engine instead of a lock.
    raised: std::sync::atomic::AtomicBool,
    event: Mutex<Option<AsyncEvent>>,
    notify: Notify,
}

impl Alarm {
    fn raise(&self, ev: AsyncEvent) {
        self.event.lock().get_or_insert(ev);
        self.raised
            .store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_one();
    }

    /// The event raised, if any (kept: the engine may look again).
    pub(crate) fn event(&self) -> Option<AsyncEvent> {
        if !self.raised.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        *self.event.lock()
    }

    /// Resolves once an event was raised (at once if it already was).
    pub(crate) async fn raised(&self) {
        if self.event().is_some() {
            return;
        }
        self.notify.notified().await;
    }
}

/// A link's QP and CQ as the watcher of their device knows them.
#[derive(Debug)]
struct Entry {
    qp_num: u32,
    cq: u64,
    alarm: Weak<Alarm>,
}

/// The links of one device context, and what outlives its failed QPs.
#[derive(Debug, Default)]
struct Watch {
    links: Mutex<Vec<Entry>>,
    parked: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
}

impl Watch {
    fn dispatch(&self, ev: AsyncEvent) {
        let hit = |e: &Entry| match ev {
            AsyncEvent::QpFatal { qp_num }
            | AsyncEvent::QpReqErr { qp_num }
            | AsyncEvent::QpAccessErr { qp_num } => e.qp_num == qp_num,
            AsyncEvent::CqErr { cq } => e.cq == cq,
            AsyncEvent::PortErr { port } => port == LINK_PORT,
            AsyncEvent::DeviceFatal => true,
            _ => false,
        };
        let mut links = self.links.lock();
        links.retain(|e| e.alarm.strong_count() > 0);
        for e in links.iter().filter(|e| hit(e)) {
            if let Some(a) = e.alarm.upgrade() {
                tracing::warn!(?ev, qp_num = e.qp_num, "fatal async event for a link's QP");
                a.raise(ev);
            }
        }
    }
}

/// The watches of this process's device contexts, by device name (each context is opened
/// once per process).
fn watches() -> &'static Mutex<HashMap<&'static str, Arc<Watch>>> {
    static W: OnceLock<Mutex<HashMap<&'static str, Arc<Watch>>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// The watch of `device`, its watcher started on first use; `None` when the device is not
/// one of this process's contexts or its events cannot be read (logged: links then learn of
/// failures from their completions only).
fn watch(device: &'static str) -> Option<Arc<Watch>> {
    let mut all = watches().lock();
    if let Some(w) = all.get(device) {
        return Some(w.clone());
    }
    let ctx = crate::setup::local_devices()
        .usable
        .iter()
        .map(|(c, _)| c)
        .find(|c| c.name() == device)?;
    let mut events = match ctx.async_events() {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(device, "async events not readable: {e}");
            return None;
        }
    };
    let w = Arc::new(Watch::default());
    let mine = w.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("bx-events-{device}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::warn!(device, "async event watcher: no runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                loop {
                    match events.next().await {
                        Ok(ev) => mine.dispatch(ev),
                        Err(e) => {
                            tracing::warn!(device, "async event watcher stops: {e}");
                            return;
                        }
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(device, "async event watcher not started: {e}");
        return None;
    }
    all.insert(device, w.clone());
    Some(w)
}

/// A link's registration with its device's watcher; dropping it deregisters.
#[derive(Debug)]
pub(crate) struct Registration {
    alarm: Arc<Alarm>,
}

impl Registration {
    /// The link's alarm (never raised when the device has no watcher).
    pub(crate) fn alarm(&self) -> &Alarm {
        &self.alarm
    }
}

/// Registers a link's QP `qp_num` and CQ `cq` (its id) on `device` for fatal events.
pub(crate) fn register(device: &'static str, qp_num: u32, cq: u64) -> Registration {
    let alarm = Arc::new(Alarm::default());
    if let Some(w) = watch(device) {
        let mut links = w.links.lock();
        links.retain(|e| e.alarm.strong_count() > 0);
        links.push(Entry {
            qp_num,
            cq,
            alarm: Arc::downgrade(&alarm),
        });
    }
    Registration { alarm }
}

/// Keeps `remains` (a failed QP's verbs objects and the buffers its posted WRs own) as long
/// as `device`'s context: after `DeviceFatal` no flush completion will free them. Where the
/// device has no watch they stay for the process's life all the same.
pub(crate) fn park(device: &'static str, remains: Box<dyn std::any::Any + Send>) {
    match watches().lock().get(device) {
        Some(w) => w.parked.lock().push(remains),
        None => std::mem::forget(remains),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(qp_num: u32, cq: u64, alarm: &Arc<Alarm>) -> Entry {
        Entry {
            qp_num,
            cq,
            alarm: Arc::downgrade(alarm),
        }
    }

    /// Each fatal event alarms the links it names and no other; events that need no action
    /// alarm none.
    #[test]
    fn events_alarm_the_links_they_name() {
        let cases = [
            (AsyncEvent::QpFatal { qp_num: 7 }, [true, false]),
            (AsyncEvent::QpReqErr { qp_num: 8 }, [false, true]),
            (AsyncEvent::QpAccessErr { qp_num: 7 }, [true, false]),
            (AsyncEvent::CqErr { cq: 21 }, [false, true]),
            (AsyncEvent::PortErr { port: 1 }, [true, true]),
            (AsyncEvent::PortErr { port: 2 }, [false, false]),
            (AsyncEvent::DeviceFatal, [true, true]),
            (AsyncEvent::CommEst { qp_num: 7 }, [false, false]),
            (AsyncEvent::SqDrained { qp_num: 8 }, [false, false]),
            (AsyncEvent::PortActive { port: 1 }, [false, false]),
        ];
        for (ev, want) in cases {
            let a = Arc::new(Alarm::default());
            let b = Arc::new(Alarm::default());
            let w = Watch::default();
            w.links.lock().extend([entry(7, 20, &a), entry(8, 21, &b)]);
            w.dispatch(ev);
            let got = [a.event() == Some(ev), b.event() == Some(ev)];
            assert_eq!(got, want, "{ev:?}");
            assert_eq!(
                [a.event().is_some(), b.event().is_some()],
                want,
                "{ev:?}: nothing else raised"
            );
        }
    }
}
