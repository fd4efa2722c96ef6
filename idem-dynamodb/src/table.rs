//! Creating the table, for development and tests.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification,
};
use idem_core::{Operation, StoreError};

use crate::errors::map;
use crate::item;

/// Creates `table` when it does not exist: partition key `pk` (string), on-demand
/// billing, TTL on the `ttl` attribute; then waits (at most a minute) until it is active.
///
/// For infrastructure as code, the same table in CloudFormation:
///
/// ```yaml
/// IdemTable:
///   Type: AWS::DynamoDB::Table
///   Properties:
///     BillingMode: PAY_PER_REQUEST
///     AttributeDefinitions:
///       - { AttributeName: pk, AttributeType: S }
///     KeySchema:
///       - { AttributeName: pk, KeyType: HASH }
///     TimeToLiveSpecification:
///       AttributeName: ttl
///       Enabled: true
/// ```
///
/// # Errors
/// A [`StoreError`] when the table cannot be created or does not become active in time.
pub async fn create_table(client: &Client, table: &str) -> Result<(), StoreError> {
    let created = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(item::PK)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|err| setup_error(err.into()))?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(item::PK)
                .key_type(KeyType::Hash)
                .build()
                .map_err(|err| setup_error(err.into()))?,
        )
        .send()
        .await;
    // Already there (made by another process, say): wait until it is active, and leave
    // its settings alone.
    let created_here = match created {
        Ok(_) => true,
        Err(err)
            if err
                .as_service_error()
                .is_some_and(|e| e.is_resource_in_use_exception()) =>
        {
            false
        }
        Err(err) => return Err(map(Operation::Setup, err)),
    };
    for _ in 0..600 {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|err| map(Operation::Setup, err))?;
        if described.table().and_then(|t| t.table_status()) == Some(&TableStatus::Active) {
            if !created_here {
                return Ok(());
            }
            client
                .update_time_to_live()
                .table_name(table)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name(item::TTL)
                        .enabled(true)
                        .build()
                        .map_err(|err| setup_error(err.into()))?,
                )
                .send()
                .await
                .map_err(|err| map(Operation::Setup, err))?;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(setup_error(
        "the table did not become active within a minute".into(),
    ))
}

fn setup_error(source: idem_core::BoxError) -> StoreError {
    StoreError::Misconfigured {
        operation: Operation::Setup,
        source,
    }
}
