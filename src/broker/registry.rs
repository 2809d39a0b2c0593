//! The registry: topics and subscriptions (create, update, delete, look up), each
//! subscription with its dispatcher task.

use super::*;
use crate::config::Key;

impl Broker {
    fn sub_config(&self, sub: Subscription) -> SubConfig {
        SubConfig {
            policy: sub.effective_policy(&self.inner.cfg),
            batch: sub.batching.caps(&self.inner.cfg),
            sink: self.inner.sinks.create(&sub),
            health: self.endpoint_health_for(&sub),
            dead_letter_sink: self.dead_letter_sink_for(&sub),
            sub,
        }
    }

    pub(super) fn start_subscription(
        &self,
        queue_id: u32,
        sub: Subscription,
    ) -> Arc<SubscriptionHandle> {
        Arc::new(SubscriptionHandle::start(
            queue_id,
            self.sub_config(sub),
            &self.inner.ctx,
        ))
    }

    /// The configuration in force.
    pub fn config(&self) -> &Arc<Config> {
        &self.inner.cfg
    }

    fn lock_mgmt(&self) -> std::sync::MutexGuard<'_, ()> {
        crate::sync::lock(&self.inner.mgmt)
    }

    /// Look a topic up (case-insensitively).
    pub fn topic(&self, name: &str) -> Option<Arc<TopicEntry>> {
        read(&self.inner.topics).get(&names::key(name)).cloned()
    }

    /// A topic that exists.
    ///
    /// # Errors
    /// [`BrokerError::TopicNotFound`].
    pub fn find_topic(&self, name: &str) -> Result<Arc<TopicEntry>, BrokerError> {
        self.topic(name)
            .ok_or_else(|| BrokerError::topic_not_found(name))
    }

    /// All topics, sorted by name.
    pub fn topics(&self) -> Vec<Arc<TopicEntry>> {
        let mut v: Vec<_> = read(&self.inner.topics).values().cloned().collect();
        v.sort_by_key(|t| names::key(&t.topic().name));
        v
    }

    /// Create or update a topic.
    ///
    /// # Errors
    /// [`BrokerError::SchemaInUse`] when the schema would change under existing subscriptions,
    /// [`BrokerError::LimitExceeded`] when the topic limit is hit; the store's failure.
    pub fn put_topic(&self, topic: Topic) -> Result<Topic, BrokerError> {
        let _g = self.lock_mgmt();
        let key = names::key(&topic.name);
        let map = read(&self.inner.topics);
        if let Some(existing) = map.get(&key) {
            let mut current = existing.topic();
            if current.input_schema != topic.input_schema && !existing.subscriptions().is_empty() {
                return Err(BrokerError::SchemaInUse {
                    topic: current.name,
                    schema: current.input_schema.as_str(),
                });
            }
            current.input_schema = topic.input_schema;
            current.dedup_window_secs = topic.dedup_window_secs;
            self.inner
                .ctx
                .store
                .put_topic(&key, &current.to_record())
                .map_err(BrokerError::Store)?;
            write(&existing.topic, current.clone());
            self.update_retention();
            return Ok(current);
        }
        if map.len() >= self.inner.cfg.broker.max_topics {
            return Err(BrokerError::LimitExceeded {
                what: "topics",
                max: self.inner.cfg.broker.max_topics,
                setting: Key::broker__maxTopics.name(),
            });
        }
        self.inner
            .ctx
            .store
            .put_topic(&key, &topic.to_record())
            .map_err(BrokerError::Store)?;
        let mut next = (*map).clone();
        next.insert(
            key,
            Arc::new(TopicEntry::new(
                topic.clone(),
                self.inner.cfg.broker.deduplication_max_identities,
            )),
        );
        write(&self.inner.topics, Arc::new(next));
        self.update_retention();
        Ok(topic)
    }

    /// Delete a topic and all its subscriptions (their queued events go too).
    ///
    /// # Errors
    /// [`BrokerError::TopicNotFound`]; the store's failure.
    pub fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        let _g = self.lock_mgmt();
        let key = names::key(name);
        let map = read(&self.inner.topics);
        let entry = map
            .get(&key)
            .cloned()
            .ok_or_else(|| BrokerError::topic_not_found(name))?;
        for sub in entry.subscriptions().iter() {
            sub.retire();
            if let Err(e) = self.inner.ctx.store.delete_subscription(sub.queue_id()) {
                sub.reinstate();
                return Err(e.into());
            }
            self.forget_dead_letters(sub.queue_id());
        }
        self.inner
            .ctx
            .store
            .delete_topic(&key)
            .map_err(BrokerError::Store)?;
        write(&entry.subs, Arc::new(Vec::new()));
        let mut next = (*map).clone();
        next.remove(&key);
        write(&self.inner.topics, Arc::new(next));
        self.update_retention();
        Ok(())
    }

    /// Create or update a subscription from a PUT body.
    ///
    /// # Errors
    /// Topic not found, [`BrokerError::Invalid`] body, [`BrokerError::PersistenceImmutable`],
    /// [`BrokerError::LimitExceeded`]; the store's failure.
    pub fn put_subscription(
        &self,
        topic_name: &str,
        name: &str,
        body: serde_json::Value,
    ) -> Result<Subscription, BrokerError> {
        let _g = self.lock_mgmt();
        let entry = self.find_topic(topic_name)?;
        let topic = entry.topic();
        let sub = Subscription::from_put(&topic, name, body, &self.inner.cfg, &DESTINATIONS)?;
        warn_expiring_credential(&sub, &self.inner.cfg, self.inner.ctx.clock.now_ms());
        let subs = entry.subscriptions();
        let key = names::key(name);
        if let Some(existing) = subs.iter().find(|s| names::key(s.name()) == key) {
            let old = existing.config();
            if old.sub.persisted != sub.persisted {
                return Err(BrokerError::PersistenceImmutable);
            }
            if old.sub.queue.is_some() != sub.queue.is_some() {
                return Err(BrokerError::Invalid(crate::model::Invalid::new(
                    "InvalidDeliveryConfiguration",
                    "deliveryMode cannot change on an existing event subscription (Queue and Push keep their events differently): delete it and create it again",
                )));
            }
            let mut sub = sub;
            sub.name = old.sub.name.clone();
            self.inner
                .ctx
                .store
                .put_subscription(existing.queue_id(), &sub.to_record())
                .map_err(BrokerError::Store)?;
            existing.set_config(self.sub_config(sub.clone()));
            return Ok(sub);
        }
        if subs.len() >= self.inner.cfg.broker.max_subscriptions_per_topic {
            return Err(BrokerError::LimitExceeded {
                what: "subscriptions per topic",
                max: self.inner.cfg.broker.max_subscriptions_per_topic,
                setting: Key::broker__maxSubscriptionsPerTopic.name(),
            });
        }
        let total: usize = read(&self.inner.topics)
            .values()
            .map(|t| t.subscriptions().len())
            .sum();
        if total >= self.inner.cfg.broker.max_subscriptions {
            return Err(BrokerError::LimitExceeded {
                what: "event subscriptions in all",
                max: self.inner.cfg.broker.max_subscriptions,
                setting: Key::broker__maxSubscriptions.name(),
            });
        }
        let queue_id = self
            .inner
            .ctx
            .store
            .next_queue_id()
            .map_err(BrokerError::Store)?;
        self.inner
            .ctx
            .store
            .put_subscription(queue_id, &sub.to_record())
            .map_err(BrokerError::Store)?;
        let sub_entry = self.start_subscription(queue_id, sub.clone());
        let mut list = (*subs).clone();
        list.push(sub_entry);
        write(&entry.subs, Arc::new(list));
        Ok(sub)
    }

    /// Find a subscription.
    pub fn subscription(&self, topic: &str, name: &str) -> Option<Arc<SubscriptionHandle>> {
        let key = names::key(name);
        self.topic(topic)?
            .subscriptions()
            .iter()
            .find(|s| names::key(s.name()) == key)
            .cloned()
    }

    /// Delete a subscription: its task and in-flight deliveries stop, its queued events go.
    ///
    /// # Errors
    /// Topic or subscription not found; the store's failure.
    pub fn delete_subscription(&self, topic: &str, name: &str) -> Result<(), BrokerError> {
        let _g = self.lock_mgmt();
        let entry = self.find_topic(topic)?;
        let key = names::key(name);
        let subs = entry.subscriptions();
        let found = subs
            .iter()
            .find(|s| names::key(s.name()) == key)
            .ok_or_else(|| BrokerError::subscription_not_found(topic, name))?;
        found.retire();
        if let Err(e) = self.inner.ctx.store.delete_subscription(found.queue_id()) {
            found.reinstate();
            return Err(e.into());
        }
        self.forget_dead_letters(found.queue_id());
        let list: Vec<_> = subs
            .iter()
            .filter(|s| names::key(s.name()) != key)
            .cloned()
            .collect();
        write(&entry.subs, Arc::new(list));
        Ok(())
    }
}

