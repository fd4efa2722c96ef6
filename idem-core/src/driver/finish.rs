//! Storing what the work answered: its result, its permanent failure, or the marker that
//! stands in for a value that cannot be stored; and answering it as stored.

use super::error::{CannotStore, Interrupted, Reason};
use super::wire::{Marker, StoredFailure, Wire};
use super::{Context, Error, Idempotency, Outcome, WorkError, durable, observe};
use crate::codec::StoredAt;
use crate::record::ValuePart;
use crate::{Fingerprint, Key, Store};

impl<S: Store + ?Sized + 'static> Idempotency<S> {
    /// The plain bytes of a stored value, or the codec's error naming it.
    pub(super) fn decode<'a>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        part: ValuePart,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
        let at = StoredAt {
            key,
            fingerprint,
            part,
        };
        self.settings
            .codec
            .decode(&at, stored)
            .map_err(|source| codec_error(key, at.part, source))
    }

    /// The stored form of a value's plain bytes.
    pub(super) fn encode(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        part: ValuePart,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let at = StoredAt {
            key,
            fingerprint,
            part,
        };
        self.settings
            .codec
            .encode(&at, plain)
            .map_err(|source| codec_error(key, at.part, source))
    }

    /// Stores the work's value and answers it as stored.
    pub(super) async fn complete<W: Wire>(
        &self,
        context: &Context,
        value: W::Value,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        let key = context.key();
        let fingerprint = context.fingerprint();
        // The answer is what a replay will decode: a value that does not survive the trip
        // fails now, once, and is stored as such.
        let prepared = context.take_completion();
        let was_prepared = prepared.is_some();
        let (bytes, stored) = match prepared {
            // Completed inside the work's own transaction: those bytes are the result.
            Some(bytes) => {
                drop(value);
                let decoded =
                    W::decode_value(&self.decode(&key, &fingerprint, ValuePart::Result, &bytes)?);
                (bytes, decoded)
            }
            None => match W::encode_value(value) {
                Ok(plain) => {
                    let decoded = W::decode_value(&plain);
                    (
                        self.encode(&key, &fingerprint, ValuePart::Result, plain)?,
                        decoded,
                    )
                }
                Err(source) => {
                    return Box::pin(self.unserializable::<W>(context, ValuePart::Result, source))
                        .await;
                }
            },
        };
        let stored = match stored {
            Ok(stored) => stored,
            Err(source) => {
                return Box::pin(self.unserializable::<W>(context, ValuePart::Result, source))
                    .await;
            }
        };
        let limit = context.room_for_response();
        if bytes.len() > limit {
            let marker = Marker::ResultTooLarge {
                size: bytes.len(),
                limit,
                failure: false,
            };
            return Box::pin(self.fail::<W>(context, StoredFailure::Marker(marker), None)).await;
        }
        // Kept to read back a result the work committed itself (a copy, on that path only).
        let committed = was_prepared.then(|| bytes.clone());
        match durable::finish(context, durable::Write::Complete(bytes), W::marker).await? {
            durable::Finished::Applied => Ok(Outcome::Completed {
                value: stored,
                replayed: false,
            }),
            // The work's own transaction stored these bytes under this lease: they are the
            // result while the record still says so, or once it expired after a long
            // stall (a retry could not replay it). Another owner's record: it never
            // committed.
            durable::Finished::Fenced => match committed {
                Some(committed) if context.committed_result_stands(&committed).await => {
                    Ok(Outcome::Completed {
                        value: stored,
                        replayed: false,
                    })
                }
                _ => Err(fenced_at_the_end(context)),
            },
            durable::Finished::Marked(marker) => Err(marker.into_error(false, None)),
        }
    }

    pub(super) async fn unserializable<W: Wire>(
        &self,
        context: &Context,
        what: ValuePart,
        source: crate::BoxError,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        let marker = Marker::from_unstorable(CannotStore::Unserializable { what });
        self.fail::<W>(context, StoredFailure::Marker(marker), Some(source))
            .await
    }

    /// Stores a permanent failure and answers it as stored. A work error that cannot be
    /// stored is replaced by a marker saying why, so the first answer and every replay
    /// agree.
    pub(super) async fn fail<W: Wire>(
        &self,
        context: &Context,
        failure: StoredFailure<W::Failure>,
        source: Option<crate::BoxError>,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        let key = context.key();
        let fingerprint = context.fingerprint();
        let limit = context.room_for_response();
        let encoded = W::encode_failure(&failure).and_then(|plain| {
            let decoded = W::decode_failure(&plain)?;
            Ok((plain, decoded))
        });
        let encoded = match encoded {
            Ok((plain, decoded)) => Ok((
                self.encode(&key, &fingerprint, ValuePart::Failure, plain)?,
                decoded,
            )),
            Err(err) => Err(err),
        };
        let (bytes, stored, source) = match encoded {
            Ok((bytes, stored)) if bytes.len() <= limit => (bytes, stored, source),
            Ok((bytes, _)) => {
                let marker = Marker::ResultTooLarge {
                    size: bytes.len(),
                    limit,
                    failure: true,
                };
                self.encode_marker::<W>(&key, &fingerprint, marker, source)?
            }
            Err(err) => {
                let marker = Marker::Unserializable {
                    step: None,
                    failure: true,
                };
                self.encode_marker::<W>(&key, &fingerprint, marker, Some(err))?
            }
        };
        match durable::finish(context, durable::Write::Fail(bytes), W::marker).await? {
            durable::Finished::Applied => answer_failure(stored, false, source),
            durable::Finished::Fenced => Err(fenced_at_the_end(context)),
            // The store holds less than the driver knew: the marker saying so is stored,
            // as for a result, so the key is not held (and the work run again).
            durable::Finished::Marked(marker) => Err(marker.into_error(false, None)),
        }
    }

    pub(super) fn encode_marker<W: Wire>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        marker: Marker,
        source: Option<crate::BoxError>,
    ) -> Result<EncodedFailure<W::Failure>, Error> {
        // Markers hold only numbers and names: they always serialise.
        let failure = StoredFailure::Marker(marker);
        let plain = W::encode_failure(&failure).unwrap_or_default();
        let bytes = self.encode(key, fingerprint, ValuePart::Failure, plain)?;
        Ok((bytes, failure, source))
    }
}

