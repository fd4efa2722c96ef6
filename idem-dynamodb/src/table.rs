//! The table's name, checked by DynamoDB's rules, and creating the table for development
//! and tests.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
    TimeToLiveSpecification,
};
use idem_core::{StoreError, store::Operation};

use crate::errors::map;
use crate::item;

/// Why a table name was refused: DynamoDB accepts 3 to 255 characters, each an ASCII
/// letter, digit, `_`, `-` or `.`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableNameError {
    /// Shorter than 3 or longer than 255 characters.
    #[error("the table name is {len} characters long; DynamoDB accepts 3 to 255")]
    Length {
        /// Its length.
        len: usize,
    },
    /// A character DynamoDB does not accept.
    #[error(
        "the table name holds {character:?} at byte {index}; DynamoDB accepts only ASCII letters, digits, '_', '-' and '.'"
    )]
    Character {
        /// The first refused character.
        character: char,
        /// Its byte offset.
        index: usize,
    },
}

/// A table name DynamoDB accepts.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TableName(Arc<str>);

impl TableName {
    pub(crate) fn parse(name: &str) -> Result<Self, TableNameError> {
        if let Some((index, character)) = name
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(TableNameError::Character { character, index });
        }
        if !(3..=255).contains(&name.len()) {
            return Err(TableNameError::Length { len: name.len() });
        }
        Ok(Self(name.into()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

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
/// [`StoreError::Misconfigured`] for a name DynamoDB does not accept, and a
/// [`StoreError`] when the table cannot be created or does not become active in time.
pub async fn create_table(client: &Client, table: &str) -> Result<(), StoreError> {
    TableName::parse(table).map_err(|err| setup_error(err.into()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dynamodbs_rules() {
        for good in ["idem", "idem_records", "Idem-2.prod", &"t".repeat(255)] {
            assert!(TableName::parse(good).is_ok(), "{good}");
        }
        assert_eq!(
            TableName::parse("idem\"; DROP TABLE x; --"),
            Err(TableNameError::Character {
                character: '"',
                index: 4
            })
        );
        assert_eq!(
            TableName::parse("ab"),
            Err(TableNameError::Length { len: 2 })
        );
        assert!(TableName::parse(&"t".repeat(256)).is_err());
        assert!(TableName::parse("tablé").is_err());
    }
}
