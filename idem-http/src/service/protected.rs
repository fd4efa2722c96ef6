//! A protected request: its key claimed, the handler run inline, and the driver's
//! answer sent (the handler's response as it streams, a replay, a refusal, or shadow
//! mode's answer).

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

use bytes::Bytes;
use http::response::Parts as ResponseParts;
use http::{Request, Response};
use idem_core::{BoxError, Error, Fingerprint, Key, Outcome};
use tokio::sync::oneshot;
use tower::ServiceExt;

use super::failures::handler_failed;
use super::handler_response::{handler_outcome, stream_rest};
use super::{Inner, ResponseBody};
use crate::Body;
use crate::answer::answer;
use crate::layer::Config;
use crate::observe::{self, Answer};
use crate::problem::full;
use crate::streaming::{FrameSender, Frames, Streaming, Tail};

/// The driver's answer, in the work's future.
type Executed = Result<Outcome<Vec<u8>, Vec<u8>>, Error>;

/// The handler's whole response, when it was complete before anything was sent.
pub(super) type Captured = Arc<Mutex<Option<Response<Body>>>>;

/// The rest of a body too large to store, to stream on after the record is finished.
pub(super) type Pump<ResBody> = Arc<Mutex<Option<(Rest<ResBody>, FrameSender)>>>;

/// What reaches a client still reading after its key was finished.
pub(super) enum Rest<ResBody> {
    /// The rest of a body too large to store.
    Body(Pin<Box<ResBody>>),
    /// The error a body broke off with: sent once its key is finished, so that a retry
    /// the cut prompts finds the record.
    Error(BoxError),
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a protected request: claims its key and runs the handler inline, streaming its
/// response as it comes. The handler runs in a task of its own only when the client goes
/// away first, so that it finishes and stores its response for the client's retry.
pub(super) async fn protect<S, ResBody>(
    inner: S,
    config: Arc<Config>,
    key: Key,
    fingerprint: Fingerprint,
    head: http::request::Parts,
    body: Bytes,
) -> Response<Body>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    // Only shadow mode needs the request again, to hand it to the handler.
    let shadow = config
        .shadow
        .then(|| (inner.clone(), head.clone(), body.clone(), key.clone()));
    let request = Request::from_parts(head, full(body));
    let (head_tx, mut head_rx) = oneshot::channel::<(ResponseParts, Frames)>();
    let captured: Captured = Arc::default();
    let pump: Pump<ResBody> = Arc::default();
    let mut work: Option<Pin<Box<dyn Future<Output = Executed> + Send>>> = Some(Box::pin({
        let (config, captured, pump, key) = (
            Arc::clone(&config),
            Arc::clone(&captured),
            Arc::clone(&pump),
            key.clone(),
        );
        async move {
            let run = |ctx| {
                // Claimed here: whatever this layer held the key with has ended.
                config.held.forget(&key);
                handler_outcome(
                    inner,
                    request,
                    ctx,
                    Arc::clone(&config),
                    head_tx,
                    captured,
                    pump,
                )
            };
            config.idem.execute_bytes(&key, fingerprint, run).await
        }
    }));
    // Dropped before the work ends (the client went away): the work finishes elsewhere.
    struct Unfinished<'a, ResBody: ResponseBody> {
        work: &'a mut Option<Pin<Box<dyn Future<Output = Executed> + Send>>>,
        pump: &'a Pump<ResBody>,
        config: &'a Arc<Config>,
        key: &'a Key,
    }
    impl<ResBody: ResponseBody> Drop for Unfinished<'_, ResBody> {
        fn drop(&mut self) {
            // Also while another future of the same task unwinds (a panic beside this
            // request in a `join!`): this work is sound, and finishes elsewhere.
            if let Some(work) = self.work.take() {
                let tail = tail(
                    work,
                    Arc::clone(self.pump),
                    Arc::clone(self.config),
                    self.key.clone(),
                );
                self.config.handlers.detach_orphan(tail);
            }
        }
    }
    let guard = Unfinished {
        work: &mut work,
        pump: &pump,
        config: &config,
        key: &key,
    };
    let mut head_open = true;
    let first = poll_fn(|cx| {
        if head_open {
            match Pin::new(&mut head_rx).poll(cx) {
                Poll::Ready(Ok(head)) => return Poll::Ready(First::Head(head)),
                // A whole response, or none: the work's end says which.
                Poll::Ready(Err(_)) => head_open = false,
                Poll::Pending => {}
            }
        }
        let Some(work) = guard.work.as_mut() else {
            return Poll::Pending;
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(polled) => polled.map(First::Done),
            // The driver or the store panicked: that future cannot go on, so it is not
            // finished elsewhere; its key is held until the lease ends.
            Err(_) => {
                *guard.work = None;
                Poll::Ready(First::Panicked)
            }
        }
    })
    .await;
    let running = guard.work.take();
    drop(guard);
    let (head, tail) = match first {
        First::Panicked => {
            tracing::error!("the idempotency driver panicked");
            observe::answer(&config, Answer::Error);
            return handler_failed(&config);
        }
        First::Head(head) => {
            let running = running.expect("the work runs until it answers");
            (head, tail(running, pump, Arc::clone(&config), key))
        }
        First::Done(result) => match head_rx.try_recv() {
            // The handler's response began and its work ended in the same poll.
            Ok(head) => (
                head,
                Box::pin(tail_of(result, pump, config.clone(), key)) as Tail,
            ),
            Err(_) => {
                let first = || lock(&captured).take();
                let Some(shadow) = shadow else {
                    let held_here = match &result {
                        Err(Error::InFlight { retry_after }) => {
                            config.held.holds(&key, *retry_after)
                        }
                        _ => false,
                    };
                    let (answer, response) = answer(result, first, &config, held_here);
                    remember(&config, &key, answer);
                    observe::answer(&config, answer);
                    return response;
                };
                // Boxed: shadow mode may call the handler again, whose future is not
                // part of this one.
                return Box::pin(shadow_answer(result, &captured, &config, shadow)).await;
            }
        },
    };
    let (parts, frames) = head;
    // The rest runs in a task of its own: the server polls a body only as fast as it can
    // send it, and the work's heartbeat must not wait for a slow client.
    config.handlers.detach(tail);
    Response::from_parts(parts, Body::new(Streaming::new(frames)))
}

