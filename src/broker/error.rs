//! What the broker's operations fail with: management writes, publish, replay, endpoint health.
//!
//! No HTTP here. The API's error table (`crate::error`) chooses each variant's status, code,
//! body and `Retry-After`; the module twin reports them through the same table.

use crate::model::Invalid;
use crate::store::StoreError;
use std::time::Duration;

/// A broker operation's failure.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The request is invalid (the model's verdict, with its code).
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// No such topic.
    #[error("topic '{topic}' does not exist")]
    TopicNotFound {
        /// The name asked for.
        topic: String,
    },
    /// No such subscription on the topic.
    #[error("event subscription '{name}' does not exist on topic '{topic}'")]
    SubscriptionNotFound {
        /// The topic.
        topic: String,
        /// The subscription name asked for.
        name: String,
    },
    /// A count limit (`broker__maxTopics`, `broker__maxSubscriptionsPerTopic`) is reached.
    #[error("at most {max} {what} ({setting})")]
    LimitExceeded {
        /// What is counted, e.g. `topics`.
        what: &'static str,
        /// The limit.
        max: usize,
        /// The setting that sets it.
        setting: &'static str,
    },
    /// The topic's schema cannot change while subscriptions deliver it.
    #[error(
        "topic '{topic}' has subscriptions delivering {schema}; delete them before changing inputSchema"
    )]
    SchemaInUse {
        /// The topic.
        topic: String,
        /// Its current schema.
        schema: &'static str,
    },
    /// A subscription's persistence policy is fixed at creation.
    #[error(
        "persistencePolicy cannot be modified once created; delete and re-create the subscription"
    )]
    PersistenceImmutable,
    /// The subscription's destination has no endpoint health to re-enable.
    #[error("this subscription's destination has no endpoint health (not HTTP, or broker__endpointHealth__enabled=false)")]
    HealthNotTracked,
    /// A bounded queue or memory budget is full; nothing was accepted. Retry after the delay.
    #[error("{message}")]
    Unavailable {
        /// What is full, and the setting that bounds it.
        message: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// The store failed (or is full: nothing was written).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A task running the operation panicked or was cancelled.
    #[error("a broker task failed: {0}")]
    Task(String),
}

impl BrokerError {
    /// No such topic.
    pub fn topic_not_found(topic: &str) -> Self {
        Self::TopicNotFound {
            topic: topic.to_string(),
        }
    }

    /// No such subscription on `topic`.
    pub fn subscription_not_found(topic: &str, name: &str) -> Self {
        Self::SubscriptionNotFound {
            topic: topic.to_string(),
            name: name.to_string(),
        }
    }

    /// A full queue or memory budget: retry in 10 s.
    pub fn unavailable(message: String) -> Self {
        Self::Unavailable {
            message,
            retry_after: Duration::from_secs(10),
        }
    }
}

impl From<tokio::task::JoinError> for BrokerError {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Task(e.to_string())
    }
}