/// What `execute` answers for a stored failure; `source` is the serialiser's error on the
/// run that stored a marker.
pub(super) fn answer_failure<T, E>(
    stored: StoredFailure<E>,
    replayed: bool,
    source: Option<crate::BoxError>,
) -> Result<Outcome<T, E>, Error> {
    match stored {
        StoredFailure::Work(error) => Ok(Outcome::Failed { error, replayed }),
        StoredFailure::Compensated(error, compensation) => Ok(Outcome::Compensated {
            error,
            compensation,
            replayed,
        }),
        StoredFailure::Marker(marker) | StoredFailure::CompensatedMarker(marker, _) => {
            Err(marker.into_error(replayed, source))
        }
    }
}

/// A failure's stored bytes, the failure they decode to, and the serialiser's error if any.
type EncodedFailure<F> = (Vec<u8>, StoredFailure<F>, Option<crate::BoxError>);

pub(super) fn codec_error(key: &Key, part: ValuePart, source: crate::codec::CodecError) -> Error {
    Error::Codec {
        key: key.short_hash(),
        what: part,
        source,
    }
}

/// True when the work's result says this run can no longer write (its lease is gone, the
/// store or the codec failed): such a run must not compensate.
pub(super) fn cannot_write<T, E>(result: &Result<T, WorkError<E>>) -> bool {
    matches!(
        result,
        Err(WorkError::Interrupted(Interrupted(
            Reason::LeaseLost | Reason::Store(_) | Reason::Codec { .. }
        )))
    )
}

pub(super) fn fenced_at_the_end(context: &Context) -> Error {
    observe::count(observe::FENCED_WRITES);
    context.mark_lost();
    Error::LeaseLost
}