/// When `sub`'s ready-made shared access signature expires (Unix seconds), if that is before
/// its events would (their time to live from `now_ms`): every delivery after it fails.
fn expires_within_ttl(sub: &Subscription, cfg: &crate::config::Config, now_ms: u64) -> Option<u64> {
    let expiry = sub.destination.credential_expiry()?;
    let ttl = sub.effective_policy(cfg).ttl;
    (expiry < (now_ms / 1000).saturating_add(ttl.as_secs())).then_some(expiry)
}

/// Say so at PUT when [`expires_within_ttl`].
fn warn_expiring_credential(sub: &Subscription, cfg: &crate::config::Config, now_ms: u64) {
    if let Some(expiry) = expires_within_ttl(sub, cfg, now_ms) {
        tracing::warn!(
            topic = %sub.topic,
            subscription = %sub.name,
            expires = %crate::store::deadletter::rfc3339(expiry.saturating_mul(1000)),
            ttl_minutes = sub.effective_policy(cfg).ttl.as_secs() / 60,
            "the connection string's SharedAccessSignature expires within the events' time to live; deliveries after it fail until the connection string is replaced"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::topic::Topic;
    use serde_json::json;

    #[test]
    fn a_ready_made_sas_expiring_within_the_ttl_is_flagged_at_put() {
        let cfg = crate::config::Config::from_vars(std::iter::empty()).unwrap();
        let topic = Topic::from_put("t", json!({})).unwrap();
        let sub = |se: u64, ttl_min: u32| {
            let cs = format!("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature sr=x&sig=y&se={se}&skn=k;EntityPath=hub1");
            let body = json!({"properties": {
                "destination": {"endpointType": "EventHub", "properties": {"connectionString": cs}},
                "retryPolicy": {"eventExpiryInMinutes": ttl_min}}});
            Subscription::from_put(&topic, "s", body, &cfg, &DESTINATIONS).unwrap()
        };
        let now_ms = 1_000_000_000_000;
        let now = now_ms / 1000;
        // Expires in 30 minutes, events live 60: flagged; events live 20: not.
        assert_eq!(
            expires_within_ttl(&sub(now + 1800, 60), &cfg, now_ms),
            Some(now + 1800)
        );
        assert_eq!(expires_within_ttl(&sub(now + 1800, 20), &cfg, now_ms), None);
        // A key (no ready-made signature): never.
        let body = json!({"properties": {"destination": {"endpointType": "EventHub", "properties": {
            "connectionString": "Endpoint=sb://ns/;SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=h"}}}});
        let keyed = Subscription::from_put(&topic, "k", body, &cfg, &DESTINATIONS).unwrap();
        assert_eq!(expires_within_ttl(&keyed, &cfg, now_ms), None);
    }
}