enum First {
    Head((ResponseParts, Frames)),
    Done(Executed),
    Panicked,
}

/// What the client gets in shadow mode when the work ended before any response
/// streamed: the handler's whole response, or the handler's answer to the request
/// passed on again.
async fn shadow_answer<S, ResBody>(
    result: Executed,
    captured: &Captured,
    config: &Arc<Config>,
    (inner, head, body, key): (S, http::request::Parts, Bytes, Key),
) -> Response<Body>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    let first = || lock(captured).take();
    // Shadow mode: the handler's answer, always; what the layer would have said is
    // counted when it is not the handler's.
    if let Some(response) = first() {
        observe::answer(config, Answer::PassedThrough);
        return response;
    }
    let (would, _) = answer(result, || None, config, false);
    observe::shadow(config, would.name());
    tracing::info!(would = would.name(), "shadow mode: passing the request on");
    let fingerprint = Fingerprint::of_bytes(crate::scope::path(&head).as_bytes());
    let mut request = Request::from_parts(head, full(body));
    request
        .extensions_mut()
        .insert(config.idem.detached_context(&key, fingerprint));
    observe::answer(config, Answer::PassedThrough);
    match inner.oneshot(request).await.map_err(Into::into) {
        Ok(response) => response.map(Body::new),
        Err(err) => {
            tracing::warn!(error = %err, "the inner service failed");
            handler_failed(config)
        }
    }
}

/// The rest of the work after the response began: its end, a too-large body's rest,
/// and the count.
fn tail<ResBody: ResponseBody>(
    work: Pin<Box<dyn Future<Output = Executed> + Send>>,
    pump: Pump<ResBody>,
    config: Arc<Config>,
    key: Key,
) -> Tail {
    Box::pin(async move {
        let result = work.await;
        tail_of(result, pump, config, key).await;
    })
}

async fn tail_of<ResBody: ResponseBody>(
    result: Executed,
    pump: Pump<ResBody>,
    config: Arc<Config>,
    key: Key,
) {
    let rest = lock(&pump).take();
    match rest {
        Some((Rest::Body(body), frames)) => stream_rest(body, frames).await,
        Some((Rest::Error(err), frames)) => {
            let _ = frames.send(Err(err)).await;
        }
        None => {}
    }
    let answer = streamed_answer(&result);
    remember(&config, &key, answer);
    observe::answer(&config, answer);
}

/// Keeps in mind a key this layer holds after answering its request, so that a retry
/// here is told when the lease ends; any other end forgets it.
fn remember(config: &Config, key: &Key, answer: Answer) {
    // Shadow mode never answers for a held key: nothing to remember.
    if config.shadow {
        return;
    }
    match answer {
        Answer::Held => config.held.hold(key, config.idem.lease()),
        // Still held (or running): what was known stays so.
        Answer::InFlight => {}
        _ => config.held.forget(key),
    }
}

/// What a request whose response went out as the handler gave it counts as.
fn streamed_answer(result: &Executed) -> Answer {
    match result {
        Ok(Outcome::Completed { .. }) => Answer::Executed,
        Ok(Outcome::Retryable(_)) => Answer::Released,
        Ok(Outcome::Unknown(_)) => Answer::Held,
        Ok(_) => Answer::Error,
        Err(Error::Store(err)) => {
            tracing::warn!(error = %err, "a response was sent but could not be stored");
            Answer::Held
        }
        Err(Error::LeaseLost) => {
            tracing::warn!("a response was sent, but another attempt took its key over");
            Answer::LeaseLost
        }
        Err(err) => {
            tracing::warn!(error = %err, "a response was sent, but its key failed");
            Answer::Error
        }
    }
}
