//! SDK errors mapped to idem's error kinds, with the retryable flag set.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem_core::{Operation, StoreError};

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
            let code = service.err().code().unwrap_or_default().to_owned();
            match code.as_str() {
                "ProvisionedThroughputExceededException"
                | "RequestLimitExceeded"
                | "ThrottlingException"
                | "TransactionConflictException"
                | "LimitExceededException" => StoreError::Busy {
                    operation,
                    source: err.into(),
                },
                "InternalServerError" | "ServiceUnavailable" => StoreError::Unavailable {
                    operation,
                    source: err.into(),
                },
                "ResourceNotFoundException"
                | "AccessDeniedException"
                | "UnrecognizedClientException"
                | "MissingAuthenticationTokenException" => StoreError::Misconfigured {
                    operation,
                    source: err.into(),
                },
                _ => StoreError::Backend {
                    operation,
                    retryable: false,
                    source: err.into(),
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
