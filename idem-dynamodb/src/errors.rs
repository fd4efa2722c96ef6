//! SDK errors mapped to idem's error kinds, with the retryable flag set and the service's
//! own words kept where a person will read them.

use std::fmt;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem_core::{BoxError, StoreError, store::Operation};

/// The service's answer in words: its error code and message, with the SDK's error as
/// the source. The SDK's own `Display` says only "service error".
#[derive(Debug)]
pub(crate) struct ServiceError {
    code: String,
    message: String,
    source: BoxError,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DynamoDB answered {}: {}", self.code, self.message)
    }
}

impl std::error::Error for ServiceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

/// Whether a `ValidationException` is DynamoDB refusing an item over 400 KB.
pub(crate) fn is_item_too_large<E, R>(err: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    match err {
        SdkError::ServiceError(service) => {
            service.err().code() == Some("ValidationException")
                && service
                    .err()
                    .message()
                    .is_some_and(|m| m.contains("Item size"))
        }
        _ => false,
    }
}

/// Maps any operation's SDK error. Conditional-check failures never reach here: the store
/// turns them into outcomes first.
pub(crate) fn map<E, R>(operation: Operation, err: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Unavailable {
                operation,
                source: err.into(),
            }
        }
        SdkError::ServiceError(service) => {
            let code = service
                .err()
                .code()
                .unwrap_or("an unnamed error")
                .to_owned();
            let message = service.err().message().unwrap_or_default().to_owned();
            let refers_to_table = message.contains("table") || message.contains("Table");
            let source: BoxError = Box::new(ServiceError {
                code: code.clone(),
                message,
                source: err.into(),
            });
            match code.as_str() {
                "ProvisionedThroughputExceededException"
                | "RequestLimitExceeded"
                | "ThrottlingException"
                | "TransactionConflictException"
                | "LimitExceededException" => StoreError::Busy { operation, source },
                "InternalServerError" | "ServiceUnavailable" => {
                    StoreError::Unavailable { operation, source }
                }
                "ResourceNotFoundException"
                | "AccessDeniedException"
                | "UnrecognizedClientException"
                | "MissingAuthenticationTokenException" => {
                    StoreError::Misconfigured { operation, source }
                }
                "ValidationException" if refers_to_table => {
                    StoreError::Misconfigured { operation, source }
                }
                _ => StoreError::Backend {
                    operation,
                    retryable: false,
                    source,
                },
            }
        }
        _ => StoreError::Backend {
            operation,
            retryable: false,
            source: err.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_dynamodb::operation::get_item::GetItemError;

    fn service(code: &str, message: &str) -> SdkError<GetItemError, ()> {
        let metadata = ErrorMetadata::builder().code(code).message(message).build();
        SdkError::service_error(GetItemError::generic(metadata), ())
    }

    fn kind(err: &StoreError) -> &'static str {
        match err {
            StoreError::Busy { .. } => "busy",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Misconfigured { .. } => "misconfigured",
            StoreError::Backend {
                retryable: false, ..
            } => "backend",
            other => panic!("an unexpected kind: {other:?}"),
        }
    }

    #[test]
    fn every_service_code_the_store_tells_apart_has_its_kind() {
        let cases = [
            ("ProvisionedThroughputExceededException", "", "busy"),
            ("RequestLimitExceeded", "", "busy"),
            ("ThrottlingException", "", "busy"),
            ("TransactionConflictException", "", "busy"),
            ("LimitExceededException", "", "busy"),
            ("InternalServerError", "", "unavailable"),
            ("ServiceUnavailable", "", "unavailable"),
            ("ResourceNotFoundException", "", "misconfigured"),
            ("AccessDeniedException", "", "misconfigured"),
            ("UnrecognizedClientException", "", "misconfigured"),
            ("MissingAuthenticationTokenException", "", "misconfigured"),
            (
                "ValidationException",
                "Cannot do operations on a non-existent table",
                "misconfigured",
            ),
            (
                "ValidationException",
                "One or more parameter values were invalid: Table",
                "misconfigured",
            ),
            (
                "ValidationException",
                "Item size has exceeded the maximum allowed size",
                "backend",
            ),
            ("ConditionalCheckFailedException", "", "backend"),
        ];
        for (code, message, expected) in cases {
            let err = map(Operation::Claim, service(code, message));
            assert_eq!(kind(&err), expected, "{code}: {message}");
            // The service's own words reach the reader, not the SDK's "service error",
            // and the SDK's error stays behind them.
            let words = std::error::Error::source(&err).unwrap();
            assert_eq!(
                words.to_string(),
                format!("DynamoDB answered {code}: {message}")
            );
            assert!(words.source().is_some(), "{code}: the SDK's error is kept");
        }
    }

    #[test]
    fn transport_failures_are_unavailable_and_the_rest_backend() {
        let timeout: SdkError<GetItemError, ()> = SdkError::timeout_error("slow");
        let dispatch: SdkError<GetItemError, ()> =
            SdkError::dispatch_failure(ConnectorError::io("reset".into()));
        let response: SdkError<GetItemError, ()> = SdkError::response_error("cut", ());
        let construction: SdkError<GetItemError, ()> = SdkError::construction_failure("bad");
        assert_eq!(kind(&map(Operation::Get, timeout)), "unavailable");
        assert_eq!(kind(&map(Operation::Get, dispatch)), "unavailable");
        assert_eq!(kind(&map(Operation::Get, response)), "unavailable");
        assert_eq!(kind(&map(Operation::Get, construction)), "backend");
    }

    #[test]
    fn an_item_too_large_is_told_by_its_code_and_words() {
        assert!(is_item_too_large(&service(
            "ValidationException",
            "Item size has exceeded the maximum allowed size"
        )));
        assert!(!is_item_too_large(&service(
            "ValidationException",
            "One or more parameter values were invalid"
        )));
        assert!(!is_item_too_large(&service(
            "ThrottlingException",
            "Item size"
        )));
        let timeout: SdkError<GetItemError, ()> = SdkError::timeout_error("slow");
        assert!(!is_item_too_large(&timeout));
    }
}
