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
