//! Raw baseline for DynamoDB: a conditional `PutItem` returning the old item on failure
//! (one round trip for a replay) and, for a fresh key, an `UpdateItem` with the result.

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use crate::target::{BoxError, Done, RESPONSE, Target};

pub(crate) struct RawDynamoDb {
    client: Client,
    table: String,
    prefix: String,
}

impl RawDynamoDb {
    pub(crate) fn new(client: Client, table: String, prefix: String) -> Self {
        Self {
            client,
            table,
            prefix,
        }
    }
}

#[async_trait]
impl Target for RawDynamoDb {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        let pk = AttributeValue::S(format!("{}{key}", self.prefix));
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", pk.clone())
            .item("st", AttributeValue::S("p".into()))
            .condition_expression("attribute_not_exists(pk)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        if let Err(err) = put {
            return match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                    let done = failed.item().and_then(|item| item.get("st"))
                        == Some(&AttributeValue::S("c".into()));
                    Ok(if done { Done::Replayed } else { Done::Busy })
                }
                _ => Err(err.into()),
            };
        }
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", pk)
            .update_expression("SET st = :c, rs = :r")
            .expression_attribute_values(":c", AttributeValue::S("c".into()))
            .expression_attribute_values(":r", AttributeValue::B(Blob::new(RESPONSE)))
            .send()
            .await?;
        Ok(Done::Executed)
    }
}
